"""``trace/precondition_verification-v1``: check the policy's preconditions before a write.

Capability env of the τ² targets (both domains). Each episode is one customer request that the
tools would carry out either way; whether the policy allows it depends on records the agent must
read (booking time, cabin, insurance, flight status, membership, who owns an order, the order's
history). Half of the requests must be refused, the other half carried out (``-v0``: 60% refused),
and the allowed and forbidden variants of a family read alike — so neither "always refuse" nor
"always do it" pays more than the half its fixed decision fits, and nothing pays without reading.
"""

from __future__ import annotations

import re

from ..domains.task import CannotBuild, Request, RequestSession, TauTask
from .base import CapabilityEnv

#: Families whose refusal the tools would *not* enforce (a ``forbidden_write`` exists), by difficulty.
AIRLINE_POOLS = {1: ("flight_change", "baggage"), 2: ("flight_change", "baggage", "compensation"),
                 3: ("flight_change", "baggage", "compensation", "cancel")}
RETAIL_POOLS = {1: ("cancel", "user_address"), 2: ("cancel", "user_address", "modify_address", "return",
                                                   "modify_payment"),
                3: ("cancel", "user_address", "modify_address", "return", "modify_payment", "modify_items",
                    "exchange")}
#: Share of episodes whose request must be refused, by version: balanced from v1, so that a fixed decision
#: is worth 0.5 of the episodes, not 0.6.
REFUSE_SHARE = {0: 0.6, 1: 0.5}
#: Share of refusals whose text carries a false claim of eligibility, by difficulty.
CLAIM_SHARE = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.5, 5: 1.0}
#: v0 only: reward for calling the requested write tool on an allowed request (the decision), before exactness.
DECISION_CREDIT = 0.75
#: v0 only: reward for refusing without stating the reason the policy gives — read or not, which is what
#: GRPO learned first: an adapter that ends every conversation at once earned it on 131 of 200 episodes.
SILENT_REFUSAL_CREDIT = 0.5
#: v1: reward for a refusal after reading the deciding record that does not state the policy's reason.
UNEXPLAINED_REFUSAL_CREDIT = 0.5

_RELATIONS = ("wife", "husband", "sister", "brother", "mother", "father", "roommate", "colleague", "neighbour")


def _retail_claim(r: Request) -> str | None:
    """The request reworded so that the customer claims the other person's order or account as their own."""
    text = r.text
    for rel in _RELATIONS:
        text = text.replace(f"my {rel}'s order", "my order").replace(f"my {rel}'s default address",
                                                                       "my default address")
        text = re.sub(rf"^My {rel} asked me to switch the payment of their order", "Please switch the payment of my "
                      "order", text)
    text = (text.replace("They asked me to, because", "I need to, because").replace(" to their ", " to my ")
            .replace("Their user id is", "My user id is").replace("Could you also update", "Could you update"))
    if text == r.text or any(rel in text for rel in _RELATIONS) or "their" in text.lower():
        return None
    return text


def _airline_claim(r: Request, pick: int) -> str | None:
    """The request with a false claim that the policy allows it (the records say otherwise)."""
    rid = str((r.forbidden_write.arguments if r.forbidden_write else {}).get("reservation_id", ""))
    claims = {
        "cancel": ("I booked it just yesterday, so it's within 24 hours and cancellation is free.",
                   "The airline cancelled one of my flights, so I'm entitled to cancel."),
        "flight_change": ("It's a regular economy ticket, so changes are allowed.",),
        "baggage": ("The agent at the airport told me bags can be removed any time before the flight.",),
    }.get(r.kind)
    if not claims or not rid:
        return None
    claim = claims[pick % len(claims)]
    return f"{r.text} {claim}"


class PreconditionVerificationEnv(CapabilityEnv):
    """Decide from the records whether the policy allows what the customer asks, then act or refuse.

    ## Description
    A τ² customer-service episode (airline or retail: the domain's generated DB, tools, policy
    and scripted customer) with exactly one request. The request comes from a family whose
    refusal the tools do not enforce: an airline cancellation (allowed only if booked < 24 h ago,
    the airline cancelled a flight, business class, or insured with a covered reason), a change
    to a basic-economy flight, removing checked bags, compensation (membership, cabin, insurance
    and the flight's real status); a retail change to an order or account that is not the
    customer's, or to an order whose items were already modified. Records are always named by
    id, so no structured-data reasoning is needed to find them, and one request means no
    multi-step bookkeeping: the episode isolates *checking before writing*.

    ## Action Space
    Text: a tool call (Hermes ``<tool_call>``, bare JSON or an OpenAI message) or a message to the
    customer; the target's tool schemas, one call per turn.

    ## Observation Space
    Text: policy, tools and the customer's opening message, then tool results and replies;
    ``info["messages"]`` (OpenAI format) and ``info["tools"]``.

    ## Rewards
    0 until the end. For a request that must be **refused**: 0 if the agent called any write tool;
    0 unless it read the record that decides the request (the request's gold reads, e.g. the
    reservation, the flight's status, the order; the customer's account for account changes:
    each call made with the same arguments and answered without an error) and then wrote to the
    customer; then 1.0 if its messages state the policy's reason (the request's facts, e.g.
    "cannot be cancelled", "basic economy", the foreign order id), else 0.5. For an **allowed**
    request: 1.0 if a successful call, made after reading the deciding record, has the gold
    write's effect on the database, the required facts were said and no other write succeeded;
    else 0 — attempting the write, a guessed write and a polite ending earn nothing.
    ``reward_breakdown`` has ``decision`` (act/refuse), ``family``, ``evidence`` (the record was
    read), ``informed`` (read before deciding), ``forbidden_write``, ``attempted``, ``exact``,
    ``communicated``, ``missing``, ``unrequested_writes`` and ``success``.

    ``-v0`` (``version=0``) paid 0.5 for any refusal without its reason, read or not, and 0.75 for
    calling the requested write tool on an allowed request, and refused 60% of the requests.

    ## Shortcuts (measured over 500 seeds at every difficulty, both domains, in the tests)
    Policies that never use the records — ending at once, ending politely without reading,
    refusing everything unread, doing whatever is asked unread, calling the first tool only,
    parroting the customer, repeating one read forever, saying "done", echoing the customer's ids
    — each score 0.000 (the tests bound them at 0.05). Policies that read and then ignore what they
    read: reading, then always refusing, scores ≤ 0.5 (the must-refuse half; measured 0.25–0.5
    with and without the reason); reading, then always doing it, ≤ 0.5 (the allowed half).
    Known shortcut (retail only): reading once, then restating every id and number heard and saying
    goodbye (``probe:read_then_echo``) *solves* 0.24 (difficulty 1) to 0.38 (3-5) of the retail tasks,
    because a refusal there succeeds after one read with any message (airline: 0.00, mean 0.12-0.26).
    Fixing it changes the reward: a ``-v2``, not an edit of this version.
    Agents lacking other capabilities stay high: ``tau:stop_after_first`` and ``tau:wrong_record``
    score 1.0.

    ## Episode End
    The customer ends the conversation (``###STOP###``), a transfer, ten invalid turns in a row,
    three identical tool calls in a row, or truncation by ``max_episode_steps`` (registry: 30).

    ## Arguments
    ``domain`` ("airline", "retail", or None: drawn per episode), ``difficulty`` (1–5, default 3):
    1 = single-rule families (airline basic-economy changes and bag removal; retail requests about
    a relative's order or account, stated as such); 2 = adds compensation eligibility (airline) and
    address, return and payment changes (retail); 3 = adds airline cancellation (four alternative
    grounds to check) and retail item changes and exchanges; 4 = half of the refusals come with a
    false claim of eligibility ("I booked it yesterday", "it's an economy ticket", or the customer
    calls another person's order "my order"); 5 = every refusal does. Also ``size``, ``db_seed``,
    ``user``, ``prompt`` as for the targets.

    ## Version History
    * v1: credit only for decisions taken on the records (see Rewards); refusals 50%.
    * v0: initial version.
    """

    capability = "precondition_verification"
    default_difficulty = 3

    def _session_kwargs(self, difficulty: int) -> dict:
        return {"describe_prob": 0.0}

    def _pool(self, difficulty: int) -> tuple[str, ...]:
        pools = AIRLINE_POOLS if self.domain_name == "airline" else RETAIL_POOLS
        return pools[min(difficulty, 3)]

    def _generate_task(self, options: dict) -> str:
        self._refuse = None  # v1 draws the decision once per episode (see _build_task)
        return super()._generate_task(options)

    def _build_task(self, session: RequestSession, difficulty: int) -> TauTask:
        rng = self.np_random
        family = self._pool(difficulty)[int(rng.integers(len(self._pool(difficulty))))]
        if self.version == 0:
            refuse = bool(rng.random() < REFUSE_SHARE[0])
        else:
            # Once per episode, kept across build attempts: an allowed request fails to build more often than
            # a refusal, and a decision redrawn per attempt drifted to 54% refusals on airline.
            if getattr(self, "_refuse", None) is None:
                self._refuse = bool(rng.random() < REFUSE_SHARE[1])
            refuse = self._refuse
        if refuse:
            r = session.request(family, refuse=True, accept=lambda q: q.forbidden_write is not None)
            if rng.random() < CLAIM_SHARE[difficulty]:
                # Refusals without a claimable rewording (e.g. an order whose items changed) stay as they are.
                claim = _airline_claim(r, int(rng.integers(2))) if self.domain_name == "airline" else _retail_claim(r)
                if claim is not None:
                    r.text = claim
        else:
            r = session.request(family, refuse=False, accept=lambda q: q.write is not None and not q.needs_reasoning)
        task = session.task([r], scenario=f"precondition:{family}:{'refuse' if refuse else 'act'}")
        if refuse and not task.requests[0].communicate:
            raise CannotBuild("a refusal needs a reason to state")
        return task

    def _score(self) -> tuple[float, dict]:
        outcomes = self.request_outcomes()
        o = outcomes.requests[self.skill_index]
        breakdown = {"decision": o.decision, "family": o.kind, "forbidden_write": o.forbidden,
                     "attempted": o.attempted, "exact": o.exact, "communicated": o.communicated,
                     "missing": o.missing, "unrequested_writes": len(outcomes.unrequested),
                     "evidence": o.evidence, "informed": o.informed}
        reward = self._score_v0(o, outcomes) if self.version == 0 else self._score_v1(o, outcomes)
        breakdown["success"] = reward >= 1.0
        return reward, breakdown

    @staticmethod
    def _score_v1(o, outcomes) -> float:
        if o.decision == "refuse":
            if outcomes.write_calls or not o.refused_informed:
                return 0.0
            return 1.0 if o.communicated else UNEXPLAINED_REFUSAL_CREDIT
        ok = o.exact and o.informed and o.communicated and not outcomes.unrequested
        return 1.0 if ok else 0.0

    @staticmethod
    def _score_v0(o, outcomes) -> float:
        if o.decision == "refuse":
            if o.forbidden or outcomes.write_calls:
                return 0.0
            return 1.0 if o.communicated else SILENT_REFUSAL_CREDIT
        if not o.attempted:
            return 0.0
        if o.exact and o.communicated and not outcomes.unrequested:
            return 1.0
        return DECISION_CREDIT

    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info["decision"] = self.skill_request.decision
        return info
