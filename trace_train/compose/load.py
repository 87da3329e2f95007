"""Load what ``trace compose`` wrote, whichever composer wrote it (it sits above :mod:`.model` and :mod:`.routers`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .routers import is_arrow_dir, load_arrow


def load_composed(path: str | Path, dtype: Any = None) -> Any:
    """The model a folder written by ``trace compose`` holds: a :class:`~trace_train.compose.ComposedModel`
    (``compose.json``: the MoE, per-episode or per-task routing) or PEFT's Arrow model (``arrow.json``)."""
    import torch

    from .model import ComposedModel  # torch and transformers: imported when a model loads

    if is_arrow_dir(path):
        return load_arrow(path, dtype=dtype)
    return ComposedModel.from_pretrained(path, dtype=dtype or torch.float32)
