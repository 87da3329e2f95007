"""Deprecated: ``trace_train.copy_circuit`` moved to ``trace_train.tiny.copy_circuit``; this alias goes in the next release.

It re-exports the public names from their new modules (trace_train.tiny.copy_circuit) and warns once on import.
Import from the new path instead.
"""

import warnings

from trace_train.tiny.copy_circuit import (CopyCircuit, FREEZE_CHOICES, SINK_TOKENS, circuit_gradient_masks,
                                           circuit_of, copy_accuracy, freeze_copy_circuit, install_copy_circuit)

warnings.warn("trace_train.copy_circuit is deprecated and will be removed in the next release; import from "
              "trace_train.tiny.copy_circuit instead (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)

__all__ = ["CopyCircuit", "FREEZE_CHOICES", "SINK_TOKENS", "circuit_gradient_masks", "circuit_of", "copy_accuracy",
           "freeze_copy_circuit", "install_copy_circuit"]
