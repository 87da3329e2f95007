"""Deprecated: ``trace_train.grpo`` moved to ``trace_train.train.grpo``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.train.grpo) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.train.grpo import (ConfigError, GroupRollouts, LOG_COLUMNS, MAX_PROMPT_ROWS, TrainConfig, TrainResult,
                                    calibrate, encode_episode, env_kwargs_for, env_reward, plot_reward_curve, read_log,
                                    train)

warnings.warn("trace_train.grpo is deprecated and will be removed in the next release; import from "
              "trace_train.train.grpo instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["ConfigError", "GroupRollouts", "LOG_COLUMNS", "MAX_PROMPT_ROWS", "TrainConfig", "TrainResult", "calibrate",
           "encode_episode", "env_kwargs_for", "env_reward", "plot_reward_curve", "read_log", "train"]
