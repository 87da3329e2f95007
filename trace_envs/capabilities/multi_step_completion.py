"""``trace/multi_step_completion-v1``: carry every one of several requests through to the end.

Capability env of the τ² targets (both domains). The customer arrives with a list of two to
five requests (writes and questions, all allowed by the policy, each on its own record named by
id) and states them all in the opening message; the agent must handle each one — read, confirm,
write or answer — and not stop after the first.
"""

from __future__ import annotations

from ..domains.task import CannotBuild, RequestSession, TauTask
from .base import CapabilityEnv

#: Number of requests per episode, (low, high) inclusive, by difficulty.
REQUESTS = {1: (2, 2), 2: (2, 3), 3: (3, 3), 4: (3, 4), 5: (4, 5)}
#: v0 only: credit for a write request whose tool was called but whose effect is not the gold one.
ATTEMPT_CREDIT = 0.75
#: Deducted from the reward per successful write that no request asked for.
UNREQUESTED_PENALTY = 0.25
_ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth")


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text else text


class MultiStepCompletionEnv(CapabilityEnv):
    """Handle all of a customer's requests, not just the first.

    ## Description
    A τ² customer-service episode (airline or retail: the domain's generated DB, tools, policy
    and scripted customer) with 2–5 requests drawn from all of the domain's families (airline:
    cancellations, flight and cabin changes, bags, bookings, passenger updates, compensation,
    flight status, questions; retail: cancellations, item, address and payment changes, returns,
    exchanges, the default address, questions). Every request is allowed by the policy (no
    refusals: that is precondition verification) and names its record by id (no look-alike
    records: that is structured data reasoning). The customer lists all requests in the opening
    message, and raises the next one again whenever the agent asks whether there is anything else.

    ## Action Space
    Text: a tool call (Hermes ``<tool_call>``, bare JSON or an OpenAI message) or a message to the
    customer; the target's tool schemas, one call per turn.

    ## Observation Space
    Text: policy, tools and the customer's opening message, then tool results and replies;
    ``info["messages"]`` (OpenAI format) and ``info["tools"]``.

    ## Rewards
    0 until the end; then the mean over requests of each request's credit, minus 0.25 per
    successful write that no request asked for (floored at 0). A write request earns 1.0 when a
    successful call, made after reading the request's record (its gold reads, answered without an
    error), has the gold write's effect on the database and its facts were said; a question earns
    1.0 when its facts (the status, the amount, ...) appear in the agent's messages after the
    record was read; anything else earns 0. ``reward_breakdown``: ``per_request`` credits,
    ``completed`` (count at 1.0), ``n_requests``, ``unrequested_writes``, ``uninformed`` (requests
    done right but without reading first) and ``success`` (every request completed).

    ``-v0`` (``version=0``) gave 0.75 for calling a write request's tool whatever its effect, and
    credited a write or an answer whether or not the record had been read.

    ## Shortcuts (measured over 500 seeds at every difficulty, both domains, in the tests)
    Policies that never use the records — ending at once, ending politely, refusing everything,
    doing whatever is asked unread (each requested write with arguments guessed from the
    conversation), calling the first tool only, parroting the customer, repeating one read
    forever, saying "done", echoing the customer's ids — each score at most 0.05 (0.000 measured).
    Stopping after the first request (= ``tau:stop_after_first``) scores 1/k of k requests (1/3
    at the default difficulty); extra writes nobody asked for cost 0.25 each.
    Agents lacking other capabilities stay high: ``tau:skip_precondition`` and ``tau:wrong_record``
    score 1.0.

    ## Episode End
    The customer ends the conversation after the last request (``###STOP###``), a transfer, ten
    invalid turns in a row, three identical tool calls in a row, or truncation by
    ``max_episode_steps`` (registry: 60).

    ## Arguments
    ``domain`` ("airline", "retail", or None: drawn per episode), ``difficulty`` (1–5, default 3):
    the number of requests — 1: 2; 2: 2–3; 3: 3; 4: 3–4; 5: 4–5. Also ``size``, ``db_seed``,
    ``user``, ``prompt`` as for the targets.

    ## Version History
    * v1: credit only for requests done on the records they rest on, no attempt credit (see Rewards).
    * v0: initial version.
    """

    capability = "multi_step_completion"
    supports_lead_in = False  # the opening lists every request
    default_difficulty = 3

    def _session_kwargs(self, difficulty: int) -> dict:
        return {"describe_prob": 0.0}

    def _build_task(self, session: RequestSession, difficulty: int) -> TauTask:
        rng = self.np_random
        lo, hi = REQUESTS[difficulty]
        n = int(rng.integers(lo, hi + 1))
        families = list(session.families)
        requests = []
        for _ in range(n):
            family = families[int(rng.integers(len(families)))]
            requests.append(session.request(
                family, refuse=False,
                accept=lambda q: not q.needs_reasoning and (q.write is not None or bool(q.communicate))))
        listed = " ".join(f"{_ORDINALS[i]}, {_lower_first(r.text)}" for i, r in enumerate(requests))
        greeting = ("Hi! I have a few things to sort out today." if n > 2 else "Hi! I have two things to sort out.")
        task = session.task(requests, scenario="multi_step:" + "+".join(r.kind for r in requests),
                            opening=f"{greeting} {listed}")
        # Every request must be checkable: a write, or a question with a fact left after the domain's checks.
        if any(r.write is None and not r.communicate for r in task.requests):
            raise CannotBuild("a question whose answer is already said elsewhere")
        # ... and no question may be answered by what the agent says for another request.
        said = [f"{r.message} {r.done_message}".lower().replace(",", "") for r in task.requests]
        for i, r in enumerate(task.requests):
            others = " ".join(t for j, t in enumerate(said) if j != i)
            if r.write is None and all(f.lower().replace(",", "") in others for f in r.communicate):
                raise CannotBuild("a question answered by another request's messages")
        return task

    def _score(self) -> tuple[float, dict]:
        outcomes = self.request_outcomes()
        credits, uninformed = [], 0
        for o, r in zip(outcomes.requests, self.task.requests):  # type: ignore[union-attr]
            if r.decision == "act" and r.write is not None:
                done = o.exact and o.communicated
                partial = ATTEMPT_CREDIT if o.attempted and self.version == 0 else 0.0
            else:
                done, partial = o.communicated, 0.0
            if done and self.version >= 1 and not o.informed:
                done, uninformed = False, uninformed + 1
            credits.append(1.0 if done else partial)
        mean = sum(credits) / len(credits)
        reward = max(0.0, mean - UNREQUESTED_PENALTY * len(outcomes.unrequested))
        return reward, {"per_request": credits, "completed": sum(c == 1.0 for c in credits),
                        "n_requests": len(credits), "unrequested_writes": len(outcomes.unrequested),
                        "missing": [f for o in outcomes.requests for f in o.missing],
                        "uninformed": uninformed, "success": reward >= 1.0}

    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info["families"] = [r.kind for r in self.task.requests]
        return info
