"""``trace/multi_step_completion-v0``: carry every one of several requests through to the end.

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
#: Credit for a write request whose tool was called but whose effect is not the gold one.
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
    successful call has the gold write's effect on the database and its facts were said, 0.75
    when its write tool was called but the effect differs (or facts are missing); a question
    earns 1.0 when its facts (the status, the amount, ...) appear in the agent's messages.
    ``reward_breakdown``: ``per_request`` credits, ``completed`` (count at 1.0), ``n_requests``,
    ``unrequested_writes``.

    ## Shortcuts (bounds checked over 500 seeds at the default difficulty, 3 requests, in the tests)
    * stopping after the first request (= ``tau:stop_after_first``): exactly 1/3 (at most 1/k);
    * ending at once with a polite message: 0;
    * writing each requested tool with guessed arguments without reading: at most 0.75 (measured
      ≈ 0.66: attempt credit on writes, no question answered);
    * extra writes nobody asked for: each successful one costs 0.25.
    Agents lacking other capabilities stay high: ``tau:skip_precondition`` and ``tau:wrong_record``
    score 1.0, ``tau:sloppy_arguments`` ≈ 0.8 (attempt credit on write requests).

    ## Episode End
    The customer ends the conversation after the last request (``###STOP###``), a transfer, ten
    invalid turns in a row, three identical tool calls in a row, or truncation by
    ``max_episode_steps`` (registry: 60).

    ## Arguments
    ``domain`` ("airline", "retail", or None: drawn per episode), ``difficulty`` (1–5, default 3):
    the number of requests — 1: 2; 2: 2–3; 3: 3; 4: 3–4; 5: 4–5. Also ``size``, ``db_seed``,
    ``user``, ``prompt`` as for the targets.

    ## Version History
    * v0: initial version.
    """

    capability = "multi_step_completion"
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
        credits = []
        for o, r in zip(outcomes.requests, self.task.requests):  # type: ignore[union-attr]
            if r.decision == "act" and r.write is not None:
                credit = 1.0 if o.exact and o.communicated else ATTEMPT_CREDIT if o.attempted else 0.0
            else:
                credit = 1.0 if o.communicated else 0.0
            credits.append(credit)
        mean = sum(credits) / len(credits)
        reward = max(0.0, mean - UNREQUESTED_PENALTY * len(outcomes.unrequested))
        return reward, {"per_request": credits, "completed": sum(c == 1.0 for c in credits),
                        "n_requests": len(credits), "unrequested_writes": len(outcomes.unrequested),
                        "missing": [f for o in outcomes.requests for f in o.missing]}

    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info["families"] = [r.kind for r in self.task.requests]
        return info
