"""Every env argument is documented where a user reads it (issue 56): ``trace envs show ID`` prints the env's
docstring and the ``Args:`` of the classes it inherits its constructor from, and every constructor argument is
named there."""

from __future__ import annotations

import inspect

import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs.core.registry import registered
from trace_envs.core.introspect import inherited_arguments

ENTRIES = [e for e in registered() if e.origin == "hand-written" or not e.generated]


def _arguments(cls: type) -> set[str]:
    names = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and not klass.__module__.startswith("gymnasium"):
            names |= {n for n, p in inspect.signature(klass.__init__).parameters.items()
                      if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return names


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_every_constructor_argument_is_in_what_envs_show_prints(entry):
    cls = entry.load_class()
    shown = inspect.cleandoc(cls.__doc__ or "") + "\n".join(text for _, text in inherited_arguments(cls))
    missing = sorted(name for name in _arguments(cls) if name not in shown)
    assert not missing, f"{entry.id}: arguments not documented where `trace envs show` prints: {missing}"


def test_the_experiment_only_size_keys_say_so():
    from trace_envs.domains.airline.env import TauAirlineEnv

    doc = TauAirlineEnv.__doc__
    for key in ("ask_details_prob", "cancel_grounds", "read_back", "blind_cabin_prob", "uniform_status_prob"):
        assert key in doc, key
    assert "planted-deficit experiment" in doc
