"""A contributor's worked example: a hand-written TRACE environment in one file.

The task: a user asks how many units of a product are in stock across all
warehouses. The agent must list the warehouses, read each one's stock, add
them up and call ``submit_total``. It exercises structured data reasoning in
its smallest form.

To contribute an environment like this one you need:

1. this file (a ``TraceEnv`` subclass with typed, documented ``@tool`` methods,
   a seeded task generator, a verifiable reward and an oracle);
2. one registry entry (see ``examples/registry.yaml``)::

       - id: examples/warehouse_stock-v0
         entry_point: custom_env:WarehouseStockEnv
         kind: capability
         capability: structured_data_reasoning
         max_episode_steps: 20
         description: Sum a product's stock across warehouses.

3. the conformance suite::

       TRACE_REGISTRY=examples python -c "import trace_envs; print(trace_envs.check_trace_env('examples/warehouse_stock-v0').summary())"

   or ``trace envs check examples/warehouse_stock-v0 --registry examples``.

Run this file (``python examples/custom_env.py``) to do both: it registers ``examples/registry.yaml``, runs the
conformance checks on 5 seeds and plays one episode with the oracle.
"""

from __future__ import annotations

from trace_envs import ToolError, TraceEnv, tool
from trace_envs.core import PlannedPolicy
from trace_envs.core.conversation import hermes_tool_call

PRODUCTS = ["blue kettle", "desk lamp", "yoga mat", "travel mug", "usb hub", "rain jacket", "chess set", "tent"]


class WarehouseStockEnv(TraceEnv):
    """Sum one product's stock across warehouses.

    ## Description
    The user names a product; stock is spread over several warehouses, and some
    warehouses carry distractor products. The agent reads the data with the
    tools and reports the total with ``submit_total``.

    ## Action Space
    The assistant's turn as text (a ``<tool_call>`` block or a message), or an
    OpenAI assistant message dict.

    ## Observation Space
    Text: tool results as ``<tool_response>`` blocks, or the user's replies.

    ## Rewards
    1.0 if the submitted total equals the true total, else 0.0. Messages to the
    user earn nothing; the only way to score is to read the data and add it up.

    ## Episode End
    On ``submit_total`` (terminated), on any message to the user (the scripted
    user has nothing to add), or at ``max_episode_steps`` (truncated).

    ## Arguments
    difficulty (int, 1–5): number of warehouses is ``2 + difficulty``; more
    warehouses also means more distractor products.

    ## Version History
    v0: initial version.
    """

    def __init__(self, difficulty: int = 2, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if not 1 <= difficulty <= 5:
            raise ValueError(f"difficulty must be between 1 and 5, got {difficulty}")
        self.difficulty = difficulty

    # -- task generation: a pure function of self.np_random ---------------------------------------
    def _generate_task(self, options: dict) -> str:
        rng = self.np_random
        self.product = PRODUCTS[int(rng.integers(len(PRODUCTS)))]
        self.stock: dict[str, dict[str, int]] = {}
        for i in range(2 + self.difficulty):
            items = {p: int(rng.integers(0, 50)) for p in PRODUCTS if rng.random() < 0.5}
            if rng.random() < 0.8:
                items[self.product] = int(rng.integers(1, 100))
            self.stock[f"WH-{i + 1:02d}"] = dict(sorted(items.items()))
        self.submitted: int | None = None
        return f"Hi! How many units of the {self.product} do we have in stock, across all warehouses?"

    def system_prompt(self) -> str:
        return ("You are an inventory assistant. Use the tools to read stock levels, then report the "
                "total with submit_total. Do not guess.")

    def task_spec(self) -> dict:
        return {"product": self.product, "stock": self.stock}

    def world_state(self) -> dict:
        return {"submitted": self.submitted}

    # -- tools --------------------------------------------------------------------------------------
    @tool
    def list_warehouses(self) -> list[str]:
        """List the ids of all warehouses."""
        return list(self.stock)

    @tool
    def get_stock(self, warehouse_id: str) -> dict[str, int]:
        """Get the stock of every product in one warehouse.

        Args:
            warehouse_id: a warehouse id from list_warehouses, such as "WH-01".
        """
        if warehouse_id not in self.stock:
            raise ToolError(f"no warehouse {warehouse_id!r}; call list_warehouses to see the ids")
        return self.stock[warehouse_id]

    @tool(write=True)
    def submit_total(self, total: int) -> str:
        """Submit the total number of units of the requested product; this ends the task.

        Args:
            total: the sum of the product's stock over all warehouses.
        """
        if total < 0:
            raise ToolError("a stock total cannot be negative")
        self.submitted = total
        return "Total submitted."

    # -- episode flow and reward --------------------------------------------------------------------
    def _on_tool_result(self, name, arguments, result) -> None:
        if name == "submit_total" and result.ok:
            self._end("agent_stop")

    def _evaluate(self) -> tuple[float, dict]:
        truth = sum(items.get(self.product, 0) for items in self.stock.values())
        correct = self.submitted == truth
        return float(correct), {"correct_total": float(correct), "expected": truth, "submitted": self.submitted}

    def oracle(self):
        truth = sum(items.get(self.product, 0) for items in self.stock.values())
        plan = [hermes_tool_call("list_warehouses", {})]
        plan += [hermes_tool_call("get_stock", {"warehouse_id": w}) for w in self.stock]
        plan.append(hermes_tool_call("submit_total", {"total": truth}))
        return PlannedPolicy(plan)  # answers every observation: after its plan, it submits again


if __name__ == "__main__":
    from pathlib import Path

    import trace_envs
    from trace_envs.core.registry import load_registry

    load_registry(Path(__file__).resolve().with_name("registry.yaml"))
    report = trace_envs.check_trace_env("examples/warehouse_stock-v0", n_seeds=5)
    print(report.summary())
    record = trace_envs.rollout("examples/warehouse_stock-v0", trace_envs.OracleAgent(), seed=0)
    print(f"oracle, seed 0: reward {record['reward']}, {record['steps']} steps")
    raise SystemExit(0 if report.ok else 1)
