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

#: The four capabilities TRACE found on τ²-bench (docs/design.md, "The method's settings").
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
        ask: a question the agent asks before its reads (the airline's ``ask_details_prob``: the request leaves
            out what identifies it, and the user's answer is ``details``); empty for the usual requests.
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
    ask: str = ""

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
        for request in d["requests"]:
            if not request["ask"]:
                del request["ask"]  # a task without an ask serializes (and hashes) as before the field existed
        d["reward_basis"] = list(self.reward_basis)
        d["needs"] = sorted(self.needs)
        return d


# ---------------------------------------------------------------------- uniform request building
def request_family(kind: str) -> str:
    """The target family a request kind is about: ``"sdr_change:cancel"`` → ``cancel``, ``cancel`` → ``cancel``.

    Capability envs prefix their request kinds (``sdr_question:flight_status``); the family after the
    last colon is the target's, which is what a generated env's focus is matched against.
    """
    return kind.rsplit(":", 1)[-1]


class CannotBuild(Exception):
    """The drawn parameters do not allow the asked-for request here; draw again (the caller retries)."""


class RequestSession:
    """Builds requests one at a time for one user over one task layer (the capability envs' API).

    Each domain's ``tasks`` module has a subclass and a ``request_session(rng, db, ...)``
    factory. :meth:`request` draws one request of a family with the decision forced or free, retrying
    (with the layer and bookkeeping restored) until ``accept`` holds; :meth:`task` assembles the
    requests into a :class:`TauTask` with the domain's authentication, so that the oracle and the
    planted-deficit agents of :mod:`trace_envs.domains.agents` play it as they play target tasks.

    Subclasses implement ``_build(family, refuse)``, ``_snapshot()``, ``_restore(state)`` and ``task``.

    Attributes:
        domain: ``"airline"`` or ``"retail"``.
        families: the request families this domain can build.
        user_id: the task's user.
    """

    domain: str = ""
    families: tuple[str, ...] = ()
    user_id: str = ""

    def _build(self, family: str, refuse: bool | None) -> Request:
        raise NotImplementedError

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def _restore(self, state: Any) -> None:
        raise NotImplementedError

    def request(self, family: str, refuse: bool | None = None, accept: Any = None, attempts: int = 12) -> Request:
        """One request of ``family``.

        Args:
            family: a name from :attr:`families`.
            refuse: True: a refusal (``decision == "refuse"``); False: not a refusal (``act`` or
                ``answer``); None: the domain's own mix.
            accept: optional predicate on the built request (e.g. ``lambda r: r.forbidden_write is not None``);
                requests it rejects are undone and drawn again.
            attempts: draws before giving up with :class:`CannotBuild`.
        """
        if family not in self.families:
            raise ValueError(f"unknown {self.domain} family {family!r}; known: {', '.join(self.families)}")
        for _ in range(attempts):
            state = self._snapshot()
            try:
                r = self._build(family, refuse)
            except CannotBuild:
                r = None
            if r is not None and (refuse is None or (r.decision == "refuse") == refuse) and (accept is None or accept(r)):
                return r
            self._restore(state)
        raise CannotBuild(f"no acceptable {self.domain} {family!r} request (refuse={refuse}) in {attempts} draws")

    def task(self, requests: list[Request], scenario: str, opening: str | None = None) -> TauTask:
        """The requests as a task for this session's user (authentication, opening, known info).

        Args:
            requests: the requests, in the order the user raises them.
            scenario: the task's scenario label (e.g. ``"precondition:cancel"``).
            opening: the user's first message; default: a greeting and the first request's text.
        """
        raise NotImplementedError
