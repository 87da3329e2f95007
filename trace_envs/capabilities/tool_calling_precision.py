"""``trace/tool_calling_precision-v1``: turn a fully specified request into one exact write call.

See :class:`ToolCallingPrecisionEnv`. The customer states every argument value; the env scores the
database after the agent's writes against the database after the gold write, with a penalty for
calls the tools reject.
"""

from __future__ import annotations

from typing import Any, Callable

from ..domains.db import Layer
from ..domains.task import CannotBuild, Call, Request, TauTask
from .base import CapabilityEnv

#: Difficulty tiers: the write tools whose arguments the agent must compose, simplest first.
AIRLINE_TIERS: dict[int, tuple[str, ...]] = {
    1: ("cancel", "compensation"),          # cancel_reservation(id) / send_certificate(user_id, amount)
    2: ("baggage",),                        # update_reservation_baggages: 2 ints + 2 ids
    3: ("flight_change", "cabin_change"),   # update_reservation_flights: enum + list of {flight_number, date}
    4: ("passenger_update",),               # update_reservation_passengers: list of {first_name, last_name, dob}
    5: ("booking",),                        # book_reservation: 11 arguments, three nested lists
}
RETAIL_TIERS: dict[int, tuple[str, ...]] = {
    1: ("cancel", "modify_payment"),        # (order_id, reason enum) / (order_id, payment_method_id)
    2: ("modify_address", "user_address"),  # 7 string fields, address2 possibly empty
    3: ("return",),                         # a list of item ids + a payment method
    4: ("modify_items", "exchange"),        # two parallel lists + a payment method
    5: ("multi_modify", "multi_exchange"),  # two parallel lists of 2-3 items each, in the user's order
}
#: Weight of the tier equal to the difficulty; the rest is spread over the lower tiers.
TOP_TIER_WEIGHT = 0.6
_CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}


def pick_tier(rng_u: float, rng_u2: float, difficulty: int) -> int:
    """The tier drawn for ``difficulty``: ``difficulty`` with probability 0.6, else a lower one uniformly."""
    if difficulty <= 1 or rng_u < TOP_TIER_WEIGHT:
        return difficulty
    return 1 + int(rng_u2 * (difficulty - 1))


def _fmt_amount(x: float) -> str:
    x = float(x)
    return f"{int(x)}" if x.is_integer() else f"{x:.2f}"


# ==================================================================== airline
def phrase_airline(call: Call) -> str:
    """What the user says to ask for exactly ``call`` (every argument value is stated)."""
    a = call.arguments
    if call.name == "cancel_reservation":
        return f"Please cancel reservation {a['reservation_id']}."
    if call.name == "send_certificate":
        return (f"My user id is {a['user_id']}. Please send a travel certificate worth "
                f"{_fmt_amount(a['amount'])} dollars to my profile.")
    if call.name == "update_reservation_baggages":
        return (f"For reservation {a['reservation_id']}, please set the checked bags to {a['total_baggages']} in "
                f"total, {a['nonfree_baggages']} of them paid (non-free), and use payment method {a['payment_id']}.")
    if call.name == "update_reservation_flights":
        flights = "; ".join(f"flight {f['flight_number']} on {f['date']}" for f in a["flights"])
        return (f"Please update reservation {a['reservation_id']} to {_CABIN_WORDS[a['cabin']]} cabin with exactly "
                f"these flights, in this order: {flights}. Use payment method {a['payment_id']} for any difference.")
    if call.name == "update_reservation_passengers":
        people = "; ".join(f"{i + 1}) {p['first_name']} {p['last_name']}, born {p['dob']}"
                           for i, p in enumerate(a["passengers"]))
        return f"Please set the passengers of reservation {a['reservation_id']} to exactly, in this order: {people}."
    if call.name == "book_reservation":
        flights = "; ".join(f"flight {f['flight_number']} on {f['date']}" for f in a["flights"])
        people = "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in a["passengers"])
        pays = " and ".join(f"{_fmt_amount(p['amount'])} dollars with {p['payment_id']}" for p in a["payment_methods"])
        trip = "one-way" if a["flight_type"] == "one_way" else "round-trip"
        return (f"My user id is {a['user_id']}. Please book a {trip} {_CABIN_WORDS[a['cabin']]} trip from "
                f"{a['origin']} to {a['destination']}: {flights}. Passengers, in this order: {people}. "
                f"{a['total_baggages']} checked bags in total, {a['nonfree_baggages']} of them paid; "
                f"{'with' if a['insurance'] == 'yes' else 'without'} travel insurance. Pay {pays}.")
    raise ValueError(f"no phrasing for {call.name}")


# ==================================================================== retail
def phrase_retail(call: Call) -> str:
    a = call.arguments
    if call.name == "cancel_pending_order":
        return f"Please cancel my order {a['order_id']}; the reason is '{a['reason']}'."
    if call.name == "modify_pending_order_payment":
        return f"Please switch the payment of my order {a['order_id']} to payment method {a['payment_method_id']}."
    if call.name in ("modify_pending_order_address", "modify_user_address"):
        line2 = f"address line 2 '{a['address2']}'" if a["address2"] else "no address line 2 (leave it empty)"
        where = (f"the shipping address of my order {a['order_id']}" if "order_id" in a
                 else "the default address on my account")
        return (f"Please change {where} to: address line 1 '{a['address1']}', {line2}, city '{a['city']}', "
                f"state '{a['state']}', country '{a['country']}', zip '{a['zip']}'.")
    if call.name == "return_delivered_order_items":
        items = ", ".join(a["item_ids"])
        return (f"Please return these items of my order {a['order_id']}: {items}, with the refund to payment "
                f"method {a['payment_method_id']}.")
    if call.name in ("modify_pending_order_items", "exchange_delivered_order_items"):
        verb = "exchange" if call.name.startswith("exchange") else "modify"
        pairs = "; ".join(f"item {old} for item {new}" for old, new in zip(a["item_ids"], a["new_item_ids"]))
        return (f"In my order {a['order_id']}, please {verb} {pairs}. Use payment method "
                f"{a['payment_method_id']} for the price difference.")
    raise ValueError(f"no phrasing for {call.name}")


def _multi_swap(b: Any, user: dict, exchange: bool) -> Request:
    """Change 2-3 items of one order (pending: modify; delivered: exchange) to other variants."""
    from ..domains.retail import tasks as R

    status = "delivered" if exchange else "pending"
    order = b.order(user, status, min_items=2, plant=0.5)
    n = min(len(order["items"]), b.d.between(2, 3))
    pool, picked = list(range(len(order["items"]))), []
    for _ in range(n):  # in the order the user names them
        i = b.d.choice(pool)
        pool.remove(i)
        picked.append(order["items"][i])
    olds, news, diff = [], [], 0.0
    for item in picked:
        target, _, _ = b.swap_target(item)
        olds.append(item["item_id"])
        news.append(target["item_id"])
        diff += target["price"] - item["price"]
    method = R._pay_choice(b, user, order, round(diff, 2))
    name = "exchange_delivered_order_items" if exchange else "modify_pending_order_items"
    call = Call(name, {"order_id": order["order_id"], "item_ids": olds, "new_item_ids": news,
                       "payment_method_id": method["id"]})
    reads = [Call("get_order_details", {"order_id": order["order_id"]})]
    return Request("multi_exchange" if exchange else "multi_modify", "", "act", reads=reads, write=call,
                   message=f"I will {'exchange' if exchange else 'modify'} items {', '.join(olds)} of order "
                           f"{order['order_id']} for items {', '.join(news)}, settling the difference with "
                           f"{method['id']}.",
                   done_message=f"Order {order['order_id']} is updated.")


# ==================================================================== the env
def _clean(request: Request, family: str, text: str | None) -> Request:
    """The request as a pure precision task: nothing to reason about, refuse or say.

    ``text``: the request stated in full (every value the write needs; nothing to look up, and short episodes
    for small models), or None to keep the target's own conversation (the request as the target's user says
    it, the details given when asked, the reads the write rests on).
    """
    if text is not None:
        request.text = text
        request.details = text
        request.reads = []
    request.kind = family
    request.communicate = []
    request.wrong_write = None
    request.wrong_message = None
    request.forbidden_write = None
    return request


def precision_penalty(rejected: int) -> float:
    """The factor for rejected write calls: 1.0 (none), 0.75 (one), 0.5 (two or more)."""
    return 1.0 if rejected <= 0 else 0.75 if rejected == 1 else 0.5


class ToolCallingPrecisionEnv(CapabilityEnv):
    """Compose one exact write call from a request that states every argument.

    ## Description
    The customer (airline or retail: ``domain``; None draws it per episode) asks for one change
    and states every value the write needs — ids, counts, amounts, dates, names, address fields,
    enum values in plain words ("basic economy", "one-way"), lists in a given order. Nothing needs
    to be looked up or decided: the policy allows the change, the record is named by id, there is
    one request. What is tested is turning the request into the right tool with exactly the right
    arguments: types (int vs string), nested objects (flights, passengers, payments), parallel
    lists in the user's order, empty optional strings, enum spelling. The database, tools, policy
    (system prompt) and scripted user are the target domain's (``trace/tau_airline-v0``,
    ``trace/tau_retail-v0``), so everything learnt transfers.

    With ``flow="target"`` the request reaches the agent as it does on the target instead: in the
    customer's words there (e.g. "I want to cancel my reservation", the id given when the agent asks,
    with the target's ``size.ask_details_prob``), and the write comes after the reads the target's
    gold path makes (the reservation's details). What is tested is then carrying a value exactly
    across the conversation and the records read into the write: the failure a small model shows
    on the target (an id read right, then garbled in the confirmation and the write). The request
    still names its record by id, the policy allows it, no write rests on reasoning (a request
    that would, e.g. "the cheapest economy flight", is drawn again) and the reward is the same.

    ## Difficulty
    ``difficulty`` (1-5, default 3) sets the tier of the write tool: the tier equal to the
    difficulty with probability 0.6, otherwise a lower tier uniformly.

    ====  ==============================================================  ===============================================
    tier  airline                                                         retail
    ====  ==============================================================  ===============================================
    1     ``cancel_reservation``, ``send_certificate`` (1-2 arguments)    ``cancel_pending_order`` (reason enum),
                                                                          ``modify_pending_order_payment``
    2     ``update_reservation_baggages`` (2 ints, 2 ids)                 ``modify_pending_order_address``,
                                                                          ``modify_user_address`` (7 strings, may be empty)
    3     ``update_reservation_flights`` (cabin enum, list of flights)    ``return_delivered_order_items`` (id list)
    4     ``update_reservation_passengers`` (list of passenger objects)   ``modify_pending_order_items``,
                                                                          ``exchange_delivered_order_items`` (1 item)
    5     ``book_reservation`` (11 arguments, three nested lists)         the same with 2-3 items in parallel lists
    ====  ==============================================================  ===============================================

    ## Action Space
    Text: the assistant's turn — a tool call (Hermes ``<tool_call>`` block, bare JSON or an OpenAI
    assistant message) or a message to the customer; one tool call per turn.

    ## Observation Space
    Text: policy, tool list and the customer's request after ``reset``; then tool results or the
    customer's replies. ``info["messages"]`` is the transcript (OpenAI format), ``info["tools"]``
    the target's tool schemas.

    ## Rewards
    0 until the end; then ``db × precision``: ``db`` is 1 when the database after the agent's
    writes equals the database after the gold write (canonical hash of every touched record, as on
    the target), else 0 — so a wrong value, a missing write or any extra write scores 0;
    ``precision`` is 1.0 with no rejected write call, 0.75 after one, 0.5 after two or more (a
    call the tool rejects for a wrong type, a missing field or an unknown id). From ``-v1`` the
    exact write counts only when the agent authenticated the customer first (the task's
    authentication reads, answered without an error): a write with no record read is a guess,
    however it turns out. ``reward_breakdown``: ``db``, ``exact`` (one successful call had exactly
    the gold effect), ``informed`` (made after the authentication), ``rejected_writes``,
    ``precision``, ``unrequested_writes``, ``tool``, ``tier``, ``success``.

    ## Shortcuts
    Behaviours this env defeats, and the most each scores (tests hold each over 500 seeds):

    * every policy that does not use the records — ending at once, ending politely, refusing,
      doing whatever is asked unread (the requested write with arguments taken from the customer's
      words), calling the first tool only, parroting the customer, repeating one read forever,
      saying "done", echoing the customer's ids — at most 0.05 at every difficulty, both domains
      (0.000 measured; on ``-v0`` the unread write earned 0.10–0.20);

    * refusing, or answering without writing (any "safe" non-action): 0;
    * writing with sloppy arguments (wrong types, missing fields, wrong ids) and not fixing them —
      the ``tau:sloppy_arguments`` agent: 0;
    * writing with a guessed or near-miss argument (one value off: a count +1, an enum or two
      fields swapped, an item left out of a list): ≤ 0.05;
    * trial and error (a sloppy call first, then the right one once the tool complains): ≤ 0.75;
    * an extra write beyond the one requested: 0 when it goes through (the database differs),
      0.75 when the tool rejects it.

    The deficit agents for the other capabilities score 1.0 (no refusal, one request, no record to
    pick): the env isolates tool-calling precision.

    ## Episode End
    The customer ends the conversation (``user_stop``), a transfer ends it, ten failed turns in a
    row (``too_many_errors``) or three identical calls in a row (``repeated_calls``) end it;
    ``max_episode_steps`` (registry: 30) truncates.

    ## Arguments
    ``domain`` (``"airline"`` — the registry default, since a TRL tool set must be fixed —,
    ``"retail"``, or None: drawn per episode from the seed), ``difficulty`` (1-5), ``flow``
    (``"stated"``, the default, or ``"target"``: see the description),
    ``size``, ``db_seed``, ``user``, ``prompt`` — as for :class:`~trace_envs.capabilities.base.CapabilityEnv`.

    ## Version History
    * v1: the exact write counts only after the customer was authenticated.
    * v0: initial version.
    """

    capability = "tool_calling_precision"
    default_difficulty = 3
    #: How a request reaches the agent: ``stated`` (every value in the customer's words, no record to read) or
    #: ``target`` (as on the target: the details given when asked, the reads before the write).
    flows = ("stated", "target")

    def __init__(self, *args: Any, flow: str = "stated", **kwargs: Any):
        if flow not in self.flows:
            raise ValueError(f"flow must be one of {self.flows}, got {flow!r}")
        self.flow = flow
        super().__init__(*args, **kwargs)

    def _session_kwargs(self, difficulty: int) -> dict:
        return {"describe_prob": 0.0}  # records named by id: nothing to reason about

    def _build_task(self, session: Any, difficulty: int) -> TauTask:
        u = self.np_random.random(3)
        tier = pick_tier(float(u[0]), float(u[1]), difficulty)
        tiers = AIRLINE_TIERS if self.domain_name == "airline" else RETAIL_TIERS
        family = tiers[tier][int(u[2] * len(tiers[tier]))]
        if family.startswith("multi_"):
            state = session._snapshot()
            try:
                request = _multi_swap(session.b, self.db_user(session), exchange=family == "multi_exchange")
            except CannotBuild:
                session._restore(state)
                raise
        else:
            # In the target's flow a request keeps the target's words, so one whose write rests on reasoning
            # (the cheapest flight, the record a description fits) is drawn again: precision only.
            request = session.request(family, refuse=False,
                                      accept=lambda r: r.decision == "act" and r.write is not None
                                      and not (self.flow == "target" and r.needs_reasoning))
        phrase = phrase_airline if self.domain_name == "airline" else phrase_retail
        keep = self.flow == "target" and bool(request.text)  # a multi-item swap has no target phrasing
        _clean(request, family, None if keep else phrase(request.write))
        scenario = f"tcp:{family}" if self.flow == "stated" else f"tcp:{family}:target"
        task = session.task([request], scenario=scenario)
        task.reward_basis = ("DB",)
        task.task_id = f"{task.task_id}-t{tier}"
        if not _gold_applies(task, session.db, self.domain_name):
            raise CannotBuild("the gold write does not apply")
        return task

    @staticmethod
    def db_user(session: Any) -> dict:
        return session.db.get("users", session.user_id)

    def _score(self) -> tuple[float, dict]:
        db, _ = self.tau_evaluation()
        outcomes = self.request_outcomes()
        rejected = sum(1 for _, _, ok in outcomes.write_calls if not ok)
        factor = precision_penalty(rejected)
        write = self.skill_request.write
        informed = outcomes.requests[self.skill_index].informed
        reward = db * factor if self.version == 0 or informed else 0.0
        return reward, {"db": float(db), "exact": float(outcomes.requests[self.skill_index].exact),
                        "informed": informed, "success": reward >= 1.0,
                        "rejected_writes": rejected, "precision": factor,
                        "unrequested_writes": len(outcomes.unrequested),
                        "tool": write.name if write else None, "tier": self._tier()}

    def _tier(self) -> int | None:
        tid = self.task.task_id if self.task else ""
        return int(tid.rsplit("-t", 1)[1]) if "-t" in tid and tid.rsplit("-t", 1)[1].isdigit() else None

    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info["tier"] = self._tier()
        return info


def _gold_applies(task: TauTask, db: Layer, domain: str) -> bool:
    """Whether the gold write succeeds on the task's initial state and changes it."""
    from ..core.tools import ToolSet

    scratch = db.child()
    tools = ToolSet(_toolkit(domain)(scratch))
    for call in task.gold_writes:
        if not tools.call(call.name, call.arguments).ok:
            return False
    return bool(scratch.changes)


def _toolkit(domain: str) -> Callable[[Layer], Any]:
    if domain == "airline":
        from ..domains.airline.tools import AirlineTools

        return AirlineTools
    from ..domains.retail.tools import RetailTools

    return RetailTools


__all__ = ["ToolCallingPrecisionEnv", "AIRLINE_TIERS", "RETAIL_TIERS", "phrase_airline", "phrase_retail",
           "precision_penalty"]
