"""The evaluation mix in which one conversation needs two capabilities (a run config's ``evaluate.mixed``).

The planted recipe's held-out conversations each hold one request, the case per-episode routing is made for. With
``evaluate.mixed`` the target bundles requests while it is evaluated (its ``size.bundle_prob``), and the held-out
seeds are chosen so that a given share of the conversations holds requests of every family in
``evaluate.mixed.families`` (*mixed*: e.g. a flight-status question, then a cancellation whose cabin decides) and
the rest one request (*single*). Every method is then scored on both kinds apart, per conversation and per request
(the env's ``reward_breakdown["requests"]``, :func:`trace_envs.domains.evaluation.request_outcomes`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

#: Seeds looked at, at most, per held-out conversation wanted, before the selection gives up.
MAX_SEEDS_PER_CONVERSATION = 50


def mixed_kwargs(kwargs: dict, settings: dict) -> dict:
    """The target's env kwargs while evaluating the mix: bundles at ``bundle_prob``, room for up to three requests."""
    out = dict(kwargs)
    out["size"] = {**(kwargs.get("size") or {}), "bundle_prob": float(settings["bundle_prob"])}
    steps = settings.get("max_episode_steps")
    if steps is None and kwargs.get("max_episode_steps"):
        steps = 3 * int(kwargs["max_episode_steps"])
    if steps is not None:
        out["max_episode_steps"] = int(steps)
    return out


def kind_of(families: Sequence[str] | None, mixed_families: Sequence[str]) -> str | None:
    """``"mixed"`` (requests of every family in ``mixed_families``), ``"single"`` (one request) or None."""
    if not families:
        return None
    if set(mixed_families) <= set(families):
        return "mixed"
    return "single" if len(families) == 1 else None


def record_kind(record: dict, mixed_families: Sequence[str]) -> str | None:
    """The kind of a played episode, from the request families its task info lists."""
    return kind_of((record.get("task") or {}).get("families"), mixed_families)


def choose_seeds(env_id: str, kwargs: dict, n: int, start: int, settings: dict) -> tuple[list[int], dict[int, str]]:
    """``n`` held-out seeds from ``start`` on: the first ``ceil(share · n)`` whose task is mixed and the first
    ``n`` minus that whose task is single (each task is drawn by resetting the env; nothing is played)."""
    import gymnasium as gym

    want = {"mixed": math.ceil(float(settings["share"]) * n)}
    want["single"] = n - want["mixed"]
    kinds: dict[int, str] = {}
    got = {"mixed": 0, "single": 0}
    env = gym.make(env_id, **kwargs)
    try:
        seed = start
        while got != want:
            if seed - start >= MAX_SEEDS_PER_CONVERSATION * n:
                raise ValueError(f"evaluate.mixed: {seed - start} seeds of {env_id} from {start} on gave {got} "
                                 f"conversations of the {want} wanted; raise evaluate.mixed.bundle_prob or check "
                                 f"that the target's scenarios include {settings['families']}")
            env.reset(seed=seed)
            info = env.unwrapped.task_info() if hasattr(env.unwrapped, "task_info") else {}
            kind = kind_of(info.get("families"), settings["families"])
            if kind is not None and got[kind] < want[kind]:
                kinds[seed] = kind
                got[kind] += 1
            seed += 1
    finally:
        env.close()
    return sorted(kinds), kinds


def request_texts_fn(env_id: str, kwargs: dict) -> Callable[[int], list[str]]:
    """``seed -> the texts of its task's requests``, in the user's order (the task drawn again from the seed)."""
    import gymnasium as gym

    env = gym.make(env_id, **kwargs)

    def texts(seed: int) -> list[str]:
        env.reset(seed=seed)
        task = getattr(env.unwrapped, "task", None)
        return [r.text for r in getattr(task, "requests", [])]

    return texts


def split_scores(records: list[dict], mixed_families: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per kind (``single``, ``mixed``): conversations, their success (pass@1 over trials), and the share of
    requests handled (per request family too). A conversation of one request scores its request by the env's
    per-request outcome where the record has it, else by its success."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("single", "mixed"):
        mine = [r for r in records if record_kind(r, mixed_families) == kind]
        if not mine:
            continue
        requests, by_family = [], {}
        for r in mine:
            outcomes = (r.get("reward_breakdown") or {}).get("requests")
            if not isinstance(outcomes, list) or not outcomes:
                families = (r.get("task") or {}).get("families") or ["?"]
                outcomes = [{"kind": families[0], "ok": bool(r.get("success"))}]
            for o in outcomes:
                requests.append(bool(o.get("ok")))
                by_family.setdefault(str(o.get("kind")), []).append(bool(o.get("ok")))
        out[kind] = {"conversations": len(mine), "success": sum(bool(r.get("success")) for r in mine) / len(mine),
                     "requests": len(requests), "request_success": sum(requests) / len(requests),
                     "request_success_by_family": {f: sum(v) / len(v) for f, v in sorted(by_family.items())}}
    return out
