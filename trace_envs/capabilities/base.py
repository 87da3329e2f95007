"""``CapabilityEnv``: the shared base of the τ²-domain capability environments.

A capability environment isolates one capability TRACE found on τ²-bench (precondition
verification, multi-step completion, structured data reasoning, tool-calling precision) while
keeping everything the target env shows the agent: the domain's generated database, its tools
(same schemas, same ``<tool_response>`` format), its policy as the system prompt and its scripted
user. ``CapabilityEnv`` subclasses :class:`~trace_envs.domains.base.TauEnv` and only changes *which
task* is drawn and *how it is scored*:

* ``domain``: ``"airline"`` or ``"retail"``; ``None`` (the registry default) draws the domain per
  episode from the seed, so one id covers both targets.
* ``difficulty``: an int in 1..5 (validated); each env documents what it means.
* the task is a :class:`~trace_envs.domains.task.TauTask` built with the domains' uniform request API
  (below), so ``env.task`` works with the oracle and with the planted-deficit agents
  (``tau:skip_precondition``, ``tau:stop_after_first``, ``tau:wrong_record``, ``tau:sloppy_arguments``;
  :class:`~trace_envs.domains.agents.TauScriptedAgent`) exactly as on the targets.
* ``max_repeated_calls = 3``: three identical tool calls in a row end the episode (as in the authors'
  games).

How to write one (see ``precondition_verification.py`` for a complete example)::

    class MyCapabilityEnv(CapabilityEnv):
        capability = "structured_data_reasoning"      # a name from domains.task.CAPABILITIES
        default_difficulty = 3

        def _build_task(self, session, difficulty):   # -> TauTask; raise CannotBuild to redraw
            r = session.request("cancel", refuse=False, accept=lambda r: r.wrong_write is not None)
            return session.task([r], scenario="sdr:cancel")

        def _score(self):                              # -> (reward in [0, 1], breakdown dict)
            outcomes = self.request_outcomes()
            ...

Hooks (all optional except ``_build_task`` and ``_score``):
    ``_build_task(session, difficulty) -> TauTask``: draw the task. ``session`` is the domain's
        :class:`~trace_envs.domains.task.RequestSession` for one drawn user over the episode's initial
        layer; ``self.domain_name`` says which domain it is. The base then replays the task's gold
        writes in order and redraws if any fails (e.g. two requests paying with one gift card). Raising
        :class:`~trace_envs.domains.task.CannotBuild` undoes the attempt and draws again (up to
        ``max_build_attempts``, with a new session).
    ``_session_kwargs(difficulty) -> dict``: extra arguments for ``request_session`` (e.g.
        ``{"describe_prob": 0.0}`` so records are always named by id; ``1.0`` to always name them by
        description with a look-alike record present).
    ``_replan()``: forget what the episode fixed before its first build attempt (structured data
        reasoning draws its request kind once per episode), so that a subclass that rejects a built task
        (a generated env's focus) gets a fresh draw.
    ``_score() -> (reward, breakdown)``: the capability reward. Helpers: :meth:`request_outcomes`
        (per-request: write attempted / exact effect / forbidden write attempted / facts said, and the
        agent's unrequested writes) and :meth:`tau_evaluation` (the target's own DB + COMMUNICATE
        reward). The base adds ``domain``, ``difficulty`` and ``capability`` to the breakdown.
    ``_make_user(task)``: the simulated user (default: the domain's ``ScriptedUser``).
    ``oracle()``: default: the scripted gold path of ``self.task`` (reward 1.0 by construction of the
        task; every env's test checks it on 500 seeds).
    ``task_info()``: the base returns the target's labels plus ``domain``, ``difficulty`` and
        ``capability``; extend it with env-specific labels.
    ``evidence_calls(request)``: the reads a decision on ``request`` rests on (default: its gold reads, else
        the task's authentication reads); structured data reasoning narrows it to the described record.

Versions (``version`` argument; the registry pins it per id): ``0`` is each env as first published under
``-v0``. ``1`` (the default, ``-v1`` ids) pays only for evidence of the skill: a decision earns credit only
when the agent read the records it rests on first (:attr:`RequestOutcome.informed`), a refusal only when
the agent read them and then told the customer (:attr:`RequestOutcome.refused_informed`), and no env
pays for attempting a write, for a decision taken without its evidence or for ending politely. The
cheapest policies that do not use the records (``generators.probes.probe_agents``) score at most
0.05 on every v1 env at every difficulty, which the tests measure over 500 seeds.

The uniform request API (added to both domains' ``tasks`` modules; additive, ``generate_task`` unchanged):
    ``trace_envs.domains.<domain>.tasks.request_session(rng, db, size=None, user_id=None, describe_prob=None)``
    returns a ``RequestSession`` with:

    * ``families``: the request families (airline: cancel, flight_change, cabin_change, baggage, booking,
      passenger_update, compensation, flight_status, info; retail: cancel, modify_items, modify_address,
      modify_payment, return, exchange, user_address, info);
    * ``request(family, refuse=None|True|False, accept=None, attempts=12) -> Request``: one request,
      a refusal (``refuse=True``), not a refusal (``False``: ``act`` or ``answer``) or the domain's mix;
      ``accept`` filters (e.g. ``lambda r: r.forbidden_write is not None`` for policy-only refusals, or
      ``lambda r: r.wrong_write is not None`` for ones with a plausible wrong record); rejected draws
      are undone (records planted by the attempt are removed);
    * ``task(requests, scenario, opening=None) -> TauTask``: authentication, known info, the opening
      (default: greeting + first request) and the domain's consistency checks;
    * ``user_id``, ``domain``.

    A :class:`~trace_envs.domains.task.Request` carries ``decision`` (act/refuse/answer), ``reads``,
    ``write``, ``forbidden_write``, ``communicate``, ``wrong_write``/``wrong_message``, ``message`` and
    ``done_message``; it may be edited before ``task`` (e.g. to drop ``wrong_write`` when the env
    does not test reasoning).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.env import Policy
from ..core.tools import ToolSet, tool_specs
from ..domains.base import TauEnv
from ..domains.db import Layer, same_state
from ..domains.evaluation import apply_gold, communicated, evaluate_task
from ..domains.task import CAPABILITIES, CannotBuild, Call, RequestSession, TauTask
from ..domains.user import ScriptedUser

DOMAIN_NAMES = ("airline", "retail")
DIFFICULTIES = (1, 2, 3, 4, 5)


def _domain(name: str) -> Any:
    """The domain object and its tasks module (imported lazily: each pulls its tools and DB generator)."""
    if name == "airline":
        from ..domains.airline import AirlineDomain
        from ..domains.airline import tasks

        return AirlineDomain(), tasks
    from ..domains.retail import RetailDomain
    from ..domains.retail import tasks

    return RetailDomain(), tasks


_DOMAINS: dict[str, tuple[Any, Any]] = {}


def domain_parts(name: str) -> tuple[Any, Any]:
    """(domain object, tasks module) for ``"airline"`` or ``"retail"`` (cached)."""
    if name not in DOMAIN_NAMES:
        raise ValueError(f"domain must be one of {DOMAIN_NAMES} or None (drawn per episode), got {name!r}")
    if name not in _DOMAINS:
        _DOMAINS[name] = _domain(name)
    return _DOMAINS[name]


@dataclass
class RequestOutcome:
    """What the agent did about one request (see :meth:`CapabilityEnv.request_outcomes`).

    Attributes:
        index: position of the request in the task.
        kind: the request family.
        decision: the gold decision (``act``, ``refuse``, ``answer``).
        attempted: ``act``: the agent called the gold write's tool (successful or not); each call is
            credited to one request at most (exact matches first, then calls naming the same record).
        exact: ``act``: one of the agent's successful calls has the same effect on the database as the
            gold write (each applied alone to the task's initial state).
        forbidden: ``refuse``: the agent called a write tool on the record the user asked about
            (the key argument of ``forbidden_write``, else of the first read, appears in the call),
            successful or not; with neither, any write call counts.
        communicated: every fact the request requires appears in the agent's messages.
        missing: the facts not said.
        evidence: the agent made every call of :meth:`CapabilityEnv.evidence_calls` (same tool, same
            arguments) and each succeeded: the records the decision rests on reached the conversation.
        informed: ``act``: the evidence was complete before the call credited as ``exact``; ``answer``:
            before the message that completed the required facts; ``refuse``: see ``refused_informed``.
        refused_informed: ``refuse``: the evidence was complete, the agent wrote to the customer after
            it, and no write call touched the record.
    """

    index: int
    kind: str
    decision: str
    attempted: bool = False
    exact: bool = False
    forbidden: bool = False
    communicated: bool = True
    missing: list[str] = field(default_factory=list)
    evidence: bool = False
    informed: bool = False
    refused_informed: bool = False


@dataclass
class Outcomes:
    """Per-request outcomes plus the agent's write calls.

    Attributes:
        requests: one :class:`RequestOutcome` per request.
        write_calls: every write-tool call of the agent (name, arguments, ok).
        unrequested: the agent's successful writes whose effect matches no ``act`` request's gold write.
    """

    requests: list[RequestOutcome]
    write_calls: list[tuple[str, Any, bool]]
    unrequested: list[tuple[str, Any]]


def _key_value(call: Call) -> str | None:
    """The record a write call is about: its first string argument (a reservation, order or user id)."""
    for value in call.arguments.values():
        if isinstance(value, str):
            return value
    return None


def _families_of(name: str) -> tuple[str, ...]:
    """The request families of a domain's request sessions (``"airline"`` or ``"retail"``)."""
    tasks = domain_parts(name)[1]
    return tuple(getattr(tasks, "AirlineRequestSession" if name == "airline" else "RetailRequestSession").families)


def _lead_in_args(lead_in: Any, prob: Any) -> tuple[tuple[str, ...], float]:
    """Validated ``(lead_in, lead_in_prob)`` (see :class:`CapabilityEnv`)."""
    if lead_in == "auto":
        raise ValueError("lead_in='auto' is resolved by `trace run` (train.options.env_kwargs) from the base's "
                         "rollouts; an env takes the families themselves, e.g. lead_in=['flight_status']")
    if isinstance(lead_in, str):
        lead_in = (lead_in,)
    if not isinstance(lead_in, (list, tuple)) or not all(isinstance(f, str) and f for f in lead_in):
        raise ValueError(f"lead_in must be a list of target request families (e.g. ['flight_status']), got {lead_in!r}")
    if prob is None:
        prob = 0.5 if lead_in else 0.0
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0.0 <= float(prob) <= 1.0:
        raise ValueError(f"lead_in_prob must be a number in [0, 1], got {prob!r}")
    if prob and not lead_in:
        raise ValueError("lead_in_prob needs lead_in: the families a lead-in question is drawn from")
    return tuple(lead_in), float(prob)


class CapabilityEnv(TauEnv):
    """Base class of the τ²-domain capability environments (see the module docstring).

    Args:
        domain: ``"airline"``, ``"retail"`` or None (drawn per episode from the seed).
        difficulty: 1..5 (each env documents its meaning); None = the env's ``default_difficulty``.
        size: DB size preset (``"small"`` default) or a dict of overrides, as for the targets.
        db_seed: fixed DB for every episode (tasks still vary with the seed).
        user: ``"scripted"`` (default) or ``{"base_url": ..., "model": ...}`` for an LLM user.
        prompt: ``"full"`` or ``"compact"`` policy.
        scenarios, exclude_scenarios, tau2_data, task_id, reward_basis, tau2_compat: as for the targets
            (:class:`trace_envs.domains.base.TauEnv`): which request families, τ²-bench's own data, the reward's
            components.
        lead_in: target request families that may open an episode (default: none). Added for the
            planted-deficit experiment, kept as a capability: use it when adapters trained on these envs
            forget the target's other requests. With probability
            ``lead_in_prob`` an episode opens with one question of a family drawn from ``lead_in`` (a
            request the target answers from the records without a write, e.g. a flight's status) before the
            capability's own request. The episode succeeds only if that question is answered too, as the
            target would score it (the facts said after the records were read); otherwise the reward is 0.
            Why: an adapter trained only on the capability's requests forgets the target's others (the
            precondition adapter of the planted recipe answered 1 of 54 flight-status requests, the base 43;
            docs/environments.md).
        lead_in_prob: the share of episodes with a lead-in question (0..1; default 0.5 when ``lead_in`` is
            given).
    """

    capability: str = ""
    default_difficulty: int = 3
    max_repeated_calls = 3
    max_build_attempts = 50
    #: Whether a lead-in question may open an episode (``lead_in``); False where the opening lists the requests.
    supports_lead_in = True
    #: The versions a subclass implements (see the module docstring); the newest is the default.
    versions: tuple[int, ...] = (0, 1)

    def __init__(self, domain: str | None = None, difficulty: int | None = None, size: str | dict = "small",
                 db_seed: int | None = None, user: str | dict = "scripted", prompt: str = "full",
                 render_mode: str | None = None, version: int | None = None, lead_in: Any = (),
                 lead_in_prob: float | None = None):
        if self.capability not in CAPABILITIES:
            raise TypeError(f"{type(self).__name__}.capability must be one of {CAPABILITIES}, got {self.capability!r}")
        if domain is not None and domain not in DOMAIN_NAMES:
            raise ValueError(f"domain must be one of {DOMAIN_NAMES} or None (drawn per episode), got {domain!r}")
        difficulty = self.default_difficulty if difficulty is None else difficulty
        if isinstance(difficulty, bool) or not isinstance(difficulty, (int, np.integer)) or difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be an integer from 1 to 5, got {difficulty!r}")
        version = max(self.versions) if version is None else version
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version not in self.versions:
            raise ValueError(f"version must be one of {self.versions} (0: as published under -v0; "
                             f"{max(self.versions)}: the current reward), got {version!r}")
        self.version = int(version)
        self.lead_in, self.lead_in_prob = _lead_in_args(lead_in, lead_in_prob)
        if self.lead_in and not self.supports_lead_in:
            raise ValueError(f"{type(self).__name__} takes no lead_in: its opening message lists every request "
                             "of the episode")
        known = {f for name in (DOMAIN_NAMES if domain is None else (domain,)) for f in _families_of(name)}
        if set(self.lead_in) - known:
            raise ValueError(f"lead_in: unknown request families {sorted(set(self.lead_in) - known)}; known: "
                             f"{', '.join(sorted(known))}")
        #: Index of the capability's own request in ``task.requests`` (1 when a lead-in question opens it).
        self.skill_index = 0
        self.domain_choice = domain
        self.difficulty = int(difficulty)
        self.size_spec = size
        for name in DOMAIN_NAMES if domain is None else (domain,):
            self._size_for(name)  # fail early on a bad size
        # TauEnv's constructor with the first candidate domain; the real one is set per episode.
        self.domain_name = domain or DOMAIN_NAMES[0]
        self.domain, self.tasks_module = domain_parts(self.domain_name)
        super().__init__(size=size, db_seed=db_seed, user=user, prompt=prompt, render_mode=render_mode)

    # ------------------------------------------------------------------ hooks for subclasses
    def _build_task(self, session: RequestSession, difficulty: int) -> TauTask:
        raise NotImplementedError

    def _session_kwargs(self, difficulty: int) -> dict:
        return {}

    def _replan(self) -> None:
        """Forget what this episode fixed before its first build attempt (a family drawn once per episode).

        Called by a subclass that rejects a built task for its own reasons (a generated env's focus) and
        wants the next attempt to draw anew, not to rebuild the same kind of task. Default: nothing is fixed.
        """

    def _score(self) -> tuple[float, dict]:
        raise NotImplementedError

    def _make_user(self, task: TauTask) -> Any:
        if self.user_config == "scripted":
            return ScriptedUser(task)
        from ..domains.user import LLMUser

        return LLMUser(task, **self.user_config)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ generation
    def _size_for(self, name: str) -> dict:
        sizes = domain_parts(name)[0].sizes
        if isinstance(self.size_spec, str):
            if self.size_spec not in sizes:
                raise ValueError(f"unknown size {self.size_spec!r} for {name}; choose one of {sorted(sizes)} "
                                 f"or pass a dict")
            return dict(sizes[self.size_spec])
        return {**sizes["small"], **self.size_spec}

    def _generate_task(self, options: dict) -> str:
        name = self.domain_choice or DOMAIN_NAMES[int(self.np_random.integers(len(DOMAIN_NAMES)))]
        self.domain_name = name
        self.domain, self.tasks_module = domain_parts(name)
        self.size = self._size_for(name)
        initial = Layer(self._base_db())
        task = None
        # Drawn once per episode (not per build attempt), so that failed attempts do not bias the share.
        domain_families = _families_of(name)
        families = [f for f in self._lead_in_families() if f in domain_families]  # this episode's domain's
        lead_family = (families[int(self.np_random.integers(len(families)))]
                       if families and self.np_random.random() < self.lead_in_prob else None)
        for _ in range(self.max_build_attempts):
            try:
                session = self.tasks_module.request_session(self.np_random, initial, self.size,
                                                            **self._session_kwargs(self.difficulty))
                task = self._build_task(session, self.difficulty)
                if lead_family is not None:
                    task = self._with_lead_in(session, task, lead_family)
                if apply_gold(initial, self.domain.toolkit_cls, task)[1]:
                    raise CannotBuild("a gold write fails when the gold path is replayed in order")
                break
            except CannotBuild:
                task = None
                initial.changes.clear()
        if task is None:
            lead = (f" opened by a {lead_family!r} question (lead-in questions must be requests answered "
                    f"without a write, e.g. flight_status or info)" if lead_family else "")
            raise RuntimeError(f"{type(self).__name__} could not build a {name} task at difficulty "
                               f"{self.difficulty}{lead} in {self.max_build_attempts} attempts")
        self.task = task
        self.skill_index = 1 if lead_family is not None else 0
        self.db = initial.child()
        self.toolkit = self.domain.toolkit_cls(self.db)
        self.user = self._make_user(task)
        return self.user.opening()

    def _lead_in_families(self) -> tuple[str, ...]:
        """The families a lead-in question may come from (default: ``lead_in``; a subclass may narrow them)."""
        return self.lead_in

    def _with_lead_in(self, session: RequestSession, task: TauTask, family: str) -> TauTask:
        """``task`` opened by one question of ``family`` (answered without a write) for the same user."""
        lead = session.request(family, refuse=False, accept=lambda q: q.write is None and q.decision == "answer")
        return session.task([lead, *task.requests], scenario=task.scenario)

    @property
    def skill_request(self) -> Any:
        """The capability's own request in ``self.task`` (after a lead-in question, if one opens the episode)."""
        return self.task.requests[self.skill_index]  # type: ignore[union-attr]

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self) -> tuple[float, dict]:
        reward, breakdown = self._score()
        breakdown = {**breakdown, "domain": self.domain_name, "difficulty": self.difficulty,
                     "capability": self.capability, "version": self.version}
        if self.skill_index:
            # The lead-in question is scored as the target scores an answer: its facts said after its records
            # were read. An episode whose question went unanswered earns nothing, whatever the skill did.
            lead = self.request_outcomes().requests[0]
            answered = lead.communicated and lead.informed
            breakdown = {**breakdown, "lead_in": lead.kind, "lead_in_answered": answered}
            if not answered:
                reward = 0.0
                if "success" in breakdown:
                    breakdown["success"] = False
        return float(min(1.0, max(0.0, reward))), breakdown

    def tau_evaluation(self) -> tuple[float, dict]:
        """The target env's reward for this episode (DB state + COMMUNICATE), for envs that want it."""
        return evaluate_task(self.task, self.db, self._messages, self.domain.toolkit_cls)  # type: ignore[arg-type]

    def _write_tools(self) -> set[str]:
        return {name for name, spec in tool_specs(self.domain.toolkit_cls).items() if spec.write}

    def _effect(self, call: tuple[str, Any], cache: dict) -> Layer | None:
        """The layer holding ``call`` applied alone to the task's initial state (None if it fails)."""
        key = call[0] + json.dumps(call[1], sort_keys=True, default=str)
        if key not in cache:
            layer = self.db.parent.child()  # type: ignore[union-attr]
            ok = ToolSet(self.domain.toolkit_cls(layer)).call(call[0], call[1]).ok
            cache[key] = layer if ok else None
        return cache[key]

    def evidence_calls(self, request: Any) -> list[Call]:
        """The reads whose results a decision on ``request`` rests on.

        The request's own gold reads (the reservation, the order, the flight's status...); for a request
        with none (a retail account change, decided by who the customer is), the task's authentication
        reads.
        """
        return list(request.reads or self.task.auth or [])  # type: ignore[union-attr]

    def _events(self) -> list[tuple[str, Any, Any, bool]]:
        """The agent's turns in order: ``("call", name, arguments, ok)`` or ``("say", text, None, True)``."""
        results = {m.get("tool_call_id"): m.get("content") for m in self._messages if m.get("role") == "tool"}
        events: list[tuple[str, Any, Any, bool]] = []
        for m in self._messages:
            if m.get("role") != "assistant":
                continue
            if m.get("tool_calls"):
                for tc in m["tool_calls"]:
                    fn = tc["function"]
                    args = fn["arguments"]
                    if isinstance(args, str):
                        try:
                            args = json.loads(args)
                        except json.JSONDecodeError:
                            pass
                    result = results.get(tc.get("id"))
                    events.append(("call", fn["name"], args, result is not None and not str(result).startswith("Error:")))
            elif str(m.get("content") or "").strip():
                events.append(("say", str(m["content"]), None, True))
        return events

    @staticmethod
    def _evidence_at(events: list[tuple[str, Any, Any, bool]], calls: list[Call]) -> int | None:
        """The event index at which every call in ``calls`` has succeeded at least once (None: never)."""
        wanted = {(c.name, json.dumps(c.arguments, sort_keys=True, default=str)) for c in calls}
        if not wanted:
            return -1
        for i, (kind, name, args, ok) in enumerate(events):
            if kind == "call" and ok:
                wanted.discard((name, json.dumps(args, sort_keys=True, default=str)))
                if not wanted:
                    return i
        return None

    @staticmethod
    def said_after(events: list[tuple[str, Any, Any, bool]], facts: list[str], start: int,
                   match: Any = None) -> bool:
        """Whether every fact appears in the agent's messages after event ``start`` (the default ``match``
        is the target's communicate rule: case-insensitive, commas removed, a substring)."""
        from ..domains.evaluation import _normalize

        text = " ".join(str(t) for kind, t, _, _ in events[start + 1:] if kind == "say")
        if match is None:
            return all(_normalize(f) in _normalize(text) for f in facts)
        return all(match(f, text) for f in facts)

    def request_outcomes(self) -> Outcomes:
        """Per-request outcomes of the finished episode (see :class:`RequestOutcome`)."""
        writes = self._write_tools()
        events = self._events()
        # Write calls with their position among the agent's events, so evidence can be ordered before them.
        write_events = [(i, n, a, ok) for i, (kind, n, a, ok) in enumerate(events) if kind == "call" and n in writes]
        calls = [(n, a, ok) for _, n, a, ok in write_events]
        cache: dict = {}
        matched: dict[int, int] = {}  # call index -> request index: each call counts for one request at most
        results = []
        requests = self.task.requests  # type: ignore[union-attr]
        for i, r in enumerate(requests):  # first pass: exact effects
            out = RequestOutcome(index=i, kind=r.kind, decision=r.decision)
            if r.communicate:
                found = communicated(r.communicate, self._messages)
                out.missing = [f for f, ok in found.items() if not ok]
                out.communicated = not out.missing
            if r.decision == "act" and r.write is not None:
                gold = self._effect((r.write.name, r.write.arguments), cache)
                for j, (n, a, ok) in enumerate(calls):
                    if not ok or n != r.write.name or j in matched or not isinstance(a, dict):
                        continue
                    mine = self._effect((n, a), cache)
                    if gold is not None and mine is not None and same_state(gold, mine)[0]:
                        out.exact = out.attempted = True
                        matched[j] = i
                        break
            results.append(out)
        attempts: set[int] = set()
        for out, r in zip(results, requests):  # second pass: attempts (same tool, preferably the same record)
            if r.decision != "act" or r.write is None or out.exact:
                continue
            key = _key_value(r.write)
            free = [j for j, (n, _, _) in enumerate(calls) if n == r.write.name and j not in matched and j not in attempts]
            same = [j for j in free if key is not None and key in json.dumps(calls[j][1], default=str)]
            if same or free:
                attempts.add((same or free)[0])
                out.attempted = True
        for out, r in zip(results, requests):
            if r.decision == "refuse":
                target = r.forbidden_write or (r.reads[0] if r.reads else None)
                key = _key_value(target) if target is not None else None
                for n, a, _ in calls:
                    blob = json.dumps(a, default=str)
                    if key is None or key in blob:
                        out.forbidden = True
                        break
        for out, r in zip(results, requests):  # evidence: the deciding records read, and read in time
            evidence_at = self._evidence_at(events, self.evidence_calls(r))
            out.evidence = evidence_at is not None
            if not out.evidence:
                continue
            if r.decision == "act" and r.write is not None:
                j = next((j for j, i in matched.items() if i == out.index), None)
                out.informed = j is not None and evidence_at < write_events[j][0]
            elif r.decision == "refuse":
                out.refused_informed = not out.forbidden and any(
                    kind == "say" for kind, *_ in events[evidence_at + 1:])
                out.informed = out.refused_informed
            else:
                out.informed = self.said_after(events, list(r.communicate), evidence_at)
        unrequested = [(n, a) for j, (n, a, ok) in enumerate(calls) if ok and j not in matched]
        return Outcomes(results, calls, unrequested)

    # ------------------------------------------------------------------ records
    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info.update({"domain": self.domain_name, "difficulty": self.difficulty, "capability": self.capability})
            if self.skill_index:
                info["lead_in"] = self.task.requests[0].kind
        return info

    def task_spec(self) -> dict:
        spec = super().task_spec()
        if spec:
            spec = {**spec, "difficulty": self.difficulty, "capability": self.capability}
        return spec

    def oracle(self) -> Policy:
        from ..domains.agents import scripted_policy

        return scripted_policy(self.task)  # type: ignore[arg-type]


__all__ = ["CapabilityEnv", "RequestOutcome", "Outcomes", "domain_parts", "DOMAIN_NAMES", "DIFFICULTIES"]
