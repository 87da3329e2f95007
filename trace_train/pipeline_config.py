"""Deprecated: ``trace_train.pipeline_config`` moved to ``trace_train.pipeline.config``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.pipeline.config) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.pipeline.config import (BaseSection, ComposeSection, ConfigError, DiagnoseSection, EvaluateSection,
                                         GenerateSection, METHODS, RolloutSection, RunConfig, SECTIONS, STAGES,
                                         TrainSection, config_from_dict, dump_config, embedded_default, load_config,
                                         parse_seeds)

warnings.warn("trace_train.pipeline_config is deprecated and will be removed in the next release; import from "
              "trace_train.pipeline.config instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["BaseSection", "ComposeSection", "ConfigError", "DiagnoseSection", "EvaluateSection", "GenerateSection",
           "METHODS", "RolloutSection", "RunConfig", "SECTIONS", "STAGES", "TrainSection", "config_from_dict",
           "dump_config", "embedded_default", "load_config", "parse_seeds"]
