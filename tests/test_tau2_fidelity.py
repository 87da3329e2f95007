"""τ²-compatible mode against τ²-bench itself: the same trajectories, scored by both.

For τ²-bench's official airline and retail tasks, the oracle's gold trajectory and perturbations of
each class where the two implementations once disagreed are played through our env (``tau2_data=``,
τ²-compatible by default) and then scored by τ²-bench's own ``evaluate_simulation`` (its wheel, in its
own Python ≥ 3.12 venv, built here from PyPI on first use and cached; see
:mod:`trace_envs.domains.tau2_reference`). Every reward must agree. Each class must also matter: on
its cases our strict mode (``tau2_compat=False``) disagrees with τ²-bench at least once, so a
regression of the compatible mode would show.

By default a sample of tasks per class runs (CI's budget); ``TRACE_TAU2_FULL=1`` runs every applicable
official task for every class and prints the figures.
"""

from __future__ import annotations

import json
import os
import random
import re

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import plan_turns

FULL = os.environ.get("TRACE_TAU2_FULL") == "1"
PER_CLASS = 2  # tasks per class and domain in the default sample (about 30 trajectories in all)


@pytest.fixture(scope="module")
def tau2():
    from trace_envs.domains.tau2_data import fetch_tau2_data
    from trace_envs.domains.tau2_reference import tau2_venv, tau2_version

    try:
        python = tau2_venv()
        root = fetch_tau2_data(version=tau2_version(python))  # the same release's data for both
    except RuntimeError as exc:
        pytest.skip(f"τ²-bench cannot be installed here: {exc}")
    return python, root


# ---------------------------------------------------------------- perturbations
def _call(name: str, arguments: dict) -> str:
    return hermes_tool_call(name, arguments)


def _parse(action) -> tuple[str, dict] | None:
    if isinstance(action, str) and action.startswith("<tool_call>"):
        body = json.loads(action[len("<tool_call>"):-len("</tool_call>")])
        return body["name"], body["arguments"]
    return None


def _insert_after_last_write(actions: list, extra: list, writes: set[str]) -> list:
    """``actions`` with ``extra`` tool calls right after the last write (before the closing message)."""
    last = max((i for i, a in enumerate(actions) if (_parse(a) or ("",))[0] in writes), default=None)
    if last is None:  # no write: after the last tool call
        last = max((i for i, a in enumerate(actions) if _parse(a)), default=len(actions) - 1)
    return actions[:last + 1] + extra + actions[last + 1:]


def _facts_in_a_tool_turn(task, actions, ctx):
    """The facts said in the text of a turn that also calls a tool, and not in the closing message."""
    if not task.communicate:
        return None
    idx = max((i for i, a in enumerate(actions) if isinstance(a, str) and not _parse(a)
               and all(f.lower() in a.lower() for f in task.communicate)), default=None)
    calls = [i for i, a in enumerate(actions) if _parse(a) and (idx is None or i < idx)]
    if idx is None or not calls:
        return None
    out = list(actions)
    name, args = _parse(out[calls[-1]])
    out[calls[-1]] = {"role": "assistant", "content": "For your information: " + ", ".join(task.communicate) + ".",
                      "tool_calls": [{"id": "call_facts", "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(args)}}]}
    text = out[idx]  # the same turn (it may also ask for a confirmation), without the facts
    for fact in task.communicate:
        text = re.sub(re.escape(fact), "", text, flags=re.I)
    out[idx] = text.replace("Here is what I found: ", "")
    return out


def _as_floats(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    return value


def _floats(keys: tuple[str, ...]):
    def perturb(task, actions, ctx):
        out, changed = [], False
        for a in actions:
            call = _parse(a)
            if call and call[0] in ctx["writes"]:
                args = _floats_at(call[1], keys)
                if json.dumps(args) != json.dumps(call[1]):
                    out.append(_call(call[0], args))
                    changed = True
                    continue
            out.append(a)
        return out if changed else None
    return perturb


def _floats_at(value, keys):
    """``value`` with the whole numbers under ``keys`` (at any depth) sent as floats."""
    if isinstance(value, list):
        return [_floats_at(v, keys) for v in value]
    if isinstance(value, dict):
        return {k: _as_floats(v) if k in keys else _floats_at(v, keys) for k, v in value.items()}
    return value


#: an amount sent as ``50.0`` where the data holds ``50`` (our schema says "number")
_amounts_as_floats = _floats(("amount",))
#: a bag count sent as ``2.0`` (our schema says "integer"; τ²-bench stores it raw, or types it in a booking)
_counts_as_floats = _floats(("total_baggages", "nonfree_baggages"))


def _second_cancel(task, actions, ctx):
    cancels = [_parse(a) for a in actions if (_parse(a) or ("",))[0] == "cancel_reservation"]
    if not cancels:
        return None
    return _insert_after_last_write(actions, [_call(*cancels[0])], ctx["writes"])


def _user_reservation(task, ctx):
    user_id = (task.user.known_info or {}).get("user_id")
    tables = ctx["tables"]
    user = tables["users"].get(user_id) if user_id else None
    if not user:
        return None, None, None
    card = next((pid for pid, m in user["payment_methods"].items() if m["source"] == "credit_card"), None)
    rid = next((r for r in user.get("reservations", []) if r in tables["reservations"]), None)
    return user_id, rid, card


def _bags_above_total(task, actions, ctx):
    user_id, rid, card = _user_reservation(task, ctx)
    if not rid or not card:
        return None
    total = ctx["tables"]["reservations"][rid]["total_baggages"]
    return _insert_after_last_write(actions, [_call("update_reservation_baggages", {
        "reservation_id": rid, "total_baggages": total, "nonfree_baggages": total + 1, "payment_id": card})],
        ctx["writes"])


def _empty_flight_list(task, actions, ctx):
    user_id, rid, card = _user_reservation(task, ctx)
    if not rid or not card:
        return None
    res = ctx["tables"]["reservations"][rid]
    return _insert_after_last_write(actions, [_call("update_reservation_flights", {
        "reservation_id": rid, "cabin": res["cabin"], "flights": [], "payment_id": card})], ctx["writes"])


def _zero_certificate(task, actions, ctx):
    user_id, _, _ = _user_reservation(task, ctx)
    if not user_id:
        return None
    return _insert_after_last_write(actions, [_call("send_certificate", {"user_id": user_id, "amount": 0})],
                                    ctx["writes"])


def _passenger_extra_key(task, actions, ctx):
    out, changed = [], False
    for a in actions:
        call = _parse(a)
        if call and call[0] in ("update_reservation_passengers", "book_reservation") and call[1].get("passengers"):
            args = dict(call[1], passengers=[dict(p, gender="unspecified") for p in call[1]["passengers"]])
            out.append(_call(call[0], args))
            changed = True
        else:
            out.append(a)
    return out if changed else None


def _untouched_delivered_order(task, actions, ctx):
    """A delivered order the agent reads but no gold write changes (so an extra write on it shows)."""
    written = {(_parse(a) or ("", {}))[1].get("order_id") for a in actions if (_parse(a) or ("",))[0] in ctx["writes"]}
    read = [_parse(a)[1].get("order_id") for a in actions if _parse(a) and _parse(a)[0] == "get_order_details"]
    return next((ctx["tables"]["orders"][o] for o in read if o not in written and o in ctx["tables"]["orders"]
                 and ctx["tables"]["orders"][o]["status"] == "delivered"), None)


def _empty_return_list(task, actions, ctx):
    order = _untouched_delivered_order(task, actions, ctx)
    if order is None:
        return None
    return _insert_after_last_write(actions, [_call("return_delivered_order_items", {
        "order_id": order["order_id"], "item_ids": [],
        "payment_method_id": order["payment_history"][0]["payment_method_id"]})], ctx["writes"])


def _empty_exchange_list(task, actions, ctx):
    order = _untouched_delivered_order(task, actions, ctx)
    if order is None:
        return None
    return _insert_after_last_write(actions, [_call("exchange_delivered_order_items", {
        "order_id": order["order_id"], "item_ids": [], "new_item_ids": [],
        "payment_method_id": order["payment_history"][0]["payment_method_id"]})], ctx["writes"])


def _items_in_another_order(task, actions, ctx):
    """A multi-item change with the items listed in another order (τ²-bench's pricing bug shows)."""
    out, changed = [], False
    for a in actions:
        call = _parse(a)
        if call and call[0] == "modify_pending_order_items" and len(set(call[1]["new_item_ids"])) > 1:
            args = dict(call[1], item_ids=call[1]["item_ids"][::-1], new_item_ids=call[1]["new_item_ids"][::-1])
            out.append(_call(call[0], args))
            changed = True
        else:
            out.append(a)
    return out if changed else None


CLASSES = {
    "airline": {"gold": lambda t, a, c: a, "facts_in_tool_turn": _facts_in_a_tool_turn,
                "amounts_as_floats": _amounts_as_floats, "counts_as_floats": _counts_as_floats,
                "second_cancel": _second_cancel,
                "nonfree_above_total": _bags_above_total, "empty_flight_list": _empty_flight_list,
                "zero_certificate": _zero_certificate, "passenger_extra_key": _passenger_extra_key},
    "retail": {"gold": lambda t, a, c: a, "facts_in_tool_turn": _facts_in_a_tool_turn,
               "empty_return_list": _empty_return_list, "empty_exchange_list": _empty_exchange_list,
               "items_in_another_order": _items_in_another_order},
}
# gold replays agree in both modes; the other classes must separate them
DISCRIMINATING = {c for d in CLASSES.values() for c in d} - {"gold", "counts_as_floats"}


class _Replay:
    """Plays a fixed list of actions (then says goodbye)."""

    def __init__(self, actions: list):
        self.actions, self.i = actions, 0

    def reset(self, env, observation, info):
        self.i = 0

    def __call__(self, observation, info):
        action = self.actions[self.i] if self.i < len(self.actions) else "Goodbye."
        self.i += 1
        return action


def _cases(domain: str, root) -> list[dict]:
    from trace_envs import rollout

    rng = random.Random(0)
    out = []
    envs = {mode: gym.make(f"trace/tau_{domain}-v0", tau2_data=str(root / domain), tau2_compat=mode)
            for mode in (True, False)}
    try:
        env = envs[True].unwrapped
        tasks = env.tau2_tasks
        env.reset(options={"task_id": tasks[0].task_id})
        writes = {n for n, s in env._toolset.specs.items() if s.write}
        ctx = {"tables": env._tau2()[0], "writes": writes}
        for name, perturb in CLASSES[domain].items():
            applicable = []
            for task in tasks:
                actions = perturb(task, plan_turns(task), ctx)
                if actions is not None:
                    applicable.append((task, actions))
            rng.shuffle(applicable)
            chosen = applicable if FULL else applicable[:PER_CLASS]
            assert chosen, f"no official {domain} task to perturb with {name}"
            for task, actions in chosen:
                played = {m: rollout(envs[m], _Replay(actions), options={"task_id": task.task_id})
                          for m in (True, False)}
                out.append({"class": name, "task_id": task.task_id, "ours": played[True]["reward"],
                            "strict": played[False]["reward"], "messages": played[True]["messages"],
                            "termination": played[True]["termination"],
                            "strict_same_trajectory": _calls(played[True]) == _calls(played[False])})
    finally:
        for e in envs.values():
            e.close()
    return out


def _calls(record: dict) -> list:
    return [(m["role"], m.get("content"), json.dumps(m.get("tool_calls"), sort_keys=True))
            for m in record["messages"] if m["role"] != "tool"]


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_our_reward_is_tau2_benchs_on_official_tasks(tau2, domain):
    from trace_envs.domains.tau2_reference import tau2_rewards

    python, root = tau2
    cases = _cases(domain, root)
    theirs = tau2_rewards(domain, cases, python)
    by_class: dict[str, list] = {}
    for case, ref in zip(cases, theirs):
        by_class.setdefault(case["class"], []).append((case, ref))
    print(f"\nτ²-bench {domain}: {len(cases)} trajectories" + (" (every applicable task)" if FULL else ""))
    for name, rows in by_class.items():
        agree = sum(c["ours"] == r["reward"] for c, r in rows)
        strict = sum(c["strict"] == r["reward"] for c, r in rows)
        print(f"  {name:<24} {len(rows):>4} cases: τ²-compatible agrees on {agree}, strict mode on {strict}; "
              f"τ²-bench reward 1.0 on {sum(r['reward'] == 1.0 for _, r in rows)}")
    wrong = [(c["class"], c["task_id"], c["ours"], r) for c, r in zip(cases, theirs) if c["ours"] != r["reward"]]
    assert wrong == [], wrong[:5]
    for name, rows in by_class.items():
        if name == "gold":
            assert all(r["reward"] == 1.0 for _, r in rows), "a gold replay did not score 1.0 in τ²-bench"
        if name in DISCRIMINATING:
            # the class matters: without the compatible mode at least one of its cases would disagree
            assert any(c["strict"] != r["reward"] for c, r in rows), f"{name}: strict mode agrees everywhere"
