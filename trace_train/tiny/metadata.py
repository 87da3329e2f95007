"""A tiny model's folder record and the env kwargs it was trained with.

A model built or warmed up here keeps ``trace_model.json`` next to its weights: the build's content key and
preset, and the env constructor kwargs its warm-up used (``{"prompt": "compact"}`` for the τ² domains).
:func:`model_env_kwargs` reads them back so that a rollout shows the model the prompts it was trained on;
:func:`prompt_env_kwargs` is the switch the tokenizer corpus, the warm-up and GRPO use to ask an env for its
compact prompt. :func:`cache_root` is where built and warmed-up models are cached.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def env_accepts(env_id: str, kwarg: str) -> bool:
    """Whether the env class registered as ``env_id`` takes ``kwarg`` in its constructor."""
    import trace_envs
    from trace_envs.core.introspect import accepts

    try:
        cls = trace_envs.get_entry(env_id).load_class()
    except Exception:
        return False
    return accepts(cls, kwarg)


def prompt_env_kwargs(env_id: str, prompt: str = "compact") -> dict:
    """``{"prompt": prompt}`` if the env has a prompt-size switch, else ``{}``."""
    return {"prompt": prompt} if env_accepts(env_id, "prompt") else {}


#: Where built and bootstrapped models are cached (override with ``TRACE_CACHE``).
def cache_root() -> Path:
    return Path(os.environ.get("TRACE_CACHE", Path.home() / ".cache" / "trace")) / "models"


def model_metadata(path: str | Path) -> dict:
    """``trace_model.json`` of a model built here ({} for any other model folder)."""
    f = Path(path) / "trace_model.json"
    return json.loads(f.read_text()) if f.exists() else {}


def model_env_kwargs(path: str | Path, env_id: str | None = None) -> dict:
    """The env constructor kwargs a bootstrapped model was trained with (``{"prompt": "compact"}``),
    restricted to those ``env_id`` accepts; use them for the model's rollouts."""
    kwargs = dict(model_metadata(path).get("env_kwargs") or {})
    if env_id is not None:
        kwargs = {k: v for k, v in kwargs.items() if env_accepts(env_id, k)}
    return kwargs
