"""``trace/structured_data_reasoning-v1``: find the right record among look-alikes and derive the right number.

Capability env of the τ² targets (both domains). The customer names a record by description
("my round trip from Denver leaving on 2024-05-17", "my order with the Desk Lamp") among several
look-alike records of the same account, and asks either a question whose answer must be read or
computed from that record (an amount paid, a free-bag allowance, the cost of extra bags or of an
upgrade, a tracking number, a refund, a price difference) or for a change whose exact target or
number comes from the data (the domains' request builders with a plausible wrong record or
misread number). The reward checks the stated facts against the data, penalises stating a
look-alike's value, and compares the database after the agent's writes with the gold one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..core.conversation import tool_calls_of
from ..core.tools import ToolSet
from ..domains.db import same_state
from ..domains.task import CannotBuild, Call, Request, RequestSession, TauTask, request_family
from .base import CapabilityEnv

#: Look-alike records planted next to the target, by difficulty.
LOOKALIKES = {1: 1, 2: 2, 3: 2, 4: 3, 5: 4}
#: Question kinds by difficulty (cumulative: each level adds a deeper computation).
AIRLINE_QUESTIONS = {1: ("paid", "flight_status"), 2: ("paid", "allowance", "flight_status"),
                     3: ("paid", "allowance", "extra_bags"),
                     4: ("paid", "allowance", "extra_bags", "upgrade"),
                     5: ("allowance", "extra_bags", "upgrade")}
RETAIL_QUESTIONS = {1: ("paid",), 2: ("paid", "tracking"), 3: ("paid", "tracking", "refund"),
                    4: ("paid", "tracking", "refund", "exchange_diff"), 5: ("tracking", "refund", "exchange_diff")}
#: Write families whose gold write depends on picking the right record or number (wrong_write exists).
AIRLINE_WRITES = ("cancel", "flight_change", "cabin_change", "baggage", "booking", "compensation", "passenger_update")
RETAIL_WRITES = ("cancel", "modify_address", "modify_payment", "return", "exchange", "modify_items", "user_address")
#: Share of episodes that are write requests (the rest are questions).
WRITE_SHARE = 0.35
#: v0 only: credit for a write request whose write tool was called on the right data but every call was rejected.
REJECTED_CREDIT = 0.5


def _norm(text: str) -> str:
    return text.lower().replace(",", "")


def stated(fact: str, text: str) -> bool:
    """Whether ``fact`` appears in ``text`` as a whole value (``$50`` is not stated by ``$500`` or ``$50.25``).

    Case-insensitive, commas removed (as τ²-bench's communicate check).
    """
    pattern = r"(?<![\w.])" + re.escape(_norm(fact)) + r"(?!\d|\.\d)"
    return re.search(pattern, _norm(text)) is not None


def _said(messages: list[dict]) -> str:
    """Everything the agent said to the user."""
    return " ".join(m.get("content") or "" for m in messages if m.get("role") == "assistant" and not m.get("tool_calls"))


def _money_airline(x: float) -> str:
    x = float(x)
    return f"${int(x)}" if x.is_integer() else f"${x:.2f}"


def _money_retail(x: float) -> str:
    return f"{x:.2f}"


# ==================================================================== airline questions
def _airline_question(session: Any, kind: str, n_look: int) -> tuple[Request, list[str]]:
    """A question about one of ``n_look + 1`` look-alike reservations, named by description."""
    from ..domains.airline.db import CABINS, EXTRA_BAG_PRICE, free_bags
    from ..domains.airline.tasks import Retry

    g = session.g
    d = g.d
    future = g.idx["future"]
    round_trip = d.chance(0.4)
    if round_trip:
        if len(future) < 2:
            raise CannotBuild("no two future days")
        i = d.int(0, len(future) - 2)
        days: tuple[str, ...] = (future[i], future[min(len(future) - 1, i + d.int(1, 3))])
    else:
        days = (d.pick(future),)
    position = d.int(0, n_look)
    membership = g.user["membership"]
    cabins = ("basic_economy", "economy") if kind == "upgrade" else CABINS
    records: list[dict] = []
    target: dict | None = None
    for j in range(n_look + 1):
        is_target = j == position
        record = None
        for attempt in range(4):
            origin_routes = None
            if records and attempt == 0:  # same origin as a record already planted: looks more alike
                origin = records[0]["origin"]
                origin_routes = {rt for rt in g.idx["routes"] if rt[0] != origin}
            try:
                record = g.plant(round_trip=round_trip, days=days if (is_target or attempt < 3) else None,
                                 pax=d.int(2, 3) if kind != "paid" else d.int(1, 3), cabin=d.pick(cabins),
                                 avoid=origin_routes)
                break
            except Retry:
                continue
        if record is None:
            raise CannotBuild("could not plant a look-alike reservation")
        records.append(record)
        if is_target:
            target = record
    assert target is not None
    others = [r for r in records if r is not target]
    rid = target["reservation_id"]
    phrase = g.describe(target)
    reads = [Call("get_reservation_details", {"reservation_id": x}) for x in g.user["reservations"]]
    extra_reads: list[Call] = []
    misreads: list[str] = []
    fmt = _money_airline

    if kind == "paid":
        def value(r: dict) -> str:
            return fmt(sum(p["amount"] for p in r["payment_history"]))

        question = f"How much did I pay in total for {phrase}? I don't have the reservation id at hand."
        answer = value(target)
        message = f"For reservation {rid} ({phrase[3:]}) you paid {answer} in total."
        per_pax = sum(s["price"] for s in target["flights"])
        misreads.append(fmt(per_pax))
    elif kind == "allowance":
        def allowance(r: dict) -> int:
            return free_bags(membership, r["cabin"]) * len(r["passengers"])

        def value(r: dict) -> str:
            return f"{allowance(r)} free checked bag"

        per = free_bags(membership, target["cabin"])
        if per == 0:
            raise CannotBuild("no free bags: a guessable zero")
        question = f"How many checked bags can we bring for free on {phrase}? I don't have the reservation id."
        answer = value(target)
        pax = len(target["passengers"])
        message = (f"Reservation {rid} ({phrase[3:]}) is in {target['cabin'].replace('_', ' ')} with "
                   f"{pax} passengers; as a {membership} member each passenger gets {per}, so it includes "
                   f"{allowance(target)} free checked bags in total.")
        misreads.append(f"{per} free checked bag")
    elif kind == "extra_bags":
        add = d.int(1, 3)

        def cost(r: dict, per_pax_only: bool = False) -> int:
            allow = free_bags(membership, r["cabin"]) * (1 if per_pax_only else len(r["passengers"]))
            total = r["total_baggages"] + add
            return EXTRA_BAG_PRICE * (max(r["nonfree_baggages"], total - allow) - r["nonfree_baggages"])

        def value(r: dict) -> str:
            return fmt(cost(r))

        if cost(target) == 0:
            add = free_bags(membership, target["cabin"]) * len(target["passengers"]) - target["total_baggages"] \
                + d.int(1, 2)
        if cost(target) <= 0 or add < 1:
            raise CannotBuild("no extra cost")
        question = (f"How much would it cost to add {add} checked bag{'s' if add > 1 else ''} to {phrase}? "
                    f"I don't have the reservation id at hand.")
        answer = value(target)
        allow = free_bags(membership, target["cabin"]) * len(target["passengers"])
        paid_bags = cost(target) // EXTRA_BAG_PRICE
        message = (f"Reservation {rid} ({phrase[3:]}) has {target['total_baggages']} checked bags and "
                   f"{allow} free for its passengers; with {add} more, {paid_bags} would be paid at "
                   f"{EXTRA_BAG_PRICE} dollars each: {answer} in total.")
        misreads.append(fmt(cost(target, per_pax_only=True)))
        misreads.append(fmt(EXTRA_BAG_PRICE * add))
    elif kind == "upgrade":
        def diff(r: dict, per_pax_only: bool = False) -> int:
            new = "business"
            delta = sum(g.status(s["flight_number"], s["date"])["prices"][new] - s["price"] for s in r["flights"])
            return delta * (1 if per_pax_only else len(r["passengers"]))

        def value(r: dict) -> str:
            return fmt(diff(r))

        question = (f"How much more would it cost in total to move {phrase} up to business class? Just the "
                    f"price for now; I don't have the reservation id at hand.")
        answer = value(target)
        extra_reads = [Call("search_direct_flight", {"origin": s["origin"], "destination": s["destination"],
                                                     "date": s["date"]}) for s in target["flights"]]
        message = (f"Moving reservation {rid} ({phrase[3:]}) from {target['cabin'].replace('_', ' ')} to "
                   f"business for its {len(target['passengers'])} passengers would cost {answer} more in total.")
        misreads.append(fmt(diff(target, per_pax_only=True)))
    else:  # pragma: no cover - the pools above list every kind
        raise ValueError(kind)
    look_values = [value(r) for r in others]
    lookalike_facts = sorted({v for v in look_values + misreads if v != answer and not v.startswith("$0")
                              and not v.startswith("0 ")})
    wrong = next((v for v in look_values if v in lookalike_facts), None)
    if wrong is None:
        raise CannotBuild("no look-alike with a different value")
    other = next(r for r in others if value(r) == wrong)
    request = Request("sdr_question", question, "answer", reads=reads + extra_reads, message=message,
                      communicate=[answer], details=f"It's {phrase}.",
                      wrong_message=f"For reservation {other['reservation_id']}: {wrong}.")
    return request, lookalike_facts


def _airline_status_question(session: Any) -> tuple[Request, list[str]]:
    """The status of a flight the customer names by number and date, read from ``get_flight_status``.

    The look-alike values are the other status words: an agent that does not read the tool's result
    answers with the status the date makes likely (a flight today is "flying" more often than
    "on time"), which is this question's misreading. The days are the target's own mix (about 70%
    today, 27% future, 4% past), and the answer counts only after the ``get_flight_status`` call it
    rests on. Future flights stay in although their status ("available") follows from the date: the
    call must name the day the customer asked about, and an env of today's flights alone taught a
    warmed-up adapter to ask about today whatever the day (25 of 100 target flight-status episodes lost
    that way; docs/environments.md).
    """
    from ..domains.airline.tasks import STATUS_WORDS

    request = session.request("flight_status")
    status = request.communicate[0]
    others = sorted(s for s in STATUS_WORDS if s != status)
    misread = others[int(session.g.d.int(0, len(others) - 1))]
    request.wrong_message = request.message.replace(STATUS_WORDS[status], STATUS_WORDS[misread])
    return request, others


# ==================================================================== retail questions
def _retail_question(session: Any, kind: str, n_look: int) -> tuple[Request, list[str]]:
    """A question about one of ``n_look + 1`` look-alike orders, named by an item only it contains."""
    b = session.b
    d = b.d
    uid = session.user_id
    status = {"paid": d.choice(("pending", "processed", "delivered")), "tracking": d.choice(("processed", "delivered")),
              "refund": "delivered", "exchange_diff": "delivered"}[kind]
    position = d.between(0, n_look)
    orders: list[dict] = []
    target: dict | None = None
    for j in range(n_look + 1):
        two = j == position and kind in ("refund", "exchange_diff")
        order = b.plant_order(b.user(uid), status, min_items=2 if two else 1)
        orders.append(order)
        if j == position:
            target = order
    assert target is not None
    user = b.user(uid)
    elsewhere = {i["name"] for oid in user["orders"] if oid != target["order_id"]
                 for i in b.db.get("orders", oid)["items"]}
    unique = [i["name"] for i in target["items"] if i["name"] not in elsewhere]
    if not unique:
        raise CannotBuild("no item names the order uniquely")
    named = d.choice(unique)
    asked = [i for i in target["items"] if i["name"] != named]
    asked_item = d.choice(asked) if asked else None
    if asked_item is None and kind in ("refund", "exchange_diff"):
        raise CannotBuild("no item to ask about besides the named one")
    # Look-alikes share items with the target (another variant of the asked-about product, or a copy of one
    # of its items), so only the named item tells the orders apart.
    for order in orders:
        if order is target or not asked or not d.bernoulli(0.7):
            continue
        product = b.db.get("products", asked_item["product_id"])
        variants = [v for v in product["variants"].values() if v["price"] != asked_item["price"]]
        if variants and d.bernoulli(0.7):
            v = d.choice(variants)
            item = {"name": product["name"], "product_id": product["product_id"], "item_id": v["item_id"],
                    "price": v["price"], "options": dict(v["options"])}
        else:
            item = dict(d.choice(asked))
        edit = b.db.edit("orders", order["order_id"])
        edit["items"][0] = item
        edit["payment_history"][0]["amount"] = round(sum(i["price"] for i in edit["items"]), 2)
        if edit["fulfillments"]:
            edit["fulfillments"][0]["item_ids"] = [i["item_id"] for i in edit["items"]]
    target = b.db.get("orders", target["order_id"])
    others = [b.db.get("orders", o["order_id"]) for o in orders if o["order_id"] != target["order_id"]]
    ref = f"my order with the {named}"
    oid = target["order_id"]
    reads = [Call("get_order_details", {"order_id": x}) for x in user["orders"]]
    extra_reads: list[Call] = []
    misreads: list[str] = []
    fmt = _money_retail

    if kind == "paid":
        def value(o: dict) -> str:
            return fmt(o["payment_history"][0]["amount"])

        question = f"How much did I pay for {ref}? I don't remember the order number."
        answer = value(target)
        message = f"Order {oid} (the one with the {named}) cost ${answer} in total."
    elif kind == "tracking":
        def value(o: dict) -> str:
            return o["fulfillments"][0]["tracking_id"][0]

        question = f"What is the tracking number of {ref}? I don't remember the order number."
        answer = value(target)
        message = f"The tracking number of order {oid} (the one with the {named}) is {answer}."
    elif kind == "refund":
        returned = asked_item

        def value(o: dict) -> str:
            return fmt(o["payment_history"][0]["amount"])  # a look-alike's value: its whole total

        answer = fmt(returned["price"])
        if answer == value(target):
            raise CannotBuild("the item is the whole order")
        question = (f"If I returned the {returned['name']} from {ref}, how much would I get back? I'm just "
                    f"asking for now, and I don't remember the order number.")
        message = (f"In order {oid} (the one with the {named}), the {returned['name']} (item {returned['item_id']}, "
                   f"{', '.join(f'{k} {v}' for k, v in returned['options'].items())}) cost ${answer}, so a return "
                   f"would refund ${answer}.")
        misreads.append(value(target))
        for o in others:  # the same-named item in a look-alike order may have another price
            misreads += [fmt(i["price"]) for i in o["items"] if i["name"] == returned["name"]]
    elif kind == "exchange_diff":
        item = asked_item
        new, described, near = b.swap_target(item)
        delta = round(new["price"] - item["price"], 2)
        if delta == 0:
            raise CannotBuild("no price difference")
        answer = fmt(abs(delta))

        def value(o: dict) -> str | None:  # a look-alike's value: the same exchange on its copy of the item
            same = [i for i in o["items"] if i["name"] == item["name"]]
            return fmt(abs(round(new["price"] - same[0]["price"], 2))) if same else None

        options = ", ".join(f"{k} {v}" for k, v in described.items())
        question = (f"In {ref}, what would the price difference be if I exchanged the {item['name']} for the "
                    f"{options} one? I'm just asking for now, and I don't remember the order number.")
        extra_reads = [Call("get_product_details", {"product_id": item["product_id"]})]
        direction = "more" if delta > 0 else "less"
        message = (f"In order {oid} (the one with the {named}), the {item['name']} (item {item['item_id']}) cost "
                   f"${fmt(item['price'])}; the {options} one (item {new['item_id']}) costs ${fmt(new['price'])}, "
                   f"so the difference is ${answer} ({direction}).")
        if near is not None:
            misreads.append(fmt(abs(round(near["price"] - item["price"], 2))))
    else:  # pragma: no cover
        raise ValueError(kind)
    look_values = [v for v in (value(o) for o in others) if v is not None]
    lookalike_facts = sorted({v for v in look_values + misreads if v != answer and v != "0.00"})
    wrong = next((v for v in look_values + misreads if v in lookalike_facts), None)
    if wrong is None:
        raise CannotBuild("no look-alike with a different value")
    request = Request("sdr_question", question, "answer", reads=reads + extra_reads, message=message,
                      communicate=[answer], details=f"It's {ref}.",
                      wrong_message=f"That order: {wrong}.")
    return request, lookalike_facts


# ==================================================================== the env
class StructuredDataReasoningEnv(CapabilityEnv):
    """Pick the right record among look-alikes and derive the right value from it.

    ## Description
    A τ² customer-service episode (airline or retail: the domain's generated DB, tools, policy
    and scripted customer) with one request. The customer names the record by description, never
    by id, and the account holds look-alike records: reservations of the same shape (same dates,
    often the same origin, other routes, cabins and party sizes) or orders with the same status
    that share items with the target, so only reading every record and matching the description
    finds the right one. The request is either

    * a **question** (65%) whose answer is read or computed from the target record — airline: the
      status of a flight named by number and date, today's or a past one (at difficulties 1 and 2:
      the status word ``get_flight_status`` returned, which must have been called; the look-alikes are
      the other status words), the total paid, the free checked-bag allowance (membership × cabin ×
      passengers), the cost of adding bags (allowance, bags already checked, $50 each), the total
      cost of an upgrade to business (fare per segment from a flight search, minus what was paid, × passengers); retail:
      the amount paid, the tracking number, the refund for returning one item, the price
      difference of an exchange to a described variant; or
    * a **change** (35%) drawn from the domain's request builders in their data-reasoning
      variants: the record named by description with a look-alike present, "the cheapest" or
      "the earliest" flight, a bag count that depends on the allowance, a compensation amount per
      passenger, an address copied from an order, which passenger to correct.

    Every request is allowed by the policy (no refusals: that is precondition verification) and
    there is one request (no multi-step bookkeeping).

    ## Action Space
    Text: a tool call (Hermes ``<tool_call>``, bare JSON or an OpenAI message) or a message to the
    customer; the target's tool schemas, one call per turn.

    ## Observation Space
    Text: policy, tools and the customer's opening message, then tool results and replies;
    ``info["messages"]`` (OpenAI format) and ``info["tools"]``.

    ## Rewards
    0 until the end. A value is *stated* when it appears in the agent's messages as a whole value
    (case-insensitive, commas removed; ``$50`` is not stated by ``$500``). The *evidence* is the
    described record's read (the call with the same arguments, answered without an error) and the
    non-record reads the answer rests on (a flight's status, a flight search, a product), not the
    look-alike records read while looking for it. A **question** scores 1.0 when the answer is
    stated in a message after the evidence, no look-alike value is stated (another record's amount,
    allowance, tracking number, or the value a typical misreading gives: per passenger instead of in
    total, the whole order instead of the returned item...) and nothing was written; else 0. A
    **change** scores 1.0 when one successful write, made after the evidence, has exactly the gold
    write's effect on the database, no other write succeeded, the look-alike write (the other
    record, the misread number) was never called, even if the tools rejected it, the request's
    facts are stated and no look-alike value is; else 0 — the wrong record written scores 0, and so
    does the right answer or write without the read. ``reward_breakdown``: ``kind``
    (question/change), ``family``, ``answer_stated``, ``missing``, ``lookalikes_stated``,
    ``exact``, ``attempted``, ``reads_done``, ``evidence``, ``successful_writes``,
    ``wrong_write_called``, ``unrequested_writes``, ``n_lookalikes``, ``success``.

    ``-v0`` (``version=0``) paid 0.5 when every write call was rejected but the agent had read the
    records, called the gold tool and stated the facts, and asked for the read before the answer only
    for flight-status questions.

    ## Shortcuts (measured over 500 seeds at every difficulty, both domains, in the tests)
    Policies that never use the records — ending at once, ending politely, refusing everything,
    doing whatever is asked unread, calling the first tool only, parroting the customer, repeating
    one read forever, saying "done", echoing the customer's ids and numbers, answering from the
    first observation — each score at most 0.05 (0.000 measured). Stating every candidate's value
    scores 0 on questions and writing every candidate record 0 on changes; picking a wrong record
    or misreading a number (= ``tau:wrong_record``) scores 0.
    Agents lacking other capabilities stay high: ``tau:skip_precondition`` and
    ``tau:stop_after_first`` score 1.0; ``tau:sloppy_arguments`` ≈ 0.6 (questions right, its
    writes rejected).

    ## Episode End
    The customer ends the conversation (``###STOP###``), a transfer, ten invalid turns in a row,
    three identical tool calls in a row, or truncation by ``max_episode_steps`` (registry: 30).

    ## Arguments
    ``domain`` ("airline", "retail", or None: drawn per episode), ``difficulty`` (1–5, default 3):
    the number of look-alike records (1, 2, 2, 3, 4) and the depth of the computation asked —
    1: amounts paid and, on airline, a flight's status (look-ups); 2: adds the free-bag allowance
    (airline) or the tracking number (retail); 3: adds the cost of extra bags / the refund of one
    returned item (the status question is gone from here on); 4: adds the upgrade
    cost (a flight search per segment) / the price difference of an exchange (a product look-up);
    5: the deeper kinds only, with four look-alikes. Changes plant the same number of extra
    records of the account before the request is drawn. Also ``size``, ``db_seed``, ``user``,
    ``prompt`` as for the targets.

    ## Version History
    * v1: credit only after the evidence is read; no credit for rejected writes (see Rewards).
    * v0: initial version.
    """

    capability = "structured_data_reasoning"
    default_difficulty = 3

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lookalike_facts: list[str] = []
        self.n_lookalikes = 0

    def _session_kwargs(self, difficulty: int) -> dict:
        return {"describe_prob": 1.0}  # records named by description, a look-alike present

    def _generate_task(self, options: dict) -> str:
        self._plan = None  # drawn once per episode, so that redraws keep the share of changes and kinds
        self.build_attempts = 0
        return super()._generate_task(options)

    def _replan(self) -> None:
        self._plan = None

    def _draw_plan(self, difficulty: int) -> tuple[str, str]:
        rng = self.np_random
        airline = self.domain_name == "airline"
        if rng.random() < WRITE_SHARE:
            families = AIRLINE_WRITES if airline else RETAIL_WRITES
            return "change", families[int(rng.integers(len(families)))]
        kinds = (AIRLINE_QUESTIONS if airline else RETAIL_QUESTIONS)[difficulty]
        return "question", kinds[int(rng.integers(len(kinds)))]

    # ------------------------------------------------------------------ generation
    def _build_task(self, session: RequestSession, difficulty: int) -> TauTask:
        n_look = LOOKALIKES[difficulty]
        airline = self.domain_name == "airline"
        if getattr(self, "_plan", None) is None:
            self._plan = self._draw_plan(difficulty)
        self.build_attempts = getattr(self, "build_attempts", 0) + 1
        what, kind = self._plan
        if what == "change":
            request, facts = self._change(session, n_look, airline, kind)
        else:
            if kind == "flight_status":
                request, facts = _airline_status_question(session)
            else:
                build = _airline_question if airline else _retail_question
                request, facts = build(session, kind, n_look)
            request.kind = f"sdr_question:{kind}"
        task = session.task([request], scenario=f"sdr:{request.kind}")
        self._check(task, facts)
        self.lookalike_facts = facts
        self.n_lookalikes = n_look
        return task

    def _change(self, session: Any, n_look: int, airline: bool, family: str) -> tuple[Request, list[str]]:
        """A write request in its data-reasoning variant, with ``n_look`` extra records of the account planted."""
        for _ in range(n_look):  # more records to read through
            if airline:
                try:
                    session.g.plant()
                except CannotBuild:
                    pass
            else:
                b = session.b
                b.plant_order(b.user(session.user_id), b.d.choice(("pending", "delivered", "processed")))
        request = session.request(family, refuse=False, accept=lambda q: q.decision == "act" and q.write is not None
                                  and q.wrong_write is not None)
        # The misreading must be a write the tools accept and that differs from the gold one.
        scratch_gold, scratch_wrong = session.db.child(), session.db.child()
        toolkit = self.domain.toolkit_cls
        if not ToolSet(toolkit(scratch_gold)).call(request.write.name, request.write.arguments).ok:
            raise CannotBuild("the gold write fails")
        if not ToolSet(toolkit(scratch_wrong)).call(request.wrong_write.name, request.wrong_write.arguments).ok:
            raise CannotBuild("the wrong write is rejected (it would not show the reasoning error)")
        if same_state(scratch_gold, scratch_wrong)[0]:
            raise CannotBuild("the wrong write has the gold effect")
        request.forbidden_write = None
        request.wrong_message = None
        request.kind = f"sdr_change:{family}"
        return request, []

    def _check(self, task: TauTask, facts: list[str]) -> None:
        """The oracle states every fact and no look-alike value; the wrong-record agent misses a question."""
        from ..domains.agents import plan_turns

        r = task.requests[0]
        oracle = " ".join(t for t in plan_turns(task) if isinstance(t, str))
        if not all(stated(f, oracle) for f in r.communicate) or any(stated(f, oracle) for f in facts):
            raise CannotBuild("the oracle's messages would state a look-alike value or miss a fact")
        if r.decision == "answer":
            wrong = " ".join(t for t in plan_turns(task, ("structured_data_reasoning",)) if isinstance(t, str))
            if all(stated(f, wrong) for f in r.communicate):
                raise CannotBuild("the wrong-record answer would state the right value")

    # ------------------------------------------------------------------ scoring
    def _score(self) -> tuple[float, dict]:
        r = self.skill_request
        outcomes = self.request_outcomes()
        o = outcomes.requests[self.skill_index]
        said = _said(self._messages)
        missing = [f for f in r.communicate if not stated(f, said)]
        lookalikes = [f for f in self.lookalike_facts if stated(f, said)]
        successful = [(n, a) for n, a, ok in outcomes.write_calls if ok]
        called = {(n, json.dumps(a, sort_keys=True, default=str)) for n, a, _ in tool_calls_of(self._messages)}
        reads_done = all((c.name, json.dumps(c.arguments, sort_keys=True, default=str)) in called for c in r.reads)
        events = self._events()
        evidence_at = self._evidence_at(events, self.evidence_calls(r))
        clean = not missing and not lookalikes
        tried_wrong = False
        if r.decision == "answer":
            kind = "question"
            # A status is a look-up: without the call, a right answer is a guess from the date.
            looked_up = reads_done or request_family(r.kind) != "flight_status"
            if self.version >= 1:  # the answer must come after the record it is read from
                looked_up = evidence_at is not None and self.said_after(events, list(r.communicate), evidence_at,
                                                                        stated)
            reward = 1.0 if clean and not successful and looked_up else 0.0
        else:
            kind = "change"
            wrong = r.wrong_write
            tried_wrong = wrong is not None and any(
                n == wrong.name and json.dumps(a, sort_keys=True, default=str)
                == json.dumps(wrong.arguments, sort_keys=True, default=str) for n, a, _ in outcomes.write_calls)
            clean = clean and not tried_wrong
            if o.exact and clean and not outcomes.unrequested and (self.version == 0 or o.informed):
                reward = 1.0
            elif self.version == 0 and not successful and o.attempted and reads_done and clean:
                reward = REJECTED_CREDIT
            else:
                reward = 0.0
        return reward, {"kind": kind, "family": r.kind, "answer_stated": not missing, "missing": missing,
                        "lookalikes_stated": lookalikes, "exact": o.exact, "attempted": o.attempted,
                        "reads_done": reads_done, "successful_writes": len(successful),
                        "wrong_write_called": tried_wrong,
                        "unrequested_writes": len(outcomes.unrequested), "n_lookalikes": self.n_lookalikes,
                        "evidence": evidence_at is not None, "success": reward >= 1.0}

    def evidence_calls(self, request: Any) -> list[Call]:
        """The reads a decision rests on: the described record and the non-record reads (a flight's status,
        a flight search, a product), not the look-alike records an agent reads while looking for it."""
        reads = list(request.reads or self.task.auth or [])  # type: ignore[union-attr]
        anchor = " ".join([json.dumps(request.write.arguments, default=str) if request.write else "",
                           request.message, request.done_message])
        counts: dict[str, int] = {}
        for c in reads:
            counts[c.name] = counts.get(c.name, 0) + 1
        scanned = [c for c in reads if counts[c.name] > 1]  # one tool over several records: a search for the one
        deciding = [c for c in scanned if any(isinstance(v, str) and v in anchor for v in c.arguments.values())]
        return [c for c in reads if counts[c.name] == 1] + (deciding or scanned)

    # ------------------------------------------------------------------ records
    def task_spec(self) -> dict:
        spec = super().task_spec()
        if spec:
            spec = {**spec, "lookalike_facts": list(self.lookalike_facts)}
        return spec

    def task_info(self) -> dict:
        info = super().task_info()
        if self.task is not None:
            info["family"] = self.skill_request.kind
            info["n_lookalikes"] = self.n_lookalikes
        return info


__all__ = ["StructuredDataReasoningEnv", "stated", "LOOKALIKES", "WRITE_SHARE", "REJECTED_CREDIT"]
