"""TRACE's generator stage: capability specs in, admitted env modules in a workspace registry out.

    from generators import generate
    results = generate("runs/base/diagnosis", workspace="my_envs")            # offline templates
    results = generate(spec, "my_envs", llm_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B")

Parts: :mod:`generators.offline` (templates of the built-in families), :mod:`generators.agent`
(the LLM generator agent, prompts in ``generators/prompts/``), :mod:`generators.admit` (static and
sandboxed dynamic checks), :mod:`generators.workspace` (the locked, append-only workspace registry).
``import generators`` stays light: the parts are imported when used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["generate", "GenerationResult", "admit", "AdmissionConfig", "AdmissionReport", "Workspace", "load_specs"]

_EXPORTS = {"generate": "pipeline", "GenerationResult": "pipeline", "load_specs": "pipeline", "admit": "admit",
            "AdmissionConfig": "admit", "AdmissionReport": "admit", "Workspace": "workspace"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"generators.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'generators' has no attribute {name!r}")
