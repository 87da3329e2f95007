"""τ²-style evaluation: DB state, communicated information, and (optionally) actions.

The reward is the product of the components named in the task's
``reward_basis`` (docs/design.md, "Target environments"):

* ``DB``: the database after the agent's writes equals the database after the
  gold writes (compared by canonical hash of every record either run touched;
  see :func:`trace_envs.domains.db.same_state`);
* ``COMMUNICATE``: every required fact appears in some agent message
  (case-insensitive, commas removed);
* ``ACTION``: every gold write appears among the agent's successful calls,
  with equal arguments.

No LLM judge is involved. :func:`pass_hat_k` is τ²-bench's pass^k.
"""

from __future__ import annotations

from math import comb
from typing import Any, Callable, Iterable

from ..core.tools import ToolSet
from .db import Layer, same_state
from .task import Call, TauTask


def _normalize(text: str) -> str:
    return text.lower().replace(",", "")


def communicated(facts: Iterable[str], messages: list[dict], tau2_compat: bool = False) -> dict[str, bool]:
    """For each fact, whether an assistant message to the user contains it.

    By default only messages to the user count (a turn that calls a tool is not addressed to the
    user, as the policy says), and the fact and the messages are both compared without commas.
    ``tau2_compat``: τ²-bench's rule — any assistant message with text counts, each on its own, its
    text lower-cased without commas, the fact only lower-cased.
    """
    if tau2_compat:
        texts = [m["content"].lower().replace(",", "") for m in messages
                 if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]]
        return {fact: any(fact.lower() in t for t in texts) for fact in facts}
    said = " ".join(_normalize(m.get("content") or "") for m in messages
                    if m.get("role") == "assistant" and not m.get("tool_calls"))
    return {fact: _normalize(fact) in said for fact in facts}


def successful_calls(messages: list[dict]) -> list[tuple[str, Any]]:
    """(name, arguments) of every tool call whose result was not an error."""
    from ..core.conversation import tool_calls_of

    return [(name, args) for name, args, result in tool_calls_of(messages)
            if result is not None and not result.startswith("Error:")]


def apply_gold(parent: Layer, toolkit_factory: Callable[[Layer], Any], task: TauTask) -> tuple[Layer, list[str]]:
    """A new layer over ``parent`` with the task's gold writes applied; returns it and any gold-call errors."""
    gold = parent.child()
    tools = ToolSet(toolkit_factory(gold))
    errors = []
    for call in task.gold_writes:
        result = tools.call(call.name, call.arguments)
        if not result.ok:
            errors.append(f"{call.name}: {result.content}")
    return gold, errors


def evaluate_task(task: TauTask, agent_db: Layer, messages: list[dict],
                  toolkit_factory: Callable[[Layer], Any], tau2_compat: bool = False) -> tuple[float, dict]:
    """The reward and its breakdown for one finished episode.

    Args:
        task: the task.
        agent_db: the episode's layer (the agent's writes applied on top of the task's initial state).
        messages: the transcript.
        toolkit_factory: builds the domain's toolkit over a layer (to replay the gold writes).
        tau2_compat: τ²-bench's rules (:mod:`trace_envs.domains.tau2_compat`): its communicate check,
            and a failing gold action is skipped instead of zeroing the reward.
    """
    breakdown: dict[str, Any] = {}
    reward = 1.0
    if "DB" in task.reward_basis:
        gold_db, gold_errors = apply_gold(agent_db.parent, toolkit_factory, task)  # type: ignore[arg-type]
        equal, agent_hash, gold_hash = same_state(agent_db, gold_db)
        breakdown["db"] = float(equal)
        breakdown["db_hash"] = {"agent": agent_hash[:16], "gold": gold_hash[:16]}
        if gold_errors:  # a gold path that fails is a broken task, never a silent pass ...
            breakdown["gold_errors"] = gold_errors
            if not tau2_compat:  # ... except in τ²-bench, which skips the failing action and goes on
                breakdown["db"] = 0.0
        reward *= breakdown["db"]
    if "COMMUNICATE" in task.reward_basis and task.communicate:
        found = communicated(task.communicate, messages, tau2_compat)
        breakdown["communicate"] = float(all(found.values()))
        breakdown["communicate_missing"] = [f for f, ok in found.items() if not ok]
        reward *= breakdown["communicate"]
    if "ACTION" in task.reward_basis:
        done = successful_calls(messages)
        matched = [any(n == g.name and a == g.arguments for n, a in done) for g in task.gold_writes]
        breakdown["action"] = float(all(matched))
        reward *= breakdown["action"]
    if len(task.requests) > 1 and not tau2_compat:  # a bundle: which of its requests were handled
        breakdown["requests"] = request_outcomes(task, messages)
    return reward, breakdown


def request_outcomes(task: TauTask, messages: list[dict]) -> list[dict]:
    """Each request of ``task`` scored on its own, in the user's order: ``{"kind", "decision", "ok"}``.

    A request passes when its gold write (``act``) was made with the gold arguments, the write it must not make
    (a refusal's ``forbidden_write``, a misreading's ``wrong_write``) was not, and its facts were said to the user.
    The conversation's reward asks more: the database equal to the gold one (no other change), every fact of every
    request. This is what a bundle's reward cannot say: which of its requests the agent got right.
    """
    done = successful_calls(messages)

    def made(call: Call | None) -> bool:
        return call is not None and any(n == call.name and a == call.arguments for n, a in done)

    out = []
    for request in task.requests:
        ok = all(communicated(request.communicate, messages).values()) if request.communicate else True
        if request.decision == "act":
            ok = ok and made(request.write)
        ok = ok and not made(request.forbidden_write) and not made(request.wrong_write)
        out.append({"kind": request.kind, "decision": request.decision, "ok": bool(ok)})
    return out


def pass_hat_k(successes_per_task: Iterable[tuple[int, int]], k: int) -> float:
    """τ²-bench's pass^k: the mean over tasks of C(successes, k) / C(trials, k).

    Args:
        successes_per_task: (successes, trials) for each task; every task needs trials ≥ k.
        k: how many independent trials must all succeed.
    """
    values = []
    for successes, trials in successes_per_task:
        if trials < k:
            raise ValueError(f"pass^{k} needs at least {k} trials per task, got a task with {trials}")
        if not 0 <= successes <= trials:
            raise ValueError(f"successes must be within 0..trials, got {successes}/{trials}")
        values.append(comb(successes, k) / comb(trials, k))
    if not values:
        raise ValueError("pass_hat_k needs at least one task")
    return sum(values) / len(values)
