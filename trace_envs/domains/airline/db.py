"""The airline database: flights with per-date status, users, reservations.

The tables follow τ²-bench's airline data (field names, value formats and
statuses), so the same tools run on a generated database and on τ²-bench's
own ``db.json``:

* ``flights[flight_number]``: ``origin``, ``destination``, scheduled departure and
  arrival times (``"HH:MM:SS"``, arrival ``"+1"`` when it lands the next day) and
  ``dates[YYYY-MM-DD]``: ``{"status": "available", "available_seats": {...},
  "prices": {...}}`` for flights not yet taken off, else ``landed`` / ``cancelled`` /
  ``flying`` / ``delayed`` / ``on time`` with actual or estimated times;
* ``users[user_id]``: name, address, email, dob, ``payment_methods`` (credit card,
  gift card with ``amount``, certificate with ``amount``), ``saved_passengers``,
  ``membership`` (regular | silver | gold) and the ids of their ``reservations``;
* ``reservations[reservation_id]``: trip origin/destination, ``flight_type``,
  ``cabin``, ``flights`` (segments with ``price`` per passenger), ``passengers``,
  ``payment_history``, ``created_at``, ``total_baggages``, ``nonfree_baggages``,
  ``insurance`` and, once cancelled, ``status: "cancelled"``.

All randomness comes from the numpy Generator passed in (drawn in blocks, so a
small database costs well under a millisecond); names and addresses come from
Faker pools built once per process with a fixed seed.
"""

from __future__ import annotations

from datetime import date, timedelta
from functools import lru_cache

import numpy as np

#: The simulated present (EST), as in τ²-bench's airline policy.
NOW = "2024-05-15T15:00:00"
TODAY = "2024-05-15"
CABINS = ("basic_economy", "economy", "business")
MEMBERSHIPS = ("regular", "silver", "gold")
#: Free checked bags per passenger, by membership and cabin (basic economy, economy, business).
FREE_BAGS = {"regular": (0, 1, 2), "silver": (1, 2, 3), "gold": (2, 3, 4)}
EXTRA_BAG_PRICE = 50
INSURANCE_PRICE = 30
PRICE_RANGES = {"basic_economy": (50, 100), "economy": (100, 200), "business": (200, 500)}

AIRPORTS = (
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
    ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
    ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
    ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
    ("PHL", "Philadelphia"), ("LGA", "New York"),
)
CITY = dict(AIRPORTS)

#: Size presets. ``tau2`` matches τ²-bench's airline database (20 airports, 300 flights over 30 days,
#: 500 users, 2000 reservations).
SIZES = {
    "small": {"airports": 6, "flights": 16, "first_date": "2024-05-14", "days": 7, "users": 4, "reservations": 8},
    "medium": {"airports": 12, "flights": 80, "first_date": "2024-05-08", "days": 18, "users": 60,
               "reservations": 200},
    "tau2": {"airports": 20, "flights": 300, "first_date": "2024-05-01", "days": 30, "users": 500,
             "reservations": 2000},
}


def free_bags(membership: str, cabin: str) -> int:
    """Free checked bags per passenger for a membership level and cabin."""
    return FREE_BAGS[membership][CABINS.index(cabin)]


class Draw:
    """Fast scalar draws from a numpy Generator: uniforms are drawn in blocks and handed out one by one.

    Scalar calls to a Generator cost about a microsecond each; a block costs that once. The
    sequence is a pure function of the generator's state, so determinism is kept.
    """

    __slots__ = ("rng", "_block", "_i", "_n")

    def __init__(self, rng: np.random.Generator, block: int = 2048):
        self.rng, self._n = rng, block
        self._block: list[float] = []
        self._i = 0

    def u(self) -> float:
        if self._i >= len(self._block):
            self._block = self.rng.random(self._n).tolist()
            self._i = 0
        v = self._block[self._i]
        self._i += 1
        return v

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi] (both included)."""
        return lo + int(self.u() * (hi - lo + 1))

    def pick(self, seq):
        return seq[int(self.u() * len(seq))]

    def chance(self, p: float) -> bool:
        return self.u() < p

    def sample(self, seq, k: int) -> list:
        """k distinct elements of seq, in draw order."""
        pool = list(seq)
        out = []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(int(self.u() * len(pool))))
        return out


@lru_cache(maxsize=1)
def name_pools() -> dict[str, tuple]:
    """Names and addresses from Faker, built once per process with a fixed seed."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(20240515)

    def unique(make, n):
        seen: dict[str, None] = {}
        while len(seen) < n:
            seen.setdefault(make(), None)
        return tuple(seen)

    first = unique(lambda: fake.first_name().replace("'", ""), 240)
    last = unique(lambda: fake.last_name().replace("'", ""), 240)
    streets = unique(fake.street_address, 200)
    suites = unique(lambda: f"Suite {fake.random_int(100, 999)}", 150)
    places = tuple((fake.city(), fake.state_abbr(include_territories=False), fake.zipcode()) for _ in range(120))
    return {"first": first, "last": last, "streets": streets, "suites": suites, "places": places}


_DAY0 = date(2024, 5, 1)


def day_str(offset_from_may1: int) -> str:
    return (_DAY0 + timedelta(days=offset_from_may1)).isoformat()


def add_days(day: str, n: int) -> str:
    return (date.fromisoformat(day) + timedelta(days=n)).isoformat()


def _hm(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"


def _stamp(day: str, minutes: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` for ``minutes`` after midnight of ``day`` (may roll into the next day)."""
    if minutes >= 1440:
        day, minutes = add_days(day, minutes // 1440), minutes % 1440
    return f"{day}T{minutes // 60:02d}:{minutes % 60:02d}:00"


def flight_day_status(d: Draw, day: str, dep: int, arr: int) -> dict:
    """The status record of a flight on ``day`` relative to the simulated present (15:00 on May 15)."""
    if day > TODAY:
        seats = {c: d.int(0, 20) for c in CABINS}
        prices = {c: d.int(*PRICE_RANGES[c]) for c in CABINS}
        return {"status": "available", "available_seats": seats, "prices": prices}
    if d.chance(0.08):
        return {"status": "cancelled"}
    shift = d.int(-30, 45)
    if day < TODAY or dep + shift + (arr - dep) + d.int(-20, 20) < 15 * 60:
        return {"status": "landed", "actual_departure_time_est": _stamp(day, dep + shift),
                "actual_arrival_time_est": _stamp(day, arr + shift + d.int(-20, 20))}
    if dep + shift < 15 * 60:
        return {"status": "flying", "actual_departure_time_est": _stamp(day, dep + shift),
                "estimated_arrival_time_est": _stamp(day, arr + shift)}
    if d.chance(0.4):
        late = d.int(40, 240)
        return {"status": "delayed", "estimated_departure_time_est": _stamp(day, dep + late),
                "estimated_arrival_time_est": _stamp(day, arr + late)}
    return {"status": "on time", "estimated_departure_time_est": _stamp(day, dep + d.int(-5, 15)),
            "estimated_arrival_time_est": _stamp(day, arr + d.int(-5, 15))}


def _routes(d: Draw, airports: list[str], n_flights: int) -> list[tuple[str, str]]:
    """Directed routes: a ring over the airports (every airport reachable, one-stop paths exist) plus extra pairs."""
    n = len(airports)
    pairs = [(airports[i], airports[(i + 1) % n]) for i in range(n)] if n > 2 else [(airports[0], airports[1])]
    wanted = max(len(pairs), n_flights * 10 // 56)  # about 2.8 flights per directed route, as in τ²-bench
    have = set(pairs) | {(b, a) for a, b in pairs}
    tries = 0
    while len(pairs) < wanted and tries < 50 * wanted:
        tries += 1
        a, b = d.pick(airports), d.pick(airports)
        if a != b and (a, b) not in have:
            pairs.append((a, b))
            have |= {(a, b), (b, a)}
    routes = []
    for a, b in pairs:
        routes += [(a, b), (b, a)]
    return routes


def generate_db(rng: np.random.Generator, size: dict) -> dict[str, dict[str, dict]]:
    """A fresh airline database drawn from ``rng``; ``size`` is a preset from :data:`SIZES` (or alike)."""
    d = Draw(rng)
    pools = name_pools()
    n_airports = max(3, min(int(size["airports"]), len(AIRPORTS)))
    airports = sorted(code for code, _ in (AIRPORTS[i] for i in d.sample(range(len(AIRPORTS)), n_airports)))
    first = date.fromisoformat(size["first_date"])
    days = [(first + timedelta(days=i)).isoformat() for i in range(int(size["days"]))]

    # ---- flights
    n_flights = int(size["flights"])
    routes = _routes(d, airports, n_flights)
    past = [day for day in days if day <= TODAY]
    future = [day for day in days if day > TODAY]
    # Seats and prices of every bookable (future) flight-day in one vectorised draw.
    seats = rng.integers(0, 21, size=(n_flights * len(future), 3)).tolist()
    lo, hi = np.array([PRICE_RANGES[c][0] for c in CABINS]), np.array([PRICE_RANGES[c][1] for c in CABINS]) + 1
    prices = rng.integers(lo, hi, size=(n_flights * len(future), 3)).tolist()
    flights: dict[str, dict] = {}
    k = 0
    for i in range(n_flights):
        origin, destination = routes[i % len(routes)]
        dep = d.int(0, 47) * 30
        arr = dep + d.int(2, 10) * 30
        number = f"HAT{i + 1:03d}"
        dates = {day: flight_day_status(d, day, dep, arr) for day in past}
        for day in future:
            s, p = seats[k], prices[k]
            k += 1
            dates[day] = {"status": "available",
                          "available_seats": {"basic_economy": s[0], "economy": s[1], "business": s[2]},
                          "prices": {"basic_economy": p[0], "economy": p[1], "business": p[2]}}
        flights[number] = {
            "flight_number": number,
            "origin": origin,
            "destination": destination,
            "scheduled_departure_time_est": _hm(dep),
            "scheduled_arrival_time_est": _hm(arr) + ("+1" if arr >= 1440 else ""),
            "dates": dates,
        }
    by_route: dict[tuple[str, str], list[str]] = {}
    for number, f in flights.items():
        by_route.setdefault((f["origin"], f["destination"]), []).append(number)
    route_keys = list(by_route)

    # ---- users
    users: dict[str, dict] = {}
    for _ in range(int(size["users"])):
        fn, ln = d.pick(pools["first"]), d.pick(pools["last"])
        uid = f"{fn.lower()}_{ln.lower()}_{d.int(1000, 9999)}"
        while uid in users:
            uid = f"{fn.lower()}_{ln.lower()}_{d.int(1000, 9999)}"
        city, state, zipcode = d.pick(pools["places"])
        methods: dict[str, dict] = {}
        for k in range(d.int(1, 4)):
            kind = "credit_card" if k == 0 else d.pick(("credit_card", "gift_card", "certificate"))
            pid = f"{kind}_{d.int(1000000, 9999999)}"
            if kind == "credit_card":
                methods[pid] = {"source": kind, "id": pid, "brand": d.pick(("visa", "mastercard")),
                                "last_four": f"{d.int(0, 9999):04d}"}
            elif kind == "gift_card":
                methods[pid] = {"source": kind, "id": pid, "amount": float(d.int(0, 300))}
            else:
                methods[pid] = {"source": kind, "id": pid, "amount": float(d.pick((100, 150, 200, 250, 500)))}
        saved = [{"first_name": d.pick(pools["first"]), "last_name": d.pick(pools["last"]),
                  "dob": f"{d.int(1950, 2005)}-{d.int(1, 12):02d}-{d.int(1, 28):02d}"} for _ in range(d.int(0, 2))]
        users[uid] = {
            "user_id": uid,
            "name": {"first_name": fn, "last_name": ln},
            "address": {"address1": d.pick(pools["streets"]), "address2": d.pick(pools["suites"]), "city": city,
                        "country": "USA", "state": state, "zip": zipcode},
            "email": f"{fn.lower()}.{ln.lower()}{d.int(1000, 9999)}@example.com",
            "dob": f"{d.int(1950, 2002)}-{d.int(1, 12):02d}-{d.int(1, 28):02d}",
            "payment_methods": methods,
            "saved_passengers": saved,
            "membership": d.pick(MEMBERSHIPS),
            "reservations": [],
        }
    user_ids = list(users)

    # ---- reservations
    reservations: dict[str, dict] = {}
    for _ in range(int(size["reservations"])):
        user = users[d.pick(user_ids)]
        rid = new_reservation_id(d, reservations)
        origin, destination = d.pick(route_keys)
        round_trip = d.chance(0.5) and (destination, origin) in by_route
        out_i = d.int(0, len(days) - (2 if round_trip else 1))
        legs = [(origin, destination, days[out_i])]
        if round_trip:
            legs.append((destination, origin, days[min(len(days) - 1, out_i + d.int(1, 4))]))
        cabin = d.pick(CABINS)
        segments = []
        for a, b, day in legs:
            number = d.pick(by_route[(a, b)])
            status = flights[number]["dates"][day]
            price = status["prices"][cabin] if status["status"] == "available" else d.int(*PRICE_RANGES[cabin])
            segments.append({"origin": a, "destination": b, "flight_number": number, "date": day, "price": price})
        passengers = [{"first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"],
                       "dob": user["dob"]}]
        for _ in range(d.int(0, 2)):
            passengers.append({"first_name": d.pick(pools["first"]), "last_name": d.pick(pools["last"]),
                               "dob": f"{d.int(1950, 2010)}-{d.int(1, 12):02d}-{d.int(1, 28):02d}"})
        insurance = "yes" if d.chance(0.5) else "no"
        allowance = free_bags(user["membership"], cabin) * len(passengers)
        total_bags = d.int(0, allowance + 1)
        nonfree = max(0, total_bags - allowance)
        total = (sum(s["price"] for s in segments) * len(passengers)
                 + (INSURANCE_PRICE * len(passengers) if insurance == "yes" else 0) + EXTRA_BAG_PRICE * nonfree)
        pay = next(iter(user["payment_methods"]))  # every user has a credit card first
        booked = min(legs[0][2], TODAY)
        created = f"{add_days(booked, -d.int(1, 14))}T{d.int(0, 23):02d}:{d.int(0, 59):02d}:{d.int(0, 59):02d}"
        record = {
            "reservation_id": rid,
            "user_id": user["user_id"],
            "origin": origin,
            "destination": destination,
            "flight_type": "round_trip" if round_trip else "one_way",
            "cabin": cabin,
            "flights": segments,
            "passengers": passengers,
            "payment_history": [{"payment_id": pay, "amount": total}],
            "created_at": created,
            "total_baggages": total_bags,
            "nonfree_baggages": nonfree,
            "insurance": insurance,
        }
        if d.chance(0.05):
            record["status"] = "cancelled"
            record["payment_history"].append({"payment_id": pay, "amount": -total})
        reservations[rid] = record
        user["reservations"].append(rid)
    return {"flights": flights, "users": users, "reservations": reservations}


_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_reservation_id(d: Draw, taken) -> str:
    """A random 6-character reservation id for which ``taken(id)`` is false (or not ``in taken``)."""
    exists = taken if callable(taken) else taken.__contains__
    while True:
        n = int(d.u() * 2_176_782_336)  # 36 ** 6
        chars = []
        for _ in range(6):
            n, r = divmod(n, 36)
            chars.append(_ID_CHARS[r])
        rid = "".join(chars)
        if not rid.startswith("HAT") and not exists(rid):
            return rid
