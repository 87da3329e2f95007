"""Stage four of TRACE: compose the capability adapters into one token-routed model (``trace compose``).

* :class:`ComposedModel` — base + K frozen LoRA experts + one gate per block, top-1 (or top-k) routing
  per token, sparse compute; save/load with hashes; ``generate`` works (:mod:`.model`).
* :func:`compose` — build, train the gates on successful trajectories, write the folder, routing
  statistics and the baselines (:mod:`.api`).
* :func:`merge_adapters`, :class:`PerEpisodeRouter` — the baselines: PEFT's linear / TIES merges and one
  adapter per episode (:mod:`.baselines`).
* :class:`PerTaskRouter`, :func:`write_arrow` / :func:`load_arrow` — routers of the field that choose without
  trained gates: the TRACE authors' per-task routing and PEFT's Arrow (:mod:`.routers`); :func:`load_composed`
  loads any folder ``trace compose`` writes.
* :class:`RouterTrainConfig`, :func:`train_router`, :func:`routing_stats` — gate training and routing
  statistics (:mod:`.train`).
"""

from .adapters import AdapterRef, ComposeError
from .api import BASELINES, COMPOSERS, ComposeResult, compose
from .baselines import PerEpisodeRouter, merge_adapters
from .model import COMPOSE_FILE, ComposedModel, is_composed_dir
from .load import load_composed
from .routers import PerTaskRouter, load_arrow, write_arrow
from .train import RouterTrainConfig, routing_stats, train_router

__all__ = ["AdapterRef", "BASELINES", "COMPOSERS", "COMPOSE_FILE", "ComposeError", "ComposeResult", "ComposedModel",
           "PerEpisodeRouter", "RouterTrainConfig", "compose", "is_composed_dir", "merge_adapters",
           "routing_stats", "train_router", "PerTaskRouter", "load_arrow", "load_composed", "write_arrow"]
