"""The airline tools: τ²-bench's names, arguments and read/write semantics.

Reads return records as stored (never copied: the serializer turns them into
the tool message). Writes validate everything first and only then mutate
(``Layer.edit`` / ``Layer.insert``), so a failed call leaves the database
unchanged. Like τ²-bench's, the tools enforce only what the data itself
forbids (unknown ids, no seats, an unknown or short payment method, a
mismatched passenger count): the *policy* rules — who may cancel, that basic
economy cannot be modified, who gets compensation — are the agent's to check.
"""

from __future__ import annotations

import json
from typing import Literal, TypedDict

from ...core.tools import ToolError, tool
from ..bounds import MAX_BAGS_PER_PASSENGER, check_amount, check_count
from ..db import Layer
from ..generic import GenericTools
from .db import AIRPORTS, CABINS, EXTRA_BAG_PRICE, INSURANCE_PRICE, NOW


class FlightInfo(TypedDict):
    """One flight segment of a reservation.

    Attributes:
        flight_number: the flight number, such as 'HAT001'.
        date: the date of the flight, 'YYYY-MM-DD'.
    """

    flight_number: str
    date: str


class Passenger(TypedDict):
    """A passenger.

    Attributes:
        first_name: the passenger's first name.
        last_name: the passenger's last name.
        dob: the passenger's date of birth, 'YYYY-MM-DD'.
    """

    first_name: str
    last_name: str
    dob: str


class Payment(TypedDict):
    """One payment toward a booking.

    Attributes:
        payment_id: the id of a payment method in the user's profile, such as 'credit_card_7815826'.
        amount: the amount to charge to it, in dollars.
    """

    payment_id: str
    amount: float


_AIRPORT_LIST = [{"iata": code, "city": city} for code, city in AIRPORTS]
# Reservation ids handed out by book_reservation: the first one not yet taken, so the id is a
# deterministic function of the database (replaying the gold writes gives the same ids).
_NEW_IDS = tuple(f"HAT{a}{b}{c}" for a in "HIJKLMNOPQRSTUVWXYZ" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_CERTIFICATE_BASE = 7_000_001


# JSON text of records of frozen base databases (generated and cached, or loaded from τ²-bench's
# db.json), keyed by id(record) with the record kept alive next to it. Base records never change
# (episodes write to copy-on-write layers), so a read of an untouched record is a dict lookup
# instead of a serialization; records copied into a layer are serialized on every read.
_JSON_CACHE: dict[int, tuple[dict, str]] = {}
_JSON_CACHE_LIMIT = 50_000
# Flight numbers by (origin, destination) per base database (layers never add flights or change routes).
_ROUTE_INDEX: dict[int, tuple[dict, dict]] = {}


def _root_of(db: Layer) -> dict:
    node = db
    while isinstance(node, Layer):
        node = node.parent
    return node  # type: ignore[return-value]


# τ²-bench's own ids for what its tools create (used in τ²-compatible mode, so that a gold action that
# refers to a reservation or certificate made earlier in the task finds it under the same id).
TAU2_NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
TAU2_NEW_CERTIFICATE_NUMBERS = (3221322, 3221323, 3221324)


class AirlineTools(GenericTools):
    """The airline agent's tools over one episode's database layer.

    Args:
        db: the episode's copy-on-write layer (tables ``flights``, ``users``, ``reservations``).
        tau2_compat: accept and reject what τ²-bench's tools accept and reject, and create records under
            its ids (see :mod:`trace_envs.domains.tau2_compat` for every difference). Off: the stricter
            tools documented below (an empty flight list, a second cancellation, more paid bags than bags,
            a zero certificate are errors the agent can act on).
    """

    def __init__(self, db: Layer, tau2_compat: bool = False):
        self.db = db
        self.tau2_compat = tau2_compat
        self._root = _root_of(db)

    def _read(self, table: str, record: dict, key: str):
        """A record as the tool's output: cached JSON text when it is an untouched base record."""
        if self._root.get(table, {}).get(key) is not record:
            return record
        hit = _JSON_CACHE.get(id(record))
        if hit is not None and hit[0] is record:
            return hit[1]
        if len(_JSON_CACHE) >= _JSON_CACHE_LIMIT:
            _JSON_CACHE.clear()
        text = json.dumps(record, ensure_ascii=False)
        _JSON_CACHE[id(record)] = (record, text)
        return text

    def _route(self, origin: str, destination: str) -> list[str]:
        hit = _ROUTE_INDEX.get(id(self._root))
        if hit is None or hit[0] is not self._root:
            index: dict[tuple[str, str], list[str]] = {}
            for number, f in self._root.get("flights", {}).items():
                index.setdefault((f["origin"], f["destination"]), []).append(number)
            if len(_ROUTE_INDEX) > 16:
                _ROUTE_INDEX.clear()
            hit = _ROUTE_INDEX[id(self._root)] = (self._root, index)
        return hit[1].get((origin, destination), [])

    # ------------------------------------------------------------------ lookups (not tools)
    def _user(self, user_id: str) -> dict:
        user = self.db.get("users", user_id)
        if user is None:
            raise ToolError(f"user {user_id!r} not found. Ask the user for their user id (e.g. 'mia_li_3668').")
        return user

    def _reservation(self, reservation_id: str) -> dict:
        reservation = self.db.get("reservations", reservation_id)
        if reservation is None:
            raise ToolError(f"reservation {reservation_id!r} not found. Reservation ids are 6 characters, "
                            "e.g. '4WQ150'; the user's reservations are listed in get_user_details.")
        return reservation

    def _flight(self, flight_number: str) -> dict:
        flight = self.db.get("flights", flight_number)
        if flight is None:
            raise ToolError(f"flight {flight_number!r} not found. Flight numbers look like 'HAT001'; "
                            "use search_direct_flight or search_onestop_flight to find flights.")
        return flight

    def _charge(self, record: dict, user: dict, payment_id: str, method: dict, amount: float) -> None:
        """Record a payment (or, if negative, a refund) of ``amount`` on a reservation being edited; a gift
        card's balance moves with it. Nothing happens for a zero amount."""
        if amount:
            record["payment_history"].append({"payment_id": payment_id, "amount": amount})
            if method["source"] == "gift_card":
                m = self.db.edit("users", user["user_id"])["payment_methods"][payment_id]
                m["amount"] = round(m["amount"] - amount, 2)

    def _bookable(self, flight_number: str, day: str, cabin: str, seats: int) -> int:
        """The current price per passenger of a flight-date in a cabin, after checking it can be booked."""
        status = self._flight(flight_number)["dates"].get(day)
        if status is None:
            raise ToolError(f"flight {flight_number} does not operate on {day}.")
        if status["status"] != "available":
            raise ToolError(f"flight {flight_number} on {day} cannot be booked (status: {status['status']}).")
        if status["available_seats"][cabin] < seats:
            raise ToolError(f"flight {flight_number} on {day} has only {status['available_seats'][cabin]} "
                            f"{cabin} seat(s) left; {seats} needed.")
        return status["prices"][cabin]

    def _payment_method(self, user: dict, payment_id: str) -> dict:
        method = user["payment_methods"].get(payment_id)
        if method is None:
            raise ToolError(f"payment method {payment_id!r} is not in the profile of user {user['user_id']}; "
                            f"available: {', '.join(user['payment_methods']) or 'none'}.")
        return method

    # ------------------------------------------------------------------ reads
    @tool
    def get_user_details(self, user_id: str) -> dict | str:
        """Get the details of a user: profile, payment methods, saved passengers, membership and reservation ids.

        Args:
            user_id: the user id, such as 'sara_doe_496'.
        """
        return self._read("users", self._user(user_id), user_id)

    @tool
    def get_reservation_details(self, reservation_id: str) -> dict | str:
        """Get the details of a reservation: flights, passengers, payments, baggage, insurance and status.

        Args:
            reservation_id: the reservation id, such as '8JX2WO'.
        """
        return self._read("reservations", self._reservation(reservation_id), reservation_id)

    @tool
    def list_all_airports(self) -> list:
        """List all airports served, with their IATA codes and cities."""
        return _AIRPORT_LIST

    def _day_offer(self, flight: dict, day: str) -> dict | None:
        status = flight["dates"].get(day)
        if status is None or status["status"] != "available":
            return None
        return {"flight_number": flight["flight_number"], "origin": flight["origin"],
                "destination": flight["destination"], "status": "available",
                "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"], "date": day,
                "available_seats": status["available_seats"], "prices": status["prices"]}

    @tool
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list:
        """Search direct flights between two cities on a date (only flights that can still be booked).

        Args:
            origin: the origin airport's IATA code, such as 'JFK'.
            destination: the destination airport's IATA code, such as 'LAX'.
            date: the date of the flight, 'YYYY-MM-DD'.
        """
        out = []
        for number in self._route(origin, destination):
            offer = self._day_offer(self.db.get("flights", number), date)  # type: ignore[arg-type]
            if offer is not None:
                out.append(offer)
        return out

    @tool
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list:
        """Search one-stop connections between two cities departing on a date (bookable flights only).

        The second flight leaves the connecting airport after the first one lands, on the same day
        (or the next day when the first flight lands after midnight).

        Args:
            origin: the origin airport's IATA code, such as 'JFK'.
            destination: the destination airport's IATA code, such as 'LAX'.
            date: the date of the first flight, 'YYYY-MM-DD'.
        """
        from .db import add_days

        self._route(origin, destination)  # builds the index
        index = _ROUTE_INDEX[id(self._root)][1]
        out = []
        for (a, b), numbers in index.items():
            if a != origin or b == destination:
                continue
            seconds = index.get((b, destination), ())
            for first_number in numbers:
                first = self.db.get("flights", first_number)
                leg1 = self._day_offer(first, date)  # type: ignore[arg-type]
                if leg1 is None:
                    continue
                arrival = first["scheduled_arrival_time_est"]  # type: ignore[index]
                day2 = add_days(date, 1) if arrival.endswith("+1") else date
                arrival = arrival[:8]
                for second_number in seconds:
                    second = self.db.get("flights", second_number)
                    if day2 == date and second["scheduled_departure_time_est"] <= arrival:  # type: ignore[index]
                        continue
                    leg2 = self._day_offer(second, day2)  # type: ignore[arg-type]
                    if leg2 is not None:
                        out.append([leg1, leg2])
        return out

    @tool
    def get_flight_status(self, flight_number: str, date: str) -> str:
        """Get the status of a flight on a date: available, on time, delayed, flying, landed or cancelled.

        Args:
            flight_number: the flight number, such as 'HAT001'.
            date: the date of the flight, 'YYYY-MM-DD'.
        """
        status = self._flight(flight_number)["dates"].get(date)
        if status is None:
            raise ToolError(f"flight {flight_number} does not operate on {date}.")
        return status["status"]

    # ------------------------------------------------------------------ writes
    @tool(write=True)
    def book_reservation(self, user_id: str, origin: str, destination: str,
                         flight_type: Literal["one_way", "round_trip"],
                         cabin: Literal["basic_economy", "economy", "business"], flights: list[FlightInfo],
                         passengers: list[Passenger], payment_methods: list[Payment], total_baggages: int,
                         nonfree_baggages: int, insurance: Literal["yes", "no"]) -> dict:
        """Book a reservation.

        Args:
            user_id: the id of the user booking, such as 'sara_doe_496'.
            origin: the IATA code of the trip's origin, such as 'SFO'.
            destination: the IATA code of the trip's destination, such as 'JFK'.
            flight_type: 'one_way' or 'round_trip'.
            cabin: 'basic_economy', 'economy' or 'business' (the same for every flight).
            flights: every flight segment of the trip, outbound and return, in order.
            passengers: every passenger on the reservation.
            payment_methods: the payment methods and amounts; they must add up to the total price.
            total_baggages: the total number of checked bags.
            nonfree_baggages: the number of checked bags that are paid for ($50 each).
            insurance: whether to add travel insurance ($30 per passenger), 'yes' or 'no'.
        """
        user = self._user(user_id)
        compat = self.tau2_compat  # τ²-bench books an empty flight list, no passengers, more paid bags than bags
        if not flights and not compat:
            raise ToolError("a reservation needs at least one flight.")
        if not passengers and not compat:
            raise ToolError("a reservation needs at least one passenger.")
        max_bags = MAX_BAGS_PER_PASSENGER * max(1, len(passengers))
        total_baggages = check_count("total_baggages", total_baggages, max_bags)
        nonfree_baggages = check_count("nonfree_baggages", nonfree_baggages, max_bags)
        if nonfree_baggages > total_baggages and not compat:
            raise ToolError("baggage counts must satisfy 0 <= nonfree_baggages <= total_baggages.")
        for p in payment_methods:
            check_amount(f"the amount for {p['payment_id']}", p["amount"])
            if compat and p["amount"] != int(p["amount"]):  # τ²-bench's Payment model holds whole dollars
                raise ToolError(f"the amount for {p['payment_id']} must be a whole number of dollars, "
                                f"got {p['amount']}.")
        segments, seen = [], set()
        for f in flights:
            key = (f["flight_number"], f["date"])
            if key in seen and not compat:
                raise ToolError(f"flight {key[0]} on {key[1]} is listed twice.")
            seen.add(key)
            price = self._bookable(f["flight_number"], f["date"], cabin, len(passengers))
            flight = self._flight(f["flight_number"])
            segments.append({"origin": flight["origin"], "destination": flight["destination"],
                             "flight_number": f["flight_number"], "date": f["date"], "price": price})
        total = (sum(s["price"] for s in segments) * len(passengers)
                 + (INSURANCE_PRICE * len(passengers) if insurance == "yes" else 0)
                 + EXTRA_BAG_PRICE * nonfree_baggages)
        charges: dict[str, float] = {}
        for p in payment_methods:
            method = self._payment_method(user, p["payment_id"])
            if p["amount"] < 0:
                raise ToolError(f"payment amounts cannot be negative ({p['payment_id']}: {p['amount']}).")
            charges[p["payment_id"]] = charges.get(p["payment_id"], 0) + p["amount"]
            # τ²-bench checks each payment against the balance on its own; we check what they add up to
            due = p["amount"] if compat else charges[p["payment_id"]]
            if method["source"] in ("gift_card", "certificate") and method["amount"] < due:
                raise ToolError(f"{p['payment_id']} has a balance of {method['amount']}, "
                                f"less than the {due} to charge.")
        paid = sum(p["amount"] for p in payment_methods)
        if (paid != total) if compat else abs(paid - total) > 1e-6:
            raise ToolError(f"the payments add up to {paid}, but the total price is {total} "
                            f"(flights {sum(s['price'] for s in segments)} x {len(passengers)} passenger(s)"
                            f"{', insurance' if insurance == 'yes' else ''}, {nonfree_baggages} paid bag(s)).")
        reservation_id = next((r for r in (TAU2_NEW_RESERVATION_IDS if compat else _NEW_IDS)
                               if self.db.get("reservations", r) is None), None)
        if reservation_id is None:
            raise ToolError("no reservation id is left; the database is full." if not compat else
                            "too many reservations: τ²-bench allows at most 3 new ones per task.")
        # -- all checks passed: mutate
        record = {
            "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
            "flight_type": flight_type, "cabin": cabin, "flights": segments,
            "passengers": [dict(p) for p in passengers],
            "payment_history": [{"payment_id": p["payment_id"], "amount": p["amount"]} for p in payment_methods],
            "created_at": NOW, "total_baggages": total_baggages, "nonfree_baggages": nonfree_baggages,
            "insurance": insurance,
        }
        for f in flights:
            self.db.edit("flights", f["flight_number"])["dates"][f["date"]]["available_seats"][cabin] -= len(passengers)
        editable = self.db.edit("users", user_id)
        if compat:  # τ²-bench charges each payment entry as it comes (a repeated method is charged twice)
            charges = {}
            for p in payment_methods:
                charges.setdefault(p["payment_id"], []).append(p["amount"])
        for pid, amount in charges.items():
            method = editable["payment_methods"].get(pid)
            if method is None:  # (τ²-compatible: a certificate listed twice is removed once)
                continue
            if method["source"] == "gift_card":
                method["amount"] = round(method["amount"] - (sum(amount) if compat else amount), 2)
            elif method["source"] == "certificate":  # a certificate is used up; its remainder is not refunded
                del editable["payment_methods"][pid]
        editable["reservations"].append(reservation_id)
        self.db.insert("reservations", reservation_id, record)
        return record

    @tool(write=True)
    def cancel_reservation(self, reservation_id: str) -> dict:
        """Cancel a whole reservation; every payment is refunded to its original method.

        Args:
            reservation_id: the reservation id, such as 'ZFA04Y'.
        """
        reservation = self._reservation(reservation_id)
        # τ²-bench cancels a cancelled reservation again (refunding the refunds); we say it is done already
        if reservation.get("status") == "cancelled" and not self.tau2_compat:
            raise ToolError(f"reservation {reservation_id} is already cancelled.")
        record = self.db.edit("reservations", reservation_id)
        record["payment_history"].extend(
            [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in list(record["payment_history"])])
        record["status"] = "cancelled"
        return record

    @tool(write=True)
    def update_reservation_baggages(self, reservation_id: str, total_baggages: int, nonfree_baggages: int,
                                    payment_id: str) -> dict:
        """Update the checked bags of a reservation; each new paid bag costs $50.

        Args:
            reservation_id: the reservation id, such as 'ZFA04Y'.
            total_baggages: the new total number of checked bags.
            nonfree_baggages: the new number of paid checked bags.
            payment_id: the payment method for the extra bags (a credit card or gift card in the profile).
        """
        reservation = self._reservation(reservation_id)
        max_bags = MAX_BAGS_PER_PASSENGER * max(1, len(reservation["passengers"]))
        check_count("total_baggages", total_baggages, max_bags)
        check_count("nonfree_baggages", nonfree_baggages, max_bags)
        if nonfree_baggages > total_baggages and not self.tau2_compat:
            raise ToolError("baggage counts must satisfy 0 <= nonfree_baggages <= total_baggages.")
        user = self._user(reservation["user_id"])
        method = self._payment_method(user, payment_id)
        cost = EXTRA_BAG_PRICE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        if method["source"] == "certificate":
            raise ToolError("certificates cannot pay for baggage; use a credit card or a gift card.")
        if method["source"] == "gift_card" and method["amount"] < cost:
            raise ToolError(f"gift card {payment_id} has a balance of {method['amount']}, less than the {cost} due.")
        record = self.db.edit("reservations", reservation_id)
        record["total_baggages"] = total_baggages
        record["nonfree_baggages"] = nonfree_baggages
        self._charge(record, user, payment_id, method, cost)
        return record

    @tool(write=True)
    def update_reservation_flights(self, reservation_id: str, cabin: Literal["basic_economy", "economy", "business"],
                                   flights: list[FlightInfo], payment_id: str) -> dict:
        """Update the flights and/or cabin of a reservation; the fare difference is charged or refunded.

        Flights that stay the same in the same cabin keep their original price; every other flight
        is priced at its current fare.

        Args:
            reservation_id: the reservation id, such as 'ZFA04Y'.
            cabin: the cabin for every flight of the reservation.
            flights: the complete list of flight segments after the change, including unchanged ones.
            payment_id: the payment method for the difference (a credit card or gift card in the profile).
        """
        reservation = self._reservation(reservation_id)
        compat = self.tau2_compat  # τ²-bench accepts an empty flight list (a full refund) and repeated flights
        if not flights and not compat:
            raise ToolError("the reservation needs at least one flight.")
        pax = len(reservation["passengers"])
        kept = {(s["flight_number"], s["date"]): s for s in reservation["flights"]}
        segments, seen = [], set()
        for f in flights:
            key = (f["flight_number"], f["date"])
            if key in seen and not compat:
                raise ToolError(f"flight {key[0]} on {key[1]} is listed twice.")
            seen.add(key)
            old = kept.get(key)
            if old is not None and cabin == reservation["cabin"]:
                segments.append(dict(old))
                continue
            price = self._bookable(f["flight_number"], f["date"], cabin, pax)
            flight = self._flight(f["flight_number"])
            segments.append({"origin": flight["origin"], "destination": flight["destination"],
                             "flight_number": f["flight_number"], "date": f["date"], "price": price})
        user = self._user(reservation["user_id"])
        method = self._payment_method(user, payment_id)
        if method["source"] == "certificate":
            raise ToolError("certificates cannot pay for a flight change; use a credit card or a gift card.")
        difference = (sum(s["price"] for s in segments) - sum(s["price"] for s in reservation["flights"])) * pax
        if method["source"] == "gift_card" and method["amount"] < difference:
            raise ToolError(f"gift card {payment_id} has a balance of {method['amount']}, "
                            f"less than the {difference} due.")
        record = self.db.edit("reservations", reservation_id)
        record["flights"] = segments
        record["cabin"] = cabin
        self._charge(record, user, payment_id, method, difference)
        return record

    @tool(write=True)
    def update_reservation_passengers(self, reservation_id: str, passengers: list[Passenger]) -> dict:
        """Update the passengers of a reservation (the number of passengers cannot change).

        Args:
            reservation_id: the reservation id, such as 'ZFA04Y'.
            passengers: the complete passenger list after the update, in order.
        """
        reservation = self._reservation(reservation_id)
        if len(passengers) != len(reservation["passengers"]):
            raise ToolError(f"reservation {reservation_id} has {len(reservation['passengers'])} passenger(s); "
                            f"the update lists {len(passengers)}. The number of passengers cannot change.")
        record = self.db.edit("reservations", reservation_id)
        record["passengers"] = [dict(p) for p in passengers]
        return record

    @tool(write=True)
    def send_certificate(self, user_id: str, amount: float) -> str:
        """Send a travel certificate (credit for a future booking) to a user, as compensation.

        Args:
            user_id: the id of the user, such as 'sara_doe_496'.
            amount: the certificate's value, in dollars.
        """
        user = self._user(user_id)
        amount = check_amount("the certificate amount", amount, allow_zero=self.tau2_compat)
        if self.tau2_compat:
            # τ²-bench: its typed model stores the amount as a float (50 and 50.0 are the same certificate),
            # under the first free id of three
            pid = next((f"certificate_{n}" for n in TAU2_NEW_CERTIFICATE_NUMBERS
                        if f"certificate_{n}" not in user["payment_methods"]), None)
            if pid is None:
                raise ToolError("too many certificates: τ²-bench allows at most 3 new ones per task.")
            self.db.edit("users", user_id)["payment_methods"][pid] = {"id": pid, "amount": float(amount),
                                                                       "source": "certificate"}
            return f"Certificate {pid} added to user {user_id} with amount {amount}."
        number = _CERTIFICATE_BASE
        while f"certificate_{number}" in user["payment_methods"]:
            number += 1
        pid = f"certificate_{number}"
        self.db.edit("users", user_id)["payment_methods"][pid] = {"source": "certificate", "id": pid,
                                                                   "amount": amount}
        return f"Certificate {pid} worth ${amount} added to user {user_id}."

    # ------------------------------------------------------------------ generic


assert set(CABINS) == {"basic_economy", "economy", "business"}
