"""Deprecated: ``trace_train.prefix_logprobs`` moved to ``trace_train.train.prefix_logprobs``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.train.prefix_logprobs) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.train.prefix_logprobs import (shared_prefix_logprobs)

warnings.warn("trace_train.prefix_logprobs is deprecated and will be removed in the next release; import from "
              "trace_train.train.prefix_logprobs instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["shared_prefix_logprobs"]
