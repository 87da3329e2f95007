"""Reference agents for the τ²-style domains: the oracle and planted-deficit agents.

Each agent follows the task's gold path (authenticate, read what the
decision rests on, describe the action and ask for confirmation, write,
report) with zero, one or several capabilities removed:

===================================  ===============================================================
agent name                           what it does differently (capability it lacks)
===================================  ===============================================================
``oracle``                           nothing: reward 1.0 on every task
``tau:skip_precondition``            does what the user asks even when the policy forbids it
                                     (precondition_verification)
``tau:stop_after_first``             handles the first request only (multi_step_completion)
``tau:wrong_record``                 acts on the wrong record / misreads a number
                                     (structured_data_reasoning)
``tau:sloppy_arguments``             sends write calls with wrong types, missing fields or wrong ids,
                                     and does not fix them (tool_calling_precision)
===================================  ===============================================================

A deficit agent scores 0 on exactly the tasks whose ``needs`` contain its
capability, and 1.0 on every other task (tests hold it to that).
:class:`TauScriptedAgent` takes any set of deficits, for the analysis stage's
mixtures.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..agents import register_agent
from ..core.conversation import hermes_tool_call
from .task import CAPABILITIES, Call, TauTask

DEFICITS = {
    "skip_precondition": "precondition_verification",
    "stop_after_first": "multi_step_completion",
    "wrong_record": "structured_data_reasoning",
    "sloppy_arguments": "tool_calling_precision",
}
CONFIRM = "Do you confirm (yes/no)?"
ANYTHING_ELSE = "Is there anything else I can help you with?"


def sloppy(call: Call, index: int) -> Call:
    """A corrupted copy of a write call that the tool will reject: a wrong type, a missing field or a wrong id."""
    args = dict(call.arguments)
    numbers = [k for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    strings = [k for k, v in args.items() if isinstance(v, str)]
    mode = index % 3
    if mode == 0 and numbers:
        args[numbers[0]] = str(args[numbers[0]])  # "2" instead of 2
    elif mode == 1 and strings:
        args[strings[0]] = args[strings[0]] + "_X"  # an id that does not exist
    elif args:
        args.pop(next(iter(args)))  # a missing required argument
    return Call(call.name, args)


def describe(call: Call) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"{call.name}({args})"


def plan_turns(task: TauTask, lacks: Iterable[str] = ()) -> list[Any]:
    """The agent's turns for ``task``, with the capabilities in ``lacks`` removed."""
    lacks = set(lacks)
    unknown = lacks - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {CAPABILITIES}")
    turns: list[Any] = []
    writes = 0

    def call(c: Call) -> None:
        turns.append(hermes_tool_call(c.name, c.arguments))

    def write(c: Call) -> None:
        nonlocal writes
        call(sloppy(c, writes) if "tool_calling_precision" in lacks else c)
        writes += 1

    if task.auth_message:
        turns.append(task.auth_message)
    for c in task.auth:
        call(c)
    for i, r in enumerate(task.requests):
        if i >= 1 and "multi_step_completion" in lacks:
            turns.append(f"Thank you for reaching out. {ANYTHING_ELSE}")
            continue
        if r.ask:
            turns.append(r.ask)  # the request left out what identifies it: the user's answer gives it
        for c in r.reads:
            call(c)
        wrong = "structured_data_reasoning" in lacks
        if r.decision == "act" and r.write is not None:
            target = r.wrong_write if wrong and r.wrong_write is not None else r.write
            turns.append(f"{r.message} {CONFIRM}")
            write(target)
            turns.append(f"{r.done_message} {ANYTHING_ELSE}")
        elif r.decision == "refuse" and r.forbidden_write is not None and "precondition_verification" in lacks:
            turns.append(f"I can do that: {describe(r.forbidden_write)}. {CONFIRM}")
            write(r.forbidden_write)
            turns.append(f"Done. {ANYTHING_ELSE}")
        else:
            message = r.wrong_message if wrong and r.wrong_message is not None else r.message
            turns.append(f"{message} {ANYTHING_ELSE}")
    return turns


class _Turns:
    def __init__(self, turns: list[Any]):
        self.turns, self.i = turns, 0

    def __call__(self, observation: str, info: dict) -> Any:
        turn = self.turns[self.i] if self.i < len(self.turns) else ANYTHING_ELSE
        self.i += 1
        return turn


def scripted_policy(task: TauTask, lacks: Iterable[str] = ()) -> _Turns:
    """A ``(observation, info) -> action`` policy that plays ``plan_turns(task, lacks)``."""
    return _Turns(plan_turns(task, lacks))


class TauScriptedAgent:
    """The oracle for τ²-style tasks with a set of capabilities removed (see the module docstring).

    Args:
        lacks: capabilities to remove (names from ``CAPABILITIES``).
        name: the agent's name in trajectory records.
    """

    def __init__(self, lacks: Iterable[str] = (), name: str | None = None):
        self.lacks = tuple(sorted(set(lacks)))
        unknown = set(self.lacks) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {CAPABILITIES}")
        self.name = name or ("tau:lacks_" + "+".join(self.lacks) if self.lacks else "tau:oracle")
        self._policy: _Turns | None = None

    def reset(self, env: Any, observation: str, info: dict) -> None:
        remote = getattr(env, "remote_policy", None)
        if remote is not None:
            # A sandboxed env's hidden task lives in its worker: the same script is played there.
            self._policy = remote("tau_scripted", {"lacks": list(self.lacks)})
            return
        task = getattr(env, "task", None)
        if not isinstance(task, TauTask):
            raise TypeError(f"{self.name} plays τ²-style envs (env.task must be a TauTask), got {type(env).__name__}")
        self._policy = scripted_policy(task, self.lacks)

    def __call__(self, observation: str, info: dict) -> Any:
        if self._policy is None:
            raise RuntimeError(f"{self.name}: reset(env, observation, info) must be called after env.reset")
        return self._policy(observation, info)


for _name, _capability in DEFICITS.items():
    register_agent(f"tau:{_name}", lambda c=_capability, n=_name: TauScriptedAgent([c], name=f"tau:{n}"))


class NoisyTauAgent(TauScriptedAgent):
    """A stochastic reference agent: per episode, each capability is dropped independently with probability ``p``.

    Deterministic agents give all-0 or all-1 GRPO groups only; this one gives groups whose rewards
    differ, for calibrating environments (``trace envs calibrate ID --agent tau:noisy``). The episode's
    deficits are a pure function of (``seed``, the env seed): members of a group that share the env
    seed but have different sampling seeds behave differently, and a rerun is byte-identical.

    Args:
        p: the probability of dropping each capability (default 0.5).
        seed: the agent's sampling seed.
        capabilities: the capabilities that may be dropped (default: all four).
        name: the agent's name in trajectory records.
    """

    def __init__(self, p: float = 0.5, seed: int = 0, capabilities: Iterable[str] | None = None,
                 name: str = "tau:noisy"):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be within [0, 1], got {p}")
        pool = tuple(CAPABILITIES if capabilities is None else capabilities)
        unknown = set(pool) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {CAPABILITIES}")
        super().__init__((), name=name)
        self.p, self.seed, self.pool = float(p), int(seed), pool
        self._episodes = 0

    def reset(self, env: Any, observation: str, info: dict) -> None:
        import numpy as np

        env_seed = getattr(env, "_seed", None)
        key = [self.seed, 0 if env_seed is None else int(env_seed) + 1, self._episodes if env_seed is None else 0]
        self._episodes += 1
        rng = np.random.default_rng(np.random.SeedSequence(key))
        draws = rng.random(len(CAPABILITIES))  # one draw per capability, so the pool does not shift the others
        self.lacks = tuple(c for c, u in zip(CAPABILITIES, draws) if c in self.pool and u < self.p)
        super().reset(env, observation, info)


register_agent("tau:noisy", NoisyTauAgent)
for _name, _capability in DEFICITS.items():
    register_agent(f"tau:noisy_{_name}",
                   lambda p=0.5, seed=0, c=_capability, n=_name: NoisyTauAgent(p, seed, [c], name=f"tau:noisy_{n}"))
