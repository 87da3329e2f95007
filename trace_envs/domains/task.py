"""Tasks of the τ²-style domains: what the user wants, and the gold path that serves it.

A :class:`TauTask` is plain data, a pure function of (seed, config). It holds
the user's scenario (what the simulated user knows and asks for), the
requests in the order the user raises them, and for each request the gold
behaviour: which records the agent must read, whether the policy allows the
requested write (``act``), forbids it (``refuse``) or whether it is a
question (``answer``), the exact write, and the facts the agent must say.

The same data drives three things: the scripted user, the evaluator (gold
writes → gold DB; facts → communicate check) and the reference agents
(the oracle, and planted-deficit agents that drop one capability; see
:mod:`trace_envs.domains.agents`). ``needs`` says which capabilities a task
exercises in a way that changes its reward; the tests hold the deficit agents
to it exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: The four capabilities TRACE found on τ²-bench (FACTS.md §1).
CAPABILITIES = (
    "precondition_verification",
    "multi_step_completion",
    "structured_data_reasoning",
    "tool_calling_precision",
)


@dataclass
class Call:
    """A tool call: name and arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict) -> "Call":
        return cls(d["name"], dict(d.get("arguments") or {}))


@dataclass
class Request:
    """One thing the user asks for, and the gold way to handle it.

    Attributes:
        kind: the scenario family (e.g. ``cancel``, ``flight_status``).
        text: how the user states the request.
        decision: ``act`` (do the write), ``refuse`` (the policy forbids it) or ``answer`` (a question).
        reads: the read calls that establish the facts the decision rests on.
        message: what the agent tells the user: the action to confirm (act), the reason (refuse)
            or the answer (answer).
        write: the gold write for ``act``.
        done_message: what the agent says after the write succeeds.
        forbidden_write: for ``refuse``: the write the user asked for, which the tools would accept
            but the policy forbids (what an agent that skips the precondition check does).
        communicate: facts (strings) that must appear in the agent's messages.
        wrong_write / wrong_message: what an agent that picks the wrong record or misreads a
            number does instead (for requests that need structured data reasoning).
        details: the facts the user gives when asked which record or what exactly they mean.
    """

    kind: str
    text: str
    decision: Literal["act", "refuse", "answer"]
    reads: list[Call] = field(default_factory=list)
    message: str = ""
    write: Call | None = None
    done_message: str = ""
    forbidden_write: Call | None = None
    communicate: list[str] = field(default_factory=list)
    wrong_write: Call | None = None
    wrong_message: str | None = None
    details: str = ""

    @property
    def needs_reasoning(self) -> bool:
        return self.wrong_write is not None or self.wrong_message is not None


@dataclass
class UserScenario:
    """What the simulated user knows and wants.

    Attributes:
        persona: a one-line description of the user.
        known_info: facts the user can give when asked (``user_id``, ``email``, ``name``, ``zip``, ...).
        opening: the user's first message.
        instructions: free-text instructions (for an LLM user, and τ²-bench's own tasks).
    """

    persona: str
    known_info: dict[str, str]
    opening: str
    instructions: str = ""


@dataclass
class TauTask:
    """A complete task: scenario, requests with their gold handling, and evaluation settings.

    Attributes:
        task_id: a stable id (``<domain>-<scenario>-<seed>`` or τ²-bench's own id).
        domain: ``airline`` or ``retail``.
        scenario: the scenario family of the task (``bundle:<a>+<b>`` for several requests).
        user: the user scenario.
        auth: the calls that identify the user before any request is handled.
        auth_message: what the agent asks to authenticate the user.
        requests: the requests in the order the user raises them.
        reward_basis: components multiplied into the reward (``DB``, ``COMMUNICATE``, ``ACTION``).
        gold_actions: explicit gold writes (τ²-bench tasks); default: the writes of ``act`` requests.
    """

    task_id: str
    domain: str
    scenario: str
    user: UserScenario
    requests: list[Request]
    auth: list[Call] = field(default_factory=list)
    auth_message: str = ""
    reward_basis: tuple[str, ...] = ("DB", "COMMUNICATE")
    gold_actions: list[Call] | None = None

    @property
    def gold_writes(self) -> list[Call]:
        if self.gold_actions is not None:
            return list(self.gold_actions)
        return [r.write for r in self.requests if r.decision == "act" and r.write is not None]

    @property
    def communicate(self) -> list[str]:
        return [fact for r in self.requests for fact in r.communicate]

    @property
    def requires_write(self) -> bool:
        return bool(self.gold_writes)

    @property
    def needs(self) -> set[str]:
        """Capabilities whose absence changes this task's reward (see module docstring)."""
        needs: set[str] = set()
        if any(r.decision == "refuse" and r.forbidden_write is not None for r in self.requests):
            needs.add("precondition_verification")
        if any(r.decision == "act" or r.communicate for r in self.requests[1:]):
            needs.add("multi_step_completion")
        if any(r.needs_reasoning for r in self.requests):
            needs.add("structured_data_reasoning")
        if self.gold_writes:
            needs.add("tool_calling_precision")
        return needs

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reward_basis"] = list(self.reward_basis)
        d["needs"] = sorted(self.needs)
        return d
