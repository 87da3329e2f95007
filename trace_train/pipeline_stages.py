"""Deprecated: ``trace_train.pipeline_stages`` moved to ``trace_train.pipeline.stages``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.pipeline.stages) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.pipeline.stages.base import (estimate_base, run_base, tiny_base_cache_dir, tiny_bootstrap_config)
from trace_train.pipeline.stages.common import (FAST_DECODE_SPEEDUP_40, FAST_DECODE_SPEEDUP_NARROW, GRPO_FAST_SPEEDUP,
                                                MixtureAgent, SECONDS_BOOTSTRAP_SETUP, SECONDS_PER_ADMISSION,
                                                SECONDS_PER_ENDPOINT_EPISODE, SECONDS_PER_GRPO_STEP_TINY,
                                                SECONDS_PER_GRPO_STEP_TINY_FAST, SECONDS_PER_LABEL_OFFLINE,
                                                SECONDS_PER_ROUTER_RUN_TINY, SECONDS_PER_SCRIPTED_EPISODE,
                                                SECONDS_PER_SFT_STEP_TINY, SECONDS_PER_TINY_BATCH,
                                                SECONDS_PER_TINY_BATCH_FAST, SECONDS_PER_TINY_EPISODE_IN_BATCH,
                                                SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST, SFT_TWO_THREAD_SPEEDUP,
                                                base_agent_factory, base_env_kwargs_fn, base_model_path,
                                                capability_envs, model_env_kwargs_fn)
from trace_train.pipeline.stages.compose import (estimate_compose, run_compose)
from trace_train.pipeline.stages.diagnose import (estimate_diagnose, run_diagnose)
from trace_train.pipeline.stages.evaluate import (SAME_AS_BASE_NOTE, estimate_evaluate, method_agents, run_evaluate)
from trace_train.pipeline.stages.generate import (estimate_generate, run_generate)
from trace_train.pipeline.stages.rollout import (estimate_rollout, run_rollout)
from trace_train.pipeline.stages.train import (estimate_train, run_train)

warnings.warn("trace_train.pipeline_stages is deprecated and will be removed in the next release; import from "
              "trace_train.pipeline.stages.<stage> (and .common) instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["FAST_DECODE_SPEEDUP_40", "FAST_DECODE_SPEEDUP_NARROW", "GRPO_FAST_SPEEDUP", "MixtureAgent",
           "SAME_AS_BASE_NOTE", "SECONDS_BOOTSTRAP_SETUP", "SECONDS_PER_ADMISSION", "SECONDS_PER_ENDPOINT_EPISODE",
           "SECONDS_PER_GRPO_STEP_TINY", "SECONDS_PER_GRPO_STEP_TINY_FAST", "SECONDS_PER_LABEL_OFFLINE",
           "SECONDS_PER_ROUTER_RUN_TINY", "SECONDS_PER_SCRIPTED_EPISODE", "SECONDS_PER_SFT_STEP_TINY",
           "SECONDS_PER_TINY_BATCH", "SECONDS_PER_TINY_BATCH_FAST", "SECONDS_PER_TINY_EPISODE_IN_BATCH",
           "SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST", "SFT_TWO_THREAD_SPEEDUP", "base_agent_factory",
           "base_env_kwargs_fn", "base_model_path", "capability_envs", "estimate_base", "estimate_compose",
           "estimate_diagnose", "estimate_evaluate", "estimate_generate", "estimate_rollout", "estimate_train",
           "method_agents", "model_env_kwargs_fn", "run_base", "run_compose", "run_diagnose", "run_evaluate",
           "run_generate", "run_rollout", "run_train", "tiny_base_cache_dir", "tiny_bootstrap_config"]
