"""Which request families a lead-in question can come from (``lead_in: auto`` reads them; docs/environments.md).

Its own module because it probes the precondition verification env, which is built on
:mod:`trace_envs.capabilities.base`: here both are imported from above, so neither imports the other back.
"""

from __future__ import annotations

import functools

from .base import DOMAIN_NAMES, _families_of
from .precondition_verification import PreconditionVerificationEnv


@functools.lru_cache(maxsize=None)
def answer_families(domain: str | None = None, probes: int = 4) -> tuple[str, ...]:
    """The request families a lead-in question can come from: asked and answered from the records without a write.

    Probed, not listed: a family qualifies when the hand-written precondition verification env, told to open every
    episode with it, builds ``probes`` episodes in a row (a family whose requests always need a write cannot).
    ``domain``: ``"airline"``, ``"retail"`` or None (both). Cached per process: the answer depends only on the
    domain code, and a run resolves ``lead_in: auto`` once per training job, selection and evaluation.
    """
    out = []
    for name in (DOMAIN_NAMES if domain is None else (domain,)):
        for family in _families_of(name):
            if family in out:
                continue
            env = PreconditionVerificationEnv(domain=name, lead_in=[family], lead_in_prob=1.0)
            try:
                for seed in range(probes):
                    env.reset(seed=seed)
            except RuntimeError:  # "could not build ... opened by a <family> question"
                continue
            finally:
                env.close()
            out.append(family)
    return tuple(out)


__all__ = ["answer_families"]
