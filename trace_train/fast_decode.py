"""Deprecated: ``trace_train.fast_decode`` moved to ``trace_train.tiny.fast_decode``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.tiny.fast_decode) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.tiny.fast_decode import (AUTO_MAX_HIDDEN, AUTO_MAX_LAYERS, FastDecoder, Generation, KVStore,
                                          PREFILL_CHUNK, Unsupported, auto_applies, read_weights, supported,
                                          weights_version)

warnings.warn("trace_train.fast_decode is deprecated and will be removed in the next release; import from "
              "trace_train.tiny.fast_decode instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["AUTO_MAX_HIDDEN", "AUTO_MAX_LAYERS", "FastDecoder", "Generation", "KVStore", "PREFILL_CHUNK",
           "Unsupported", "auto_applies", "read_weights", "supported", "weights_version"]
