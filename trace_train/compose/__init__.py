"""Stage four of TRACE: compose the capability adapters into one token-routed model (``trace compose``).

* :class:`ComposedModel` — base + K frozen LoRA experts + one gate per block, top-1 (or top-k) routing
  per token, sparse compute; save/load with hashes; ``generate`` works (:mod:`.model`).
* :func:`compose` — build, train the gates on successful trajectories, write the folder, routing
  statistics and the baselines (:mod:`.api`).
"""

from .adapters import AdapterRef, ComposeError
from .model import COMPOSE_FILE, ComposedModel, is_composed_dir

__all__ = ["AdapterRef", "ComposeError", "ComposedModel", "COMPOSE_FILE", "is_composed_dir"]
