"""``TauEnv``: the shared machinery of the τ²-style customer-service domains.

A domain (airline, retail) supplies its data generator, tools, policy and
task generator as a :class:`Domain`; ``TauEnv`` turns it into a Gymnasium
environment: the DB as a copy-on-write layer per episode, the scripted (or
LLM) user, termination on the user's ``###STOP###``/``###TRANSFER###``/
``###OUT-OF-SCOPE###``, and τ²-style evaluation. It can also run τ²-bench's
own tasks from its ``db.json`` and ``tasks.json`` (``tau2_data=PATH``).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..core.env import Policy, TraceEnv
from .db import Layer
from .evaluation import evaluate_task
from .tau2_compat import Tau2ToolSet
from .task import TauTask
from .user import OUT_OF_SCOPE, STOP, TRANSFER, LLMUser, ScriptedUser


class Domain(Protocol):
    """What a τ²-style domain provides (see ``trace_envs/domains/airline`` for one)."""

    name: str
    toolkit_cls: type  # toolkit_cls(db: Layer) -> object with @tool methods
    scenarios: tuple[str, ...]  # scenario families the task generator can draw
    sizes: dict[str, dict]  # named DB size presets; must include "small" (default) and "tau2"

    def policy(self, compact: bool = False) -> str: ...

    def generate_db(self, rng: np.random.Generator, size: dict) -> dict[str, dict[str, dict]]: ...

    def generate_task(self, rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask: ...

    def load_tau2(self, path: Path) -> tuple[dict[str, dict[str, dict]], list[TauTask]]: ...


# Generated databases for a fixed db_seed are shared by every episode of the process (they are never mutated).
_DB_CACHE: OrderedDict[tuple, dict] = OrderedDict()
_DB_CACHE_SIZE = 8
_TAU2_CACHE: dict[tuple[str, str], tuple[dict, list[TauTask]]] = {}


class TauEnv(TraceEnv):
    """Base class of the τ²-style domains; see the domain subclasses for the full documentation.

    Args:
        size: DB size preset name (``"small"`` default: microsecond steps; ``"tau2"``: τ²-bench's
            scale) or a dict overriding preset fields.
        db_seed: if set, every episode uses the same generated DB (cached) and only the task varies
            with the seed, like τ²-bench; if None, the DB is generated from the episode seed too.
        scenarios: scenario families to draw from (default: all of the domain's).
        exclude_scenarios: families to leave out (e.g. to build a base model with known gaps).
        tau2_data: path to τ²-bench's domain folder (holding ``db.json`` and ``tasks.json``) to run
            its official tasks instead of generated ones; the seed selects the task (seed mod count).
        task_id: with ``tau2_data``: run this task id regardless of the seed.
        user: ``"scripted"`` (default) or ``{"base_url": ..., "model": ...}`` for an LLM user.
        prompt: ``"full"`` (the whole policy and tool descriptions) or ``"compact"`` (a short policy and
            short tool schemas — first sentence, no argument descriptions — for small models).
        reward_basis: override the tasks' reward components (subset of ``DB``, ``COMMUNICATE``, ``ACTION``).
        tau2_compat: τ²-compatible mode: the reward equals τ²-bench's ``evaluate_simulation`` on the same
            trajectory (its argument reading, what its tools accept, its communicate rule; every
            difference and deviation is listed in :mod:`trace_envs.domains.tau2_compat`). Default: on
            with ``tau2_data``, off for the procedural tasks, whose tools are stricter.

    Official τ²-bench tasks are written for an LLM user (their user scenarios are instructions to a
    model); the scripted user can play them for smoke tests and gold replays, but a faithful
    evaluation of an agent on them wants ``user={"base_url": ..., "model": ...}``.
    """

    domain: Domain

    def __init__(self, size: str | dict = "small", db_seed: int | None = None, scenarios: list[str] | None = None,
                 exclude_scenarios: list[str] | None = None, tau2_data: str | None = None,
                 task_id: str | None = None, user: str | dict = "scripted", prompt: str = "full",
                 reward_basis: list[str] | None = None, tau2_compat: bool | None = None,
                 render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        sizes = self.domain.sizes
        if isinstance(size, str):
            if size not in sizes:
                raise ValueError(f"unknown size {size!r}; choose one of {sorted(sizes)} or pass a dict")
            self.size = dict(sizes[size])
        else:
            self.size = {**sizes["small"], **size}
        self.db_seed = db_seed
        chosen = list(scenarios) if scenarios else list(self.domain.scenarios)
        unknown = sorted(set(chosen + list(exclude_scenarios or ())) - set(self.domain.scenarios))
        if unknown:
            raise ValueError(f"unknown scenario(s) {unknown} for {self.domain.name}; "
                             f"known: {', '.join(self.domain.scenarios)}")
        self.scenarios = [s for s in chosen if s not in set(exclude_scenarios or ())]
        if not self.scenarios:
            raise ValueError("no scenario left to draw from after exclude_scenarios")
        if prompt not in ("full", "compact"):
            raise ValueError(f"prompt must be 'full' or 'compact', got {prompt!r}")
        self.prompt = prompt
        self.compact_tools = prompt == "compact"
        if user != "scripted" and not (isinstance(user, dict) and {"base_url", "model"} <= set(user)):
            raise ValueError("user must be 'scripted' or a dict with 'base_url' and 'model' for an LLM user")
        self.user_config = user
        # The scripted user answers in this process; an LLM user is a network call in step().
        self.nonblocking_step = user == "scripted"
        if reward_basis is not None and not set(reward_basis) <= {"DB", "COMMUNICATE", "ACTION"}:
            raise ValueError(f"reward_basis must be a subset of DB, COMMUNICATE, ACTION; got {reward_basis}")
        self.reward_basis = tuple(reward_basis) if reward_basis is not None else None
        self.task_id = task_id
        self.tau2_data = None
        if tau2_data is not None:
            self.tau2_data = Path(tau2_data)
            if not (self.tau2_data / "db.json").is_file() or not (self.tau2_data / "tasks.json").is_file():
                raise FileNotFoundError(f"tau2_data={tau2_data!r} must be a folder with db.json and tasks.json "
                                        f"(τ²-bench's data/tau2/domains/{self.domain.name}/)")
        self.tau2_compat = self.tau2_data is not None if tau2_compat is None else bool(tau2_compat)
        if self.tau2_compat:
            self.max_repeated_calls = None  # τ²-bench does not end a conversation on repeated calls
        self.task: TauTask | None = None
        self.db: Layer | None = None

    def _toolkit(self, layer: Layer) -> Any:
        """The domain's tools over ``layer`` (τ²-compatible ones in τ²-compatible mode)."""
        return self.domain.toolkit_cls(layer, tau2_compat=self.tau2_compat)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        observation, info = super().reset(seed=seed, options=options)
        if self.tau2_compat:
            # same tools and schemas; arguments read as τ²-bench's models read them
            self._toolset = Tau2ToolSet(self.toolkit, max_output_chars=self.max_output_chars,
                                        compact=self.compact_tools)
        return observation, info

    # ------------------------------------------------------------------ data
    def _base_db(self) -> dict:
        if self.db_seed is None:
            return self.domain.generate_db(self.np_random, self.size)
        key = (self.domain.name, self.db_seed, tuple(sorted(self.size.items())))
        tables = _DB_CACHE.get(key)
        if tables is None:
            tables = self.domain.generate_db(np.random.default_rng(self.db_seed), self.size)
            _DB_CACHE[key] = tables
            if len(_DB_CACHE) > _DB_CACHE_SIZE:
                _DB_CACHE.popitem(last=False)
        return tables

    def _tau2(self) -> tuple[dict, list[TauTask]]:
        key = (self.domain.name, str(self.tau2_data.resolve()))  # type: ignore[union-attr]
        if key not in _TAU2_CACHE:
            _TAU2_CACHE[key] = self.domain.load_tau2(self.tau2_data)  # type: ignore[arg-type]
        return _TAU2_CACHE[key]

    @property
    def tau2_tasks(self) -> list[TauTask]:
        """τ²-bench's tasks (only with ``tau2_data``)."""
        if self.tau2_data is None:
            raise ValueError("this env was made without tau2_data")
        return self._tau2()[1]

    # ------------------------------------------------------------------ TraceEnv hooks
    def _generate_task(self, options: dict) -> str:
        if self.tau2_data is not None:
            tables, tasks = self._tau2()
            wanted = options.get("task_id", self.task_id)
            if wanted is not None:
                matches = [t for t in tasks if t.task_id == str(wanted)]
                if not matches:
                    raise ValueError(f"no τ²-bench task with id {wanted!r} in {self.tau2_data}")
                task = matches[0]
            else:
                task = tasks[int(self.np_random.integers(len(tasks))) if self._seed is None else self._seed % len(tasks)]
            initial = Layer(tables)
        else:
            initial = Layer(self._base_db())
            task = self.domain.generate_task(self.np_random, initial, self.scenarios, self.size)
        if self.reward_basis is not None:
            task.reward_basis = self.reward_basis
        self.task = task
        self.db = initial.child()
        self.toolkit = self._toolkit(self.db)
        if self.user_config == "scripted":
            self.user: Any = ScriptedUser(task)
        else:
            self.user = LLMUser(task, **self.user_config)  # type: ignore[arg-type]
        return self.user.opening()

    def _tool_provider(self) -> Any:
        return self.toolkit

    def system_prompt(self) -> str:
        return self.domain.policy(compact=self.prompt == "compact")

    def _on_user_message(self, text: str) -> str | None:
        reply = self.user.respond(text, self._messages)
        for marker, reason in ((STOP, "user_stop"), (TRANSFER, "transfer"), (OUT_OF_SCOPE, "out_of_scope")):
            if marker in reply:
                self._end(reason)
        return reply

    def _on_tool_result(self, name: str, arguments: dict, result: Any) -> None:
        if name == "transfer_to_human_agents" and result.ok:
            self._end("transfer")

    def _evaluate(self) -> tuple[float, dict]:
        return evaluate_task(self.task, self.db, self._messages, self._toolkit,  # type: ignore[arg-type]
                             tau2_compat=self.tau2_compat)

    def task_spec(self) -> dict:
        return self.task.to_dict() if self.task else {}

    def task_info(self) -> dict:
        if self.task is None:
            return {}
        # ``families``: the request families in the user's order, so that readers of a trajectory (the
        # generator's evidence) need not rebuild the task, whose env kwargs the record does not hold.
        return {"task_id": self.task.task_id, "scenario": self.task.scenario, "needs": sorted(self.task.needs),
                "n_requests": len(self.task.requests), "families": [r.kind for r in self.task.requests]}

    def world_state(self) -> dict:
        return self.db.changes if self.db is not None else {}

    def oracle(self) -> Policy:
        from .agents import scripted_policy

        return scripted_policy(self.task)  # type: ignore[arg-type]
