"""Deprecated: ``trace_train.models`` moved to ``trace_train.tiny``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.tiny (build, tokenizer, bootstrap, sft_data, sft_forward, metadata, copy_circuit)) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.tiny.bootstrap import BootstrapConfig, BootstrapResult, LOCAL_WINDOW, bootstrap_model, plot_loss
from trace_train.tiny.build import (BUILD_VERSION, BuildResult, ModelPreset, PRESETS, build_model)
from trace_train.tiny.copy_circuit import (CopyCircuit, FREEZE_CHOICES, circuit_of, copy_accuracy, freeze_copy_circuit,
                                           install_copy_circuit)
from trace_train.tiny.metadata import (cache_root, env_accepts, model_env_kwargs, model_metadata, prompt_env_kwargs)
from trace_train.tiny.sft_data import (assistant_turns, oracle_trajectories, render_prompt, scenario_families,
                                       scenario_of, sft_rows, sft_segments, shared_prefix_length, teacher_forced_turns)
from trace_train.tiny.sft_forward import (local_attention_mass, sft_loss)
from trace_train.tiny.tokenizer import (MARKUP_TOKENS, SPECIAL_TOKENS, default_corpus_envs, env_corpus,
                                        qwen3_chat_template, render_plain, train_tokenizer, wrap_tokenizer)

warnings.warn("trace_train.models is deprecated and will be removed in the next release; import from "
              "trace_train.tiny.build, .tokenizer, .bootstrap, .sft_data, .sft_forward, .metadata or "
              ".copy_circuit instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["BUILD_VERSION", "BootstrapConfig", "BootstrapResult", "BuildResult", "CopyCircuit", "FREEZE_CHOICES",
           "LOCAL_WINDOW", "MARKUP_TOKENS", "ModelPreset", "PRESETS", "SPECIAL_TOKENS", "assistant_turns",
           "bootstrap_model", "build_model", "cache_root", "circuit_of", "copy_accuracy", "default_corpus_envs",
           "env_accepts", "env_corpus", "freeze_copy_circuit", "install_copy_circuit", "local_attention_mass",
           "model_env_kwargs", "model_metadata", "oracle_trajectories", "plot_loss", "prompt_env_kwargs",
           "qwen3_chat_template", "render_plain", "render_prompt", "scenario_families", "scenario_of", "sft_loss",
           "sft_rows", "sft_segments", "shared_prefix_length", "teacher_forced_turns", "train_tokenizer",
           "wrap_tokenizer"]
