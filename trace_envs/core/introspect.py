"""What an env class's constructor takes, read without building one.

Both the trainer (which env accepts ``prompt`` or ``difficulty``: :func:`trace_train.tiny.metadata.env_accepts`)
and the sandbox worker (which describes a generated env's class to the trusted process) ask this, so it is
answered here once; ``trace envs show`` reads the docs of the arguments an env inherits with
:func:`inherited_arguments`.
"""

from __future__ import annotations

import inspect


def constructor_params(cls: type) -> tuple[list[str], bool]:
    """The keyword arguments ``cls(...)`` takes, and whether it takes any other keyword too.

    A constructor that takes ``**kwargs`` usually hands them on to its parent's (structured data reasoning's
    does), so the walk follows the MRO, collecting each constructor's named parameters, until one takes no
    ``**kwargs``: then the names are all there is (``open`` False). A constructor whose signature cannot be
    read ends the walk closed: nothing beyond the names found is promised.
    """
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            return names, False
        names += [p for p, v in params.items() if p != "self" and p not in names
                  and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
        if not any(v.kind is v.VAR_KEYWORD for v in params.values()):
            return names, False
    return names, True


def accepts(cls: type, kwarg: str) -> bool:
    """Whether ``cls(**{kwarg: ...})`` is a constructor argument it takes."""
    names, open_ = constructor_params(cls)
    return kwarg in names or open_


def inherited_arguments(cls: type) -> list[tuple[str, str]]:
    """The ``Args:`` sections of the classes ``cls`` inherits its constructor arguments from (nearest first), so
    that ``trace envs show`` documents every argument an env takes, not only those its own docstring names."""
    out = []
    for base in cls.__mro__[1:]:
        if "__init__" not in vars(base) or not base.__doc__ or base.__module__.startswith("gymnasium"):
            continue
        lines = inspect.cleandoc(base.__doc__).splitlines()
        if "Args:" not in lines:
            continue
        section = []
        for line in lines[lines.index("Args:") + 1:]:
            if line and not line.startswith(" "):
                break
            section.append(line)
        if any(line.strip() for line in section):
            out.append((base.__name__, "\n".join(section).rstrip()))
    return out
