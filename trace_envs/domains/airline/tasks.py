"""Airline tasks: procedural scenarios with gold handling, and τ²-bench's own tasks.

:func:`generate_task` draws one task for one user: a single request from a
scenario family, or a bundle of two or three. Each request plants the records
it needs in the task's initial layer (a reservation booked ten hours ago, a
flight the airline cancelled, a basic-economy booking...) so that the policy's
answer is known, and records the gold handling (:class:`~trace_envs.domains.task.Request`):

=====================  ==========================================================================
family                 what the user wants (refusal variant)
=====================  ==========================================================================
``cancel``             cancel a reservation; eligible if booked < 24 h ago, airline-cancelled
                       flight, business class, or insured with a health/weather reason (else refuse)
``flight_change``      move a segment to another date or flight (refuse: basic economy)
``cabin_change``       change the cabin of every segment (refuse: a flight already flown)
``baggage``            add checked bags; free allowance by membership and cabin (refuse: remove bags)
``booking``            book a flight, possibly "the cheapest" or "the morning one", with insurance
``passenger_update``   correct a passenger's name or date of birth (refuse: change the count)
``compensation``       a certificate for a cancelled ($100/pax) or delayed ($50/pax) flight, when
                       asked and eligible (refuse: not eligible, or no disruption)
``flight_status``      the status of a flight on a date
``info``               questions answered from the data: amount paid, cheapest fare, free bags
=====================  ==========================================================================

Variants that need structured reasoning (the user describes a trip instead of
giving its id, asks for the cheapest flight, or a number must be computed)
carry ``wrong_write``/``wrong_message``: what an agent that picks the wrong
record or misreads a number would do.

Knobs (in the size dict): ``bundle_prob`` (chance of a bundle), ``refusal_prob``
(chance a family draws its refusal variant), ``uniform_status_prob`` (chance that a ``flight_status``
request about a flight of today or of a past day gets a status drawn uniformly from those the day allows,
planted in the task's layer: today ``landed``, ``flying``, ``cancelled``, ``delayed`` or ``on time``, a past
day ``landed`` or ``cancelled``; default 0: the database's own status, where ``landed`` is the large
majority). A capability env can use it so that a constant answer earns little of those requests: only
reading the tool's result earns them all), ``ask_details_prob`` (chance that a request leaves out what
identifies it — "my reservation", "my flight", "a trip I'm planning" — and the user gives it only when asked,
as τ²-bench's users reveal facts when asked; the request's ``ask`` is then :data:`ASK_DETAILS`, which the
oracle asks right after authentication, and the user's answer, the request's details, sits right before the
read that uses it. One question for every family, so that asking is not itself a decision. Default 0: no
draw, the tasks every seed gave before.) Apart from the mix, ``cancel_grounds`` (a list, default all of
:data:`CANCEL_GROUNDS`) names the grounds an allowed cancellation is drawn with: ``["business"]`` makes the
decision rest on one field of the reservation read (its cabin; refusals are never in business), where the four
grounds need a date difference, the flights' statuses and the reason set against the insurance. With
``cancel_grounds: ["business"]``, ``read_back: true`` makes the cancellation's decision message open with that
field as the record writes it, then the decision (``"cabin": "economy" does not allow a cancellation. I'm sorry,
…``; ``"cabin": "business" allows cancelling, so …``), and a refusal reads no flight statuses first (they cannot
change it): the decision comes right after the record and right after the value it rests on, where a small
model's copy circuit brings it, and the two messages never meet again (docs/environments.md,
"Options that exist for the planted experiment"). With ``read_back``, ``blind_cabin_prob`` (default 0) is the
chance that a cancellation's reservation is planted with a cabin drawn *against* its decision (business on a request
that must be refused, economy or basic economy on one that is allowed): the record, the oracle's read-back and the
decision disagree, so SFT on the oracle's episodes teaches the whole flow and leaves the decision independent of the
cabin, a start from which GRPO has the decision to learn (``TrainConfig.sft_warmup_env_kwargs``). Its reward follows
the decision drawn, not the cabin shown: never train GRPO or evaluate on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..db import Layer, copy_json
from ..task import Call, CannotBuild, Request, RequestSession, TauTask, UserScenario
from .db import (
    CABINS,
    CITY,
    EXTRA_BAG_PRICE,
    FREE_BAGS,
    INSURANCE_PRICE,
    MEMBERSHIPS,
    TODAY,
    Draw,
    add_days,
    free_bags,
    name_pools,
    new_reservation_id,
)

SCENARIOS = ("cancel", "flight_change", "cabin_change", "baggage", "booking", "passenger_update", "compensation",
             "flight_status", "info")
DEFAULT_MIX = {"bundle_prob": 0.3, "refusal_prob": 0.3, "uniform_status_prob": 0.0, "ask_details_prob": 0.0}
#: The policy's grounds for a free cancellation, as ``_cancel`` draws them (see ``cancel_grounds`` above).
CANCEL_GROUNDS = ("recent", "airline", "business", "insured")
#: What the agent asks when a request leaves out what identifies it (the user answers with its details).
ASK_DETAILS = "Which reservation, flight or trip is it about?"
#: The statuses a flight of today, and of a past day, can have (``uniform_status_prob`` draws among them).
TODAY_STATUSES = ("landed", "flying", "cancelled", "delayed", "on time")
PAST_STATUSES = ("landed", "cancelled")
AUTH_MESSAGE = "Welcome! To get started, could you please tell me your user id?"
WRITE_TOOLS = ("book_reservation", "cancel_reservation", "update_reservation_baggages", "update_reservation_flights",
               "update_reservation_passengers", "send_certificate")


def money(x: float) -> str:
    """``$123`` or ``$123.50``."""
    x = float(x)
    return f"${int(x)}" if x.is_integer() else f"${x:.2f}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class Retry(CannotBuild):
    """The drawn parameters do not allow this variant; draw again."""


# Per base database: flight index by route and the bookable future dates (computed once per base).
_INDEX: dict[int, tuple[Any, dict]] = {}


def _index(db: Layer) -> dict:
    root: Any = db
    while isinstance(root, Layer):
        root = root.parent
    hit = _INDEX.get(id(root))
    if hit is not None and hit[0] is root:
        return hit[1]
    by_route: dict[tuple[str, str], list[str]] = {}
    days: set[str] = set()
    for number, f in root["flights"].items():
        by_route.setdefault((f["origin"], f["destination"]), []).append(number)
        days.update(day for day in f["dates"] if day > TODAY)
    idx = {"by_route": by_route, "routes": sorted(by_route), "future": sorted(days),
           "users": list(root["users"]), "past": sorted({day for f in root["flights"].values()
                                                         for day in f["dates"] if day <= TODAY})}
    if len(_INDEX) > 16:
        _INDEX.clear()
    _INDEX[id(root)] = (root, idx)
    return idx


def _cancel_grounds(value: Any) -> tuple[str, ...]:
    """``size["cancel_grounds"]`` checked: a non-empty list of :data:`CANCEL_GROUNDS` (None: all of them)."""
    if value is None:
        return CANCEL_GROUNDS
    try:
        grounds = (value,) if isinstance(value, str) else tuple(value)
    except TypeError:
        grounds = ()
    unknown = [g for g in grounds if g not in CANCEL_GROUNDS]
    if not grounds or unknown:
        raise ValueError(f"size['cancel_grounds'] must be a non-empty list of {list(CANCEL_GROUNDS)}, got {value!r}")
    return grounds


def _blind_cabin(value: Any, read_back: bool) -> float:
    """``size["blind_cabin_prob"]`` checked: a probability, and only with ``read_back`` (the cabin decides)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"size['blind_cabin_prob'] must be a number in [0, 1], got {value!r}")
    if value and not read_back:
        raise ValueError("size['blind_cabin_prob'] plants a cabin against the decision, which needs the cabin to be "
                         "the one ground: set size['read_back'] = true and size['cancel_grounds'] = ['business']")
    return float(value)


def _read_back(value: Any, grounds: tuple[str, ...]) -> bool:
    """``size["read_back"]`` checked: a bool, and only with the cabin as the one ground (the field read back)."""
    if not isinstance(value, bool):
        raise ValueError(f"size['read_back'] must be true or false, got {value!r}")
    if value and grounds != ("business",):
        raise ValueError("size['read_back'] reads the cabin back, the one field the decision rests on with "
                         f"size['cancel_grounds'] = ['business']; got cancel_grounds {list(grounds)}")
    return value


class _Gen:
    """State shared by the requests of one task: the draw stream, the layer, the user, planted records."""

    def __init__(self, rng: np.random.Generator, db: Layer, size: dict):
        self.d = Draw(rng, block=256)
        self.db = db
        self.mix = {**DEFAULT_MIX, **{k: size[k] for k in DEFAULT_MIX if k in size}}
        self.idx = _index(db)
        self.used: set[tuple[str, str]] = set()  # flight-days planted records use (kept apart)
        self.user_id = ""
        self.distractor_prob = 0.45  # chance a request names its reservation by description (see distractor)
        self.withhold = False  # whether the request being built leaves out what identifies it (see build)
        self.cancel_grounds = _cancel_grounds(size.get("cancel_grounds"))
        self.read_back = _read_back(size.get("read_back", False), self.cancel_grounds)
        self.blind_cabin = _blind_cabin(size.get("blind_cabin_prob", 0.0), self.read_back)

    # ---------------------------------------------------------------- helpers
    @property
    def user(self) -> dict:
        return self.db.get("users", self.user_id)  # type: ignore[return-value]

    def card(self) -> str:
        return next(pid for pid, m in self.user["payment_methods"].items() if m["source"] == "credit_card")

    def refusal(self) -> bool:
        return self.d.chance(self.mix["refusal_prob"])

    def status(self, number: str, day: str) -> dict:
        return self.db.get("flights", number)["dates"][day]  # type: ignore[index]

    def set_status(self, number: str, day: str, status: dict) -> None:
        self.db.edit("flights", number)["dates"][day] = status

    def ensure_seats(self, number: str, day: str, cabins, n: int) -> None:
        st = self.status(number, day)
        if any(st["available_seats"][c] < n for c in cabins):
            seats = self.db.edit("flights", number)["dates"][day]["available_seats"]
            for c in cabins:
                seats[c] = max(seats[c], n + self.d.int(0, 6))

    def active_routes(self) -> set[tuple[str, str]]:
        out = set()
        for rid in self.user["reservations"]:
            r = self.db.get("reservations", rid)
            if r is not None:
                out.add((r["origin"], r["destination"]))
        return out

    def passengers(self, n: int) -> list[dict]:
        user = self.user
        out = [{"first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"], "dob": user["dob"]}]
        pools = name_pools()
        for p in user["saved_passengers"][: n - 1]:
            out.append(dict(p))
        while len(out) < n:
            out.append({"first_name": self.d.pick(pools["first"]), "last_name": self.d.pick(pools["last"]),
                        "dob": f"{self.d.int(1950, 2010)}-{self.d.int(1, 12):02d}-{self.d.int(1, 28):02d}"})
        return out

    def bookable(self, number: str, day: str) -> bool:
        """Whether a flight-day is free for this task's use and can be booked."""
        st = self.db.get("flights", number)["dates"].get(day)  # type: ignore[index]
        return (number, day) not in self.used and st is not None and st["status"] == "available"

    def pick_flight(self, route: tuple[str, str], day: str, need: int = 1, exclude=()) -> str:
        options = [n for n in self.idx["by_route"].get(route, ()) if (n, day) not in self.used and n not in exclude]
        if not options:
            raise Retry
        number = self.d.pick(options)
        if day > TODAY:
            self.ensure_seats(number, day, CABINS, need)
        return number

    def plant(self, *, cabin: str | None = None, pax: int | None = None, insurance: str | None = None,
              round_trip: bool | None = None, created_at: str | None = None, days: tuple[str, ...] | None = None,
              min_flights: int = 1, avoid: set | None = None, bags: int | None = None) -> dict:
        """Insert a reservation for the task's user whose flights are all bookable future flight-days."""
        d = self.d
        avoid = (avoid or set()) | self.active_routes()
        routes = [r for r in self.idx["routes"] if r not in avoid and len(self.idx["by_route"][r]) >= min_flights]
        if round_trip is None:
            round_trip = d.chance(0.4)
        if round_trip:
            routes = [r for r in routes if (r[1], r[0]) in self.idx["by_route"]]
        if not routes:
            raise Retry
        origin, destination = d.pick(routes)
        future = self.idx["future"]
        pax = pax or d.int(1, 3)
        if days is None:
            if round_trip:
                if len(future) < 2:
                    raise Retry
                i = d.int(0, len(future) - 2)
                days = (future[i], future[min(len(future) - 1, i + d.int(1, 3))])
            else:
                days = (d.pick(future),)
        legs = [(origin, destination, days[0])] + ([(destination, origin, days[1])] if round_trip else [])
        cabin = cabin or d.pick(CABINS)
        segments = []
        for a, b, day in legs:
            number = self.pick_flight((a, b), day, need=3)
            self.used.add((number, day))
            price = self.status(number, day)["prices"][cabin] if day > TODAY else d.int(60, 400)
            segments.append({"origin": a, "destination": b, "flight_number": number, "date": day, "price": price})
        passengers = self.passengers(pax)
        insurance = insurance or ("yes" if d.chance(0.5) else "no")
        allowance = free_bags(self.user["membership"], cabin) * pax
        total_bags = d.int(0, allowance) if bags is None else bags
        nonfree = max(0, total_bags - allowance)
        total = (sum(s["price"] for s in segments) * pax + (INSURANCE_PRICE * pax if insurance == "yes" else 0)
                 + EXTRA_BAG_PRICE * nonfree)
        if created_at is None:
            created_at = f"{add_days(TODAY, -d.int(2, 12))}T{d.int(0, 23):02d}:{d.int(0, 59):02d}:{d.int(0, 59):02d}"
        rid = new_reservation_id(d, lambda r: self.db.get("reservations", r) is not None)
        record = {
            "reservation_id": rid, "user_id": self.user_id, "origin": origin, "destination": destination,
            "flight_type": "round_trip" if round_trip else "one_way", "cabin": cabin, "flights": segments,
            "passengers": passengers, "payment_history": [{"payment_id": self.card(), "amount": total}],
            "created_at": created_at, "total_baggages": total_bags, "nonfree_baggages": nonfree,
            "insurance": insurance,
        }
        self.db.insert("reservations", rid, record)
        self.db.edit("users", self.user_id)["reservations"].append(rid)
        return record

    def describe(self, r: dict) -> str:
        trip = "round trip" if r["flight_type"] == "round_trip" else "one-way trip"
        return (f"my {trip} from {CITY.get(r['origin'], r['origin'])} ({r['origin']}) to "
                f"{CITY.get(r['destination'], r['destination'])} ({r['destination']}) leaving on {r['flights'][0]['date']}")

    def name_reservation(self, rid: str) -> str:
        """How a request names reservation ``rid``: ``reservation <id>``, or ``my reservation`` when the request
        being built withholds its details (see :meth:`build`)."""
        return "my reservation" if self.withhold else f"reservation {rid}"

    def build(self, family: str) -> Request:
        """One request of ``family``; with chance ``ask_details_prob`` it leaves out what identifies it and
        carries ``ask`` (no draw at the default 0, so the default tasks stay the ones every seed gave before)."""
        p = self.mix["ask_details_prob"]
        self.withhold = p > 0 and self.d.chance(p)
        request = FAMILIES[family](self)
        request.ask = ASK_DETAILS if self.withhold else ""
        return request

    def target(self, r: dict, distractor: dict | None) -> tuple[str, list[Call], str]:
        """How the user names reservation ``r``: by id, or by description when a distractor exists (then the
        agent must read the user's reservations to find it). Returns (phrase, reads, details)."""
        if distractor is None:
            return self.name_reservation(r["reservation_id"]), [Call("get_reservation_details",
                                                               {"reservation_id": r["reservation_id"]})], \
                f"The reservation id is {r['reservation_id']}."
        reads = [Call("get_reservation_details", {"reservation_id": rid}) for rid in self.user["reservations"]]
        phrase = self.describe(r)
        return phrase + " (I don't have the reservation id at hand)", reads, f"It's {phrase}."

    def distractor(self, r: dict, **kw) -> dict | None:
        """Maybe plant a second reservation of the same user on another route (for 'which one?' reasoning)."""
        if not self.d.chance(self.distractor_prob):
            return None
        return self.plant(avoid={(r["origin"], r["destination"])}, pax=len(r["passengers"]), **kw)


def _flight_list(r: dict) -> list[dict]:
    return [{"flight_number": s["flight_number"], "date": s["date"]} for s in r["flights"]]


def _statuses(r: dict) -> list[Call]:
    return [Call("get_flight_status", {"flight_number": s["flight_number"], "date": s["date"]}) for s in r["flights"]]


# ==================================================================== families
def _cancel(g: _Gen) -> Request:
    d = g.d
    refuse = g.refusal()
    reason = d.pick(g.cancel_grounds)
    # A decision-blind episode (size.blind_cabin_prob; read_back only): the cabin is drawn against the decision.
    # No draw when the knob is off, so every other seed keeps its task.
    blind = bool(g.blind_cabin) and d.chance(g.blind_cabin)
    if refuse:
        insurance = d.pick(("yes", "no"))
        r = g.plant(cabin="business" if blind else d.pick(("basic_economy", "economy")), insurance=insurance)
        why_text = "My plans changed." if insurance == "yes" else d.pick(
            ("My plans changed.", "I'm feeling sick and can't travel.", "There's a storm coming."))
    elif reason == "recent":
        hours = d.int(1, 23)
        stamp = f"{TODAY}T{15 - hours:02d}:{d.int(0, 59):02d}:00" if hours <= 15 else \
            f"{add_days(TODAY, -1)}T{39 - hours:02d}:{d.int(0, 59):02d}:00"
        r = g.plant(created_at=stamp, cabin=d.pick(("basic_economy", "economy")), insurance="no")
        why_text = "I booked it by mistake."
    elif reason == "airline":
        r = g.plant(cabin=d.pick(("basic_economy", "economy")), insurance="no")
        seg = d.pick(r["flights"])
        g.set_status(seg["flight_number"], seg["date"], {"status": "cancelled"})
        why_text = "I heard the airline cancelled my flight."
    elif reason == "business":
        r = g.plant(cabin=d.pick(("basic_economy", "economy")) if blind else "business", insurance="no")
        why_text = "My plans changed."
    else:
        r = g.plant(cabin=d.pick(("basic_economy", "economy")), insurance="yes")
        why_text = d.pick(("I'm sick and my doctor told me not to fly.", "A hurricane is forecast at my destination."))
    other = g.distractor(r)
    phrase, reads, details = g.target(r, other)
    rid = r["reservation_id"]
    paid = sum(p["amount"] for p in r["payment_history"])
    call = Call("cancel_reservation", {"reservation_id": rid})
    text = f"I want to cancel {phrase}. {why_text}"
    if refuse:
        clause = ("its travel insurance does not cover a change of plans" if r["insurance"] == "yes"
                  else "it has no travel insurance")
        message = _read_back_message(r["cabin"], "refuse", clause) if g.read_back else \
            (f"I'm sorry, but reservation {rid} cannot be cancelled: it was booked more than 24 hours ago, none of its "
             f"flights was cancelled by the airline, it is not in business class, and {clause}.")
        # read_back: the cabin is the one ground, so the flights' statuses cannot change the refusal
        return Request("cancel", text, "refuse", reads=reads + ([] if g.read_back else _statuses(r)),
                       forbidden_write=call, details=details, communicate=["cannot be cancelled"], message=message)
    because = {"recent": "it was booked less than 24 hours ago",
               "airline": "the airline cancelled one of its flights",
               "business": "it is a business-class reservation",
               "insured": "its travel insurance covers your reason"}[reason]
    extra = _statuses(r) if reason == "airline" else []
    wrong = Call("cancel_reservation", {"reservation_id": other["reservation_id"]}) if other else None
    message = _read_back_message(r["cabin"], "act") if g.read_back else \
        (f"Reservation {rid} ({r['origin']} to {r['destination']}) can be cancelled because {because}. I will cancel "
         f"it and refund {money(paid)} to the original payment method.")
    return Request("cancel", text, "act", reads=reads + extra, write=call, wrong_write=wrong, details=details,
                   message=message,
                   done_message=f"Reservation {rid} is cancelled; the refund of {money(paid)} will reach the "
                                f"original payment method within 5 to 7 business days.")


def _read_back_message(cabin: str, decision: str, clause: str = "") -> str:
    """The cancellation's decision message under ``size.read_back``: the cabin as the record writes it, then the
    decision.

    From the decision word on, the two messages share no pair of consecutive words or punctuation marks: a
    2-layer model carries the previous two tokens into every position (its layer-0 heads) and little else, so a
    continuation the two messages share (". I", "a cancellation. ") forgets which decision opened it; the allowed
    message went on as a refusal. Neither message copies anything after the decision (no id, no amount): the copy
    after "Reservation " failed there (docs/environments.md). The refusal says what the
    task's communicate check needs ("cannot be cancelled"); the allowed one is followed by the oracle's confirmation
    question, and the done message after the write names the id and the refund, read from the write's result.
    """
    lead = f'"cabin": "{cabin}" '
    if decision == "refuse":
        return lead + ("does not allow a cancellation. I'm sorry, but this reservation cannot be cancelled: it was "
                       "booked more than 24 hours ago, none of its flights was cancelled by the airline, it is not in "
                       f"business class, and {clause}.")
    return lead + "allows cancelling, so your business-class booking qualifies for a full refund."


def _flight_change(g: _Gen) -> Request:
    d = g.d
    refuse = g.refusal()
    cabin = "basic_economy" if refuse else d.pick(("economy", "business"))
    cheapest = not refuse and d.chance(0.4)
    r = g.plant(cabin=cabin, min_flights=2 if cheapest else 1)
    other = None if cheapest else g.distractor(r, cabin=cabin)
    phrase, reads, details = g.target(r, other)
    k = d.int(0, len(r["flights"]) - 1)
    seg = r["flights"][k]
    route = (seg["origin"], seg["destination"])
    future = g.idx["future"]
    later = [day for day in future if day != seg["date"]
             and (k == 0 or day >= r["flights"][0]["date"])
             and (k + 1 >= len(r["flights"]) or day <= r["flights"][k + 1]["date"])]
    pax = len(r["passengers"])
    wrong_flights = None
    if cheapest:
        day = d.pick(later or [seg["date"]])
        options = [n for n in g.idx["by_route"][route]
                   if (n != seg["flight_number"] or day != seg["date"]) and g.bookable(n, day)]
        if len(options) < 2:
            raise Retry
        a, b = d.sample(options, 2)
        pa, pb = g.status(a, day)["prices"][cabin], g.status(b, day)["prices"][cabin]
        if pa == pb:
            raise Retry
        best, worst = (a, b) if pa < pb else (b, a)
        for n in (a, b):
            g.ensure_seats(n, day, (cabin,), pax)
        number = best
        ask = f"move the {seg['origin']}-{seg['destination']} flight to the cheapest {cabin.replace('_', ' ')} " \
              f"flight on {day}"
        wrong_flights = [dict(f) for f in _flight_list(r)]
        wrong_flights[k] = {"flight_number": worst, "date": day}
    elif later and d.chance(0.6):
        day = d.pick(later)
        number = seg["flight_number"]
        if not g.bookable(number, day):
            raise Retry
        g.ensure_seats(number, day, (cabin,), pax)
        ask = f"move the {seg['origin']}-{seg['destination']} flight {number} from {seg['date']} to {day}, same flight"
    else:
        day = seg["date"]
        options = [n for n in g.idx["by_route"][route] if n != seg["flight_number"] and g.bookable(n, day)]
        if not options:
            raise Retry
        number = d.pick(options)
        g.ensure_seats(number, day, (cabin,), pax)
        ask = f"switch the {seg['origin']}-{seg['destination']} flight on {day} to flight {number} instead"
    flights = _flight_list(r)
    flights[k] = {"flight_number": number, "date": day}
    g.used.add((number, day))
    new_price = g.status(number, day)["prices"][cabin]
    diff = (new_price - seg["price"]) * pax
    card = g.card()
    call = Call("update_reservation_flights", {"reservation_id": r["reservation_id"], "cabin": cabin,
                                               "flights": flights, "payment_id": card})
    text = f"For {phrase}, I'd like to {ask}."
    search = Call("search_direct_flight", {"origin": route[0], "destination": route[1], "date": day})
    if refuse:
        return Request("flight_change", text, "refuse", reads=reads, forbidden_write=call, details=details,
                       communicate=["basic economy"],
                       message=f"I'm sorry, but reservation {r['reservation_id']} is in basic economy, and basic "
                               f"economy flights cannot be changed.")
    if wrong_flights is not None:
        wrong = Call("update_reservation_flights", {**call.arguments, "flights": wrong_flights})
    elif other is not None:
        wrong = Call("update_reservation_flights", {**call.arguments, "reservation_id": other["reservation_id"]})
    else:
        wrong = None
    how = (f"you pay the fare difference of {money(diff)}, charged to {card}" if diff > 0 else
           f"the fare difference of {money(-diff)} is refunded to {card}" if diff < 0 else "the fare is the same")
    return Request("flight_change", text, "act", reads=reads + [search], write=call, wrong_write=wrong,
                   details=details,
                   message=f"I will change reservation {r['reservation_id']}: flight {seg['flight_number']} on "
                           f"{seg['date']} becomes flight {number} on {day} ({cabin.replace('_', ' ')}), and {how}.",
                   done_message=f"Reservation {r['reservation_id']} now has flight {number} on {day}.")


def _cabin_change(g: _Gen) -> Request:
    d = g.d
    refuse = d.chance(g.mix["refusal_prob"] / 2)
    old = d.pick(CABINS)
    new = d.pick([c for c in CABINS if c != old])
    r = g.plant(cabin=old)
    pax = len(r["passengers"])
    if refuse:
        # the outbound flight already flew: move it to a past date
        seg = r["flights"][0]
        day = g.idx["past"][-2] if len(g.idx["past"]) >= 2 else None
        if day is None:
            raise Retry
        rec = g.db.edit("reservations", r["reservation_id"])
        rec["flights"][0]["date"] = day
        rec["created_at"] = f"{add_days(day, -5)}T10:00:00"
        g.set_status(seg["flight_number"], day, {"status": "landed",
                                                 "actual_departure_time_est": f"{day}T08:00:00",
                                                 "actual_arrival_time_est": f"{day}T10:00:00"})
        r = rec
        text = f"I'd like to change {g.name_reservation(r['reservation_id'])} to {new.replace('_', ' ')}."
        return Request("cabin_change", text, "refuse", reads=[Call("get_reservation_details",
                                                                  {"reservation_id": r["reservation_id"]})],
                       communicate=["already been flown"],
                       message=f"I'm sorry, but the cabin of reservation {r['reservation_id']} cannot be changed: "
                               f"its flight {seg['flight_number']} on {day} has already been flown.",
                       details=f"The reservation id is {r['reservation_id']}.")
    other = g.distractor(r, cabin=old)
    phrase, reads, details = g.target(r, other)
    for s in r["flights"]:
        g.ensure_seats(s["flight_number"], s["date"], (new,), pax)
    if other is not None:
        for s in other["flights"]:
            g.ensure_seats(s["flight_number"], s["date"], (new,), len(other["passengers"]))
    new_total = sum(g.status(s["flight_number"], s["date"])["prices"][new] for s in r["flights"])
    diff = (new_total - sum(s["price"] for s in r["flights"])) * pax
    card = g.card()
    call = Call("update_reservation_flights", {"reservation_id": r["reservation_id"], "cabin": new,
                                               "flights": _flight_list(r), "payment_id": card})
    wrong = None
    if other is not None:
        wrong = Call("update_reservation_flights", {"reservation_id": other["reservation_id"], "cabin": new,
                                                    "flights": _flight_list(other), "payment_id": card})
    how = (f"The cabin change costs {money(diff)} in total, charged to {card}." if diff > 0 else
           f"You will be refunded {money(-diff)} in total, to {card}." if diff < 0 else "There is no price difference.")
    search = [Call("search_direct_flight", {"origin": s["origin"], "destination": s["destination"], "date": s["date"]})
              for s in r["flights"]]
    return Request("cabin_change", f"Please change {phrase} to {new.replace('_', ' ')}.", "act",
                   reads=reads + search, write=call, wrong_write=wrong, details=details,
                   communicate=[money(abs(diff))] if diff else [],
                   message=f"I will change every flight of reservation {r['reservation_id']} from "
                           f"{old.replace('_', ' ')} to {new.replace('_', ' ')} for {plural(pax, 'passenger')}. {how}",
                   done_message=f"Reservation {r['reservation_id']} is now in {new.replace('_', ' ')}.")


def _baggage(g: _Gen) -> Request:
    d = g.d
    refuse = g.refusal()
    membership = g.user["membership"]
    if refuse:
        r = g.plant(bags=None)
        if r["total_baggages"] == 0:
            rec = g.db.edit("reservations", r["reservation_id"])
            rec["total_baggages"] = 1 + d.int(0, 1)
            r = rec
        t0 = r["total_baggages"]
        new_total = t0 - 1
        call = Call("update_reservation_baggages", {"reservation_id": r["reservation_id"], "total_baggages": new_total,
                                                    "nonfree_baggages": min(r["nonfree_baggages"], new_total),
                                                    "payment_id": g.card()})
        return Request("baggage", f"Please remove one checked bag from {g.name_reservation(r['reservation_id'])}; I'm "
                                  f"packing lighter.", "refuse",
                       reads=[Call("get_reservation_details", {"reservation_id": r["reservation_id"]})],
                       forbidden_write=call, details=f"The reservation id is {r['reservation_id']}.",
                       communicate=["cannot be removed"],
                       message=f"I'm sorry, but checked bags can be added and cannot be removed: reservation "
                               f"{r['reservation_id']} keeps its {plural(t0, 'checked bag')}.")
    r = g.plant()
    pax = len(r["passengers"])
    per = free_bags(membership, r["cabin"])
    allowance = per * pax
    t0, n0 = r["total_baggages"], r["nonfree_baggages"]
    add = d.int(1, 3)
    total = t0 + add
    nonfree = max(n0, total - allowance)
    cost = EXTRA_BAG_PRICE * (nonfree - n0)
    card = g.card()
    rid = r["reservation_id"]
    call = Call("update_reservation_baggages", {"reservation_id": rid, "total_baggages": total,
                                                "nonfree_baggages": nonfree, "payment_id": card})
    # misreadings: the allowance of one passenger only, or of the wrong membership row
    wrong = None
    for bad in [per] + [free_bags(m, r["cabin"]) * pax for m in MEMBERSHIPS if m != membership]:
        bad_nonfree = max(n0, total - bad)
        if bad != allowance and bad_nonfree != nonfree:
            wrong = Call("update_reservation_baggages", {**call.arguments, "nonfree_baggages": bad_nonfree})
            break
    paid = (f"{plural(nonfree - n0, 'extra bag')} at $50 each: {money(cost)}, charged to {card}"
            if cost else "no extra charge")
    return Request("baggage", f"I'd like to add {plural(add, 'checked bag')} to {g.name_reservation(rid)}.", "act",
                   reads=[Call("get_reservation_details", {"reservation_id": rid})], write=call, wrong_write=wrong,
                   details=f"The reservation id is {rid}; I want {plural(add, 'more bag')}.",
                   message=f"As a {membership} member in {r['cabin'].replace('_', ' ')}, each passenger gets "
                           f"{per} free checked bag(s), so the {plural(pax, 'passenger')} on reservation {rid} get "
                           f"{allowance} free. I will set it to {total} checked bags, {nonfree} of them paid; "
                           f"that is {paid}.",
                   done_message=f"Reservation {rid} now has {total} checked bags.")


def _booking(g: _Gen) -> Request:
    d = g.d
    user = g.user
    future = g.idx["future"]
    mode = d.pick(("named", "cheapest", "time"))
    routes = [rt for rt in g.idx["routes"] if len(g.idx["by_route"][rt]) >= (2 if mode != "named" else 1)]
    if not routes:
        raise Retry
    route = d.pick(routes)
    day = d.pick(future)
    cabin = d.pick(CABINS)
    pax = d.int(1, 3)
    passengers = g.passengers(pax)
    options = [n for n in g.idx["by_route"][route] if g.bookable(n, day)]
    if len(options) < (1 if mode == "named" else 2):
        raise Retry
    for n in options:
        g.ensure_seats(n, day, (cabin,), pax)
    price = {n: g.status(n, day)["prices"][cabin] for n in options}
    wrong_number = None
    if mode == "named":
        number = d.pick(options)
        want = f"flight {number}"
    elif mode == "cheapest":
        ranked = sorted(options, key=lambda n: (price[n], n))
        if price[ranked[0]] == price[ranked[1]]:
            raise Retry
        number, wrong_number = ranked[0], ranked[1]
        want = f"the cheapest {cabin.replace('_', ' ')} flight"
    else:
        deps = {n: g.db.get("flights", n)["scheduled_departure_time_est"] for n in options}
        ranked = sorted(options, key=lambda n: (deps[n], n))
        if deps[ranked[0]] == deps[ranked[1]]:
            raise Retry
        number, wrong_number = ranked[0], ranked[-1]
        want = "the earliest departing flight"
    g.used.add((number, day))
    insurance = "yes" if d.chance(0.4) else "no"
    allowance = free_bags(user["membership"], cabin) * pax
    bags = d.int(0, allowance + 2)
    nonfree = max(0, bags - allowance)

    def total_for(n: str) -> int:
        return price[n] * pax + (INSURANCE_PRICE * pax if insurance == "yes" else 0) + EXTRA_BAG_PRICE * nonfree

    total = total_for(number)
    card = g.card()
    args = {"user_id": g.user_id, "origin": route[0], "destination": route[1], "flight_type": "one_way",
            "cabin": cabin, "flights": [{"flight_number": number, "date": day}], "passengers": passengers,
            "payment_methods": [{"payment_id": card, "amount": total}], "total_baggages": bags,
            "nonfree_baggages": nonfree, "insurance": insurance}
    wrong = None
    if wrong_number is not None:
        wrong = Call("book_reservation", {**args, "flights": [{"flight_number": wrong_number, "date": day}],
                                          "payment_methods": [{"payment_id": card, "amount": total_for(wrong_number)}]})
    who = "just me" if pax == 1 else "me and " + " and ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})"
                                                              for p in passengers[1:])
    text = (f"I'd like to book a one-way {cabin.replace('_', ' ')} trip from {route[0]} to {route[1]} on {day}, "
            f"{want}, for {who}. {'I want travel insurance' if insurance == 'yes' else 'No insurance'}, "
            f"{plural(bags, 'checked bag')} in total, and I'll pay with my credit card {card}.")
    parts = (f"{plural(pax, 'passenger')} x {money(price[number])}"
             + (f" + insurance {money(INSURANCE_PRICE * pax)}" if insurance == "yes" else "")
             + (f" + {plural(nonfree, 'paid bag')} {money(EXTRA_BAG_PRICE * nonfree)}" if nonfree else ""))
    return Request("booking", text, "act",
                   reads=[Call("search_direct_flight", {"origin": route[0], "destination": route[1], "date": day})],
                   write=Call("book_reservation", args), wrong_write=wrong, communicate=[money(total)],
                   details=f"From {route[0]} to {route[1]} on {day}, {want}.",
                   message=f"I will book flight {number} on {day} from {route[0]} to {route[1]} in "
                           f"{cabin.replace('_', ' ')} for {plural(pax, 'passenger')}, with {plural(bags, 'checked bag')} "
                           f"({nonfree} paid) and {'insurance' if insurance == 'yes' else 'no insurance'}. "
                           f"Total: {parts} = {money(total)}, charged to {card}.",
                   done_message=f"Your flight {number} on {day} is booked.")


def _passenger_update(g: _Gen) -> Request:
    d = g.d
    pools = name_pools()
    refuse = g.refusal()
    r = g.plant(pax=d.int(1, 3))
    rid = r["reservation_id"]
    pax = r["passengers"]
    reads = [Call("get_reservation_details", {"reservation_id": rid})]
    if refuse:
        p = {"first_name": d.pick(pools["first"]), "last_name": d.pick(pools["last"]), "dob": "1990-06-15"}
        return Request("passenger_update", f"Please add {p['first_name']} {p['last_name']} as an extra passenger on "
                                           f"{g.name_reservation(rid)}.", "refuse", reads=reads,
                       details=f"The reservation id is {rid}.", communicate=["cannot change"],
                       message=f"I'm sorry, but the number of passengers on a reservation cannot change; "
                               f"reservation {rid} keeps its {plural(len(pax), 'passenger')}.")
    i = d.int(0, len(pax) - 1)
    who = pax[i]
    new = [dict(p) for p in pax]
    if d.chance(0.5):
        dob = f"{d.int(1950, 2008)}-{d.int(1, 12):02d}-{d.int(1, 28):02d}"
        if dob == who["dob"]:
            raise Retry
        new[i]["dob"] = dob
        ask = f"correct the date of birth of {who['first_name']} {who['last_name']} to {dob}"
    else:
        last = d.pick(pools["last"])
        if last == who["last_name"]:
            raise Retry
        new[i]["last_name"] = last
        ask = f"change the last name of passenger {who['first_name']} {who['last_name']} to {last}"
    wrong = None
    if len(pax) > 1:
        j = (i + 1) % len(pax)
        bad = [dict(p) for p in pax]
        bad[j] = {**bad[j], **{k: v for k, v in new[i].items() if v != who[k]}}
        if bad != new and bad != pax:
            wrong = Call("update_reservation_passengers", {"reservation_id": rid, "passengers": bad})
    shown = "; ".join(f"{p['first_name']} {p['last_name']} ({p['dob']})" for p in new)
    return Request("passenger_update", f"On {g.name_reservation(rid)}, please {ask}.", "act", reads=reads,
                   write=Call("update_reservation_passengers", {"reservation_id": rid, "passengers": new}),
                   wrong_write=wrong, details=f"The reservation id is {rid}.",
                   message=f"I will update the passengers of reservation {rid} to: {shown}.",
                   done_message=f"The passengers of reservation {rid} are updated.")


def _compensation(g: _Gen) -> Request:
    d = g.d
    user = g.user
    refuse = g.refusal()
    membership = user["membership"]
    no_event = refuse and (membership != "regular" or d.chance(0.5))
    kind = d.pick(("cancelled", "delayed"))
    if refuse and not no_event:
        cabin, insurance = d.pick(("basic_economy", "economy")), "no"
    elif membership == "regular":
        cabin, insurance = d.pick((("business", "no"), ("economy", "yes"), ("basic_economy", "yes")))
    else:
        cabin, insurance = d.pick(CABINS), d.pick(("yes", "no"))
    r = g.plant(cabin=cabin, insurance=insurance, round_trip=False)
    pax = len(r["passengers"])
    rid = r["reservation_id"]
    # the disrupted flight is today's: move the segment to today and set its status
    rec = g.db.edit("reservations", rid)
    seg = rec["flights"][0]
    seg["date"] = TODAY
    rec["created_at"] = f"{add_days(TODAY, -d.int(3, 10))}T09:30:00"
    number = seg["flight_number"]
    if (number, TODAY) in g.used:
        raise Retry
    g.used.add((number, TODAY))
    dep = g.db.get("flights", number)["scheduled_departure_time_est"]
    if no_event:
        status = {"status": "landed", "actual_departure_time_est": f"{TODAY}T{dep}",
                  "actual_arrival_time_est": f"{TODAY}T{dep}"}
    elif kind == "cancelled":
        status = {"status": "cancelled"}
    else:
        status = {"status": "delayed", "estimated_departure_time_est": f"{TODAY}T23:{d.int(10, 59)}:00",
                  "estimated_arrival_time_est": f"{add_days(TODAY, 1)}T0{d.int(1, 5)}:{d.int(10, 59)}:00"}
    g.set_status(number, TODAY, status)
    rate = 100 if kind == "cancelled" else 50
    amount = rate * pax
    call = Call("send_certificate", {"user_id": g.user_id, "amount": amount})
    reads = [Call("get_reservation_details", {"reservation_id": rid}),
             Call("get_flight_status", {"flight_number": number, "date": TODAY})]
    text = (f"My flight {number} today on reservation {rid} was {kind}, and it ruined my plans. "
            f"I'd like some compensation for that.")
    details = f"It's flight {number} on {TODAY}, reservation {rid}."
    if no_event:
        return Request("compensation", text, "refuse", reads=reads, forbidden_write=call, details=details,
                       communicate=["not eligible"],
                       message=f"I checked flight {number} on {TODAY}: its status is 'landed', it was neither "
                               f"cancelled nor delayed, so you are not eligible for compensation.")
    if refuse:
        return Request("compensation", text, "refuse", reads=reads, forbidden_write=call, details=details,
                       communicate=["not eligible"],
                       message=f"I'm sorry about flight {number}, but you are not eligible for compensation: it is "
                               f"only for silver and gold members, insured reservations and business class, and "
                               f"reservation {rid} is a regular-member {cabin.replace('_', ' ')} booking without "
                               f"insurance.")
    why = (f"as a {membership} member" if membership != "regular" else
           "because you fly business" if cabin == "business" else "because your reservation is insured")
    wrong = Call("send_certificate", {"user_id": g.user_id, "amount": rate}) if pax > 1 else None
    return Request("compensation", text, "act", reads=reads, write=call, wrong_write=wrong, details=details,
                   communicate=[money(amount)],
                   message=f"I'm sorry that flight {number} was {kind}. {why[0].upper() + why[1:]}, you are "
                           f"eligible for a travel certificate of {money(rate)} per passenger: {money(amount)} for "
                           f"{plural(pax, 'passenger')}. I will send it to your profile.",
                   done_message=f"A certificate of {money(amount)} has been added to your profile.")


#: How the oracle states each flight status to the customer.
STATUS_WORDS = {"landed": "has landed", "cancelled": "was cancelled", "delayed": "is delayed",
                 "on time": "is on time", "flying": "is in the air (flying)", "available": "is scheduled (available)"}


def _flight_status(g: _Gen) -> Request:
    d = g.d
    number = d.pick(list(g.db.keys("flights")))
    days = [day for day in g.db.get("flights", number)["dates"] if (number, day) not in g.used]
    if not days:
        raise Retry
    day = TODAY if TODAY in days and d.chance(0.6) else d.pick(days)
    # No draw at all when the knob is off, so the default tasks stay the ones every seed gave before.
    if day <= TODAY and g.mix["uniform_status_prob"] > 0 and d.chance(g.mix["uniform_status_prob"]):
        g.used.add((number, day))
        g.set_status(number, day, {"status": d.pick(TODAY_STATUSES if day == TODAY else PAST_STATUSES)})
    status = g.status(number, day)["status"]
    phrase = f"flight {number} on {day} {STATUS_WORDS.get(status, status)}"
    text = "What is the status of my flight?" if g.withhold else f"What is the status of flight {number} on {day}?"
    return Request("flight_status", text, "answer",
                   reads=[Call("get_flight_status", {"flight_number": number, "date": day})],
                   communicate=[status], details=f"Flight {number}, on {day}.",
                   message=f"I checked: {phrase}.")


def _info(g: _Gen) -> Request:
    d = g.d
    kind = d.pick(("paid", "fare", "bags"))
    if kind == "paid":
        r = g.plant(pax=d.int(2, 3))
        rid = r["reservation_id"]
        total = sum(p["amount"] for p in r["payment_history"])
        per_pax = sum(s["price"] for s in r["flights"])
        return Request("info", f"How much did I pay in total for {g.name_reservation(rid)}?", "answer",
                       reads=[Call("get_reservation_details", {"reservation_id": rid})],
                       communicate=[money(total)], details=f"The reservation id is {rid}.",
                       message=f"For reservation {rid} you paid a total of {money(total)}.",
                       wrong_message=f"For reservation {rid} you paid a total of {money(per_pax)}.")
    if kind == "fare":
        routes = [rt for rt in g.idx["routes"] if len(g.idx["by_route"][rt]) >= 2]
        if not routes:
            raise Retry
        route, day, cabin = d.pick(routes), d.pick(g.idx["future"]), d.pick(CABINS)
        prices = sorted(g.status(n, day)["prices"][cabin] for n in g.idx["by_route"][route] if g.bookable(n, day))
        if len(prices) < 2 or prices[0] == prices[-1]:
            raise Retry
        c = cabin.replace("_", " ")
        asked = ("What is the cheapest fare for a trip I'm planning?" if g.withhold else
                 f"What is the cheapest {c} fare from {route[0]} to {route[1]} on {day}?")
        return Request("info", f"{asked} Just the price, please; I'm not booking yet.", "answer",
                       reads=[Call("search_direct_flight", {"origin": route[0], "destination": route[1], "date": day})],
                       communicate=[money(prices[0])], details=f"{route[0]} to {route[1]}, {day}, {c}.",
                       message=f"The cheapest {c} fare from {route[0]} to {route[1]} on {day} is {money(prices[0])}"
                               f" per passenger (the lowest fare is {money(prices[0])}).",
                       wrong_message=f"The cheapest {c} fare from {route[0]} to {route[1]} on {day}: the "
                                     f"fare is {money(prices[-1])} per passenger.")
    r = g.plant()
    rid = r["reservation_id"]
    pax = len(r["passengers"])
    membership = g.user["membership"]
    per = free_bags(membership, r["cabin"])
    allowance = per * pax
    bad = next((b for b in [per] + [free_bags(m, r["cabin"]) * pax for m in MEMBERSHIPS] if b != allowance), None)
    return Request("info", f"How many checked bags can I bring for free on {g.name_reservation(rid)}?", "answer",
                   reads=[Call("get_reservation_details", {"reservation_id": rid})],
                   communicate=[f"{allowance} free checked bag"], details=f"The reservation id is {rid}.",
                   message=f"As a {membership} member in {r['cabin'].replace('_', ' ')}, each passenger gets {per}; "
                           f"reservation {rid} includes {allowance} free checked bag(s) in total.",
                   wrong_message=None if bad is None else
                   f"Reservation {rid} includes {bad} free checked bag(s) in total.")


FAMILIES: dict[str, Callable[[_Gen], Request]] = {
    "cancel": _cancel, "flight_change": _flight_change, "cabin_change": _cabin_change, "baggage": _baggage,
    "booking": _booking, "passenger_update": _passenger_update, "compensation": _compensation,
    "flight_status": _flight_status, "info": _info,
}


# ==================================================================== task assembly
def _texts(task: TauTask, lacks: tuple[str, ...]) -> str:
    """The normalised text an agent lacking ``lacks`` says to the user (what the communicate check reads)."""
    from ..agents import plan_turns

    return " ".join(t for t in plan_turns(task, lacks) if isinstance(t, str) and not t.startswith("<tool_call>")
                    ).lower().replace(",", "")


def _consistent(task: TauTask) -> bool:
    """Communicate facts behave as ``needs`` says (no fact is said by accident in another message)."""
    facts = [f.lower().replace(",", "") for f in task.communicate]
    if not facts:
        return True
    oracle = _texts(task, ())
    if not all(f in oracle for f in facts):
        return False
    if any(r.wrong_message is not None for r in task.requests):
        wrong = _texts(task, ("structured_data_reasoning",))
        if all(f in wrong for f in facts):
            return False
    later = task.requests[1:]
    if later and not any(r.decision == "act" for r in later) and any(r.communicate for r in later):
        stopped = _texts(task, ("multi_step_completion",))
        if all(f in stopped for f in facts):
            return False
    return True


def generate_task(rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask:
    """One airline task for ``scenarios`` (see the module docstring); plants its records in ``db``."""
    if db.changes:
        raise ValueError("generate_task needs a fresh layer (it plants records and undoes failed attempts)")
    for _ in range(50):
        try:
            task = _draw(rng, db, scenarios, size)
        except Retry:
            task = None
        if task is not None and _consistent(task):
            return task
        db.changes.clear()  # undo this attempt's plants and draw again
    raise RuntimeError("could not generate a consistent airline task in 50 attempts; the DB may be too small")


class AirlineRequestSession(RequestSession):
    """Airline requests one at a time for one user (see :class:`~trace_envs.domains.task.RequestSession`).

    Args:
        rng: the episode's generator.
        db: the task's initial layer (fresh; requests plant their records in it).
        size: the DB size dict (for ``refusal_prob``/``bundle_prob`` defaults).
        user_id: the user (default: drawn).
        distractor_prob: chance that a request names its reservation by description and a second
            reservation of the user exists (the structured-data-reasoning variant); 0 = always by id.
    """

    domain = "airline"
    families = SCENARIOS

    def __init__(self, rng: np.random.Generator, db: Layer, size: dict | None = None, user_id: str | None = None,
                 distractor_prob: float = 0.45):
        self.g = _Gen(rng, db, size or {})
        self.g.distractor_prob = distractor_prob
        self.g.user_id = user_id or self.g.d.pick(self.g.idx["users"])
        self.user_id = self.g.user_id
        self.db = db

    def _snapshot(self) -> Any:
        return copy_json(self.db.changes), set(self.g.used)

    def _restore(self, state: Any) -> None:
        self.db.changes.clear()
        self.db.changes.update(state[0])
        self.g.used = state[1]

    def _build(self, family: str, refuse: bool | None) -> Request:
        default = self.g.mix["refusal_prob"]
        if refuse is not None:
            self.g.mix["refusal_prob"] = 1.0 if refuse else 0.0
        try:
            return self.g.build(family)
        finally:
            self.g.mix["refusal_prob"] = default

    def task(self, requests: list[Request], scenario: str, opening: str | None = None) -> TauTask:
        if not requests:
            raise ValueError("a task needs at least one request")
        user = self.g.user
        name = f"{user['name']['first_name']} {user['name']['last_name']}"
        greeting = self.g.d.pick(("Hi!", "Hello.", "Hi there,", "Good afternoon."))
        task = TauTask(
            task_id=f"airline-{scenario}-{self.g.d.int(0, 10**9)}", domain="airline", scenario=scenario,
            user=UserScenario(persona=f"{name}, a {user['membership']} member",
                              known_info={"user_id": self.user_id, "name": name},
                              opening=opening if opening is not None else f"{greeting} {requests[0].text}",
                              instructions="Raise your requests one at a time, in order."),
            requests=requests, auth=[Call("get_user_details", {"user_id": self.user_id})], auth_message=AUTH_MESSAGE)
        if not _consistent(task):
            raise CannotBuild("a communicate fact is said by accident in another message")
        return task


def request_session(rng: np.random.Generator, db: Layer, size: dict | None = None, user_id: str | None = None,
                    describe_prob: float | None = None) -> AirlineRequestSession:
    """An :class:`AirlineRequestSession` (the capability envs' uniform request-building API).

    ``describe_prob``: chance that a request names its record by description with a look-alike
    record present (the structured-data-reasoning variant); None = the domain's default (0.45).
    """
    return AirlineRequestSession(rng, db, size, user_id, 0.45 if describe_prob is None else describe_prob)


def _draw(rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask:
    g = _Gen(rng, db, size)
    g.user_id = g.d.pick(g.idx["users"])
    n = 1
    if g.d.chance(g.mix["bundle_prob"]):
        n = 2 if g.d.chance(0.6) else 3
    kinds = [g.d.pick(scenarios) for _ in range(n)]
    requests = [g.build(k) for k in kinds]
    user = g.user
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    greeting = g.d.pick(("Hi!", "Hello.", "Hi there,", "Good afternoon."))
    known = {"user_id": g.user_id, "name": name}
    first = requests[0]
    scenario = kinds[0] if n == 1 else "bundle:" + "+".join(kinds)
    return TauTask(
        task_id=f"airline-{scenario}-{g.d.int(0, 10**9)}", domain="airline", scenario=scenario,
        user=UserScenario(persona=f"{name}, a {user['membership']} member", known_info=known,
                          opening=f"{greeting} {first.text}",
                          instructions="Raise your requests one at a time, in order."),
        requests=requests, auth=[Call("get_user_details", {"user_id": g.user_id})], auth_message=AUTH_MESSAGE)


# ==================================================================== τ²-bench's own data
_KNOWN_PATTERNS = {
    "user_id": re.compile(r"user id is:?\s*'?([a-z]+_[a-z]+_\d+)"),
    "reservation_id": re.compile(r"(?:reservation|confirmation) (?:number|id) is:?\s*([A-Z0-9]{6})\b"),
    "name": re.compile(r"(?:You are|Your name is)\s+([A-Z][a-z]+ [A-Z][a-z]+)"),
}


def load_tau2(path: Path) -> tuple[dict[str, dict[str, dict]], list[TauTask]]:
    """τ²-bench's airline ``db.json`` and ``tasks.json`` as our tables and :class:`TauTask`s.

    Gold writes come from each task's evaluation actions; reads before a write become that
    request's reads, so the oracle replays τ²-bench's gold actions in order.
    """
    path = Path(path)
    tables = json.loads((path / "db.json").read_text())
    raw_tasks = json.loads((path / "tasks.json").read_text())
    tasks = []
    for raw in raw_tasks:
        scenario = raw["user_scenario"]
        instr = scenario.get("instructions") or {}
        if isinstance(instr, str):
            instr = {"task_instructions": instr}
        known_text = instr.get("known_info") or ""
        known = {k: m.group(1) for k, p in _KNOWN_PATTERNS.items() if (m := p.search(known_text))}
        criteria = raw.get("evaluation_criteria") or {}
        actions = [Call(a["name"], dict(a.get("arguments") or {})) for a in criteria.get("actions") or []]
        basis = tuple(b for b in (criteria.get("reward_basis") or ("DB", "COMMUNICATE"))
                      if b in ("DB", "COMMUNICATE", "ACTION"))
        facts = [str(f) for f in criteria.get("communicate_info") or []]
        reason = (instr.get("reason_for_call") or "").strip()
        requests: list[Request] = []
        pending: list[Call] = []
        for call in actions:
            if call.name in WRITE_TOOLS:
                requests.append(Request("tau2", reason if not requests else "Also, please go ahead with the next "
                                        "change.", "act", reads=pending, write=call,
                                        message=f"I will now run {call.name}.", done_message="Done."))
                pending = []
            elif call.name != "transfer_to_human_agents":
                pending.append(call)
        answer = "Here is what I found: " + ", ".join(facts) + "." if facts else "I have handled your request."
        if not requests:
            requests.append(Request("tau2", reason, "answer", reads=pending, message=answer, communicate=facts))
        else:
            requests[-1].done_message = answer if facts else "Done."
            requests[-1].communicate = facts
        tasks.append(TauTask(
            task_id=str(raw["id"]), domain="airline", scenario="tau2",
            user=UserScenario(persona=str(scenario.get("persona") or ""), known_info=known,
                              opening=reason or "Hi, I need help with my booking.",
                              instructions="\n".join(f"{k}: {v}" for k, v in instr.items() if v)),
            requests=requests,
            auth=[Call("get_user_details", {"user_id": known["user_id"]})] if "user_id" in known else [],
            auth_message=AUTH_MESSAGE if "user_id" in known else "",
            reward_basis=basis or ("DB",),
            gold_actions=[c for c in actions if c.name in WRITE_TOOLS],
        ))
    return tables, tasks


__all__ = ["SCENARIOS", "FAMILIES", "generate_task", "load_tau2", "FREE_BAGS", "request_session",
           "AirlineRequestSession"]
