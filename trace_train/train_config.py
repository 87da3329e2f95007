"""Deprecated: ``trace_train.train_config`` moved to ``trace_train.train.config``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.train.config) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.train.config import (ConfigError, DECODES, DEVICES, LOSS_FORWARDS, LOSS_TYPES, ROLLOUTS, TrainConfig,
                                      VLLM_MODES)

warnings.warn("trace_train.train_config is deprecated and will be removed in the next release; import from "
              "trace_train.train.config instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["ConfigError", "DECODES", "DEVICES", "LOSS_FORWARDS", "LOSS_TYPES", "ROLLOUTS", "TrainConfig", "VLLM_MODES"]
