"""The offline labeler: rule-based NA / PRESENT / LACKING labels for TRACE's built-in capabilities.

No LLM, no hidden information. It reads what a human analyst reads in a trajectory file — the
conversation, the tool calls in order, their arguments set against the records the agent itself
retrieved, the tool errors, the policy in the system prompt, and the requests as the user stated
them — and never ``record["task"]`` (the generator's scenario and ``needs``, which are the ground
truth the analysis is checked against).

Capabilities and their rules (τ²-style customer service; the policy is the one in the system prompt):

``tool_calling_precision``
    LACKING when a tool call fails on its arguments (wrong type, missing field, an id that does not
    exist, malformed JSON, unknown tool) and the agent never makes that call succeed afterwards, or
    when the episode ended on too many rejected turns in a row (termination ``too_many_errors``: an
    action the env could not read leaves no message, so the termination is the evidence).
    PRESENT when the agent called tools and every such failure was fixed. NA without tool calls.
``precondition_verification``
    LACKING when the agent attempts a write the policy forbids given the records it had read (a
    cancellation with none of the four grounds, a flight change on basic economy or after departure,
    removing bags, changing the passenger count, a certificate without eligibility or disruption, a
    change to another customer's order or account, an order in the wrong status), or a write without
    an explicit "yes" from the user (a call the tool rejected for its arguments wrote nothing and does not
    count as a write without consent; its intent is still checked against the policy). A bag removal is
    this capability's failure, not an arithmetic one; certificate eligibility is read from the
    reservation the request is about. PRESENT when every write was allowed. NA without writes.
``structured_data_reasoning``
    LACKING when a write or an answer contradicts the data the agent retrieved: acting on a record
    that matches the user's description less well than another record it read, a flight status other
    than the one ``get_flight_status`` returned, a flight that is not
    the cheapest/earliest when the user asked for it, the wrong passenger or item variant, a
    miscomputed bag count, certificate amount, total, fare or count. Products are matched as whole
    phrases whatever punctuation follows them, each product once per order, and a trip described as
    one-way does not match a round trip. PRESENT when a write or a checkable answer rested on
    retrieved data and no such contradiction was found. NA when it retrieved nothing, or when nothing
    it did rested on what it retrieved (reading a profile and then stalling shows no reading error).
``multi_step_completion``
    LACKING when the user raises a further request and the agent replies without doing anything
    about it (no tool call, no specific information) — the request is dropped. PRESENT when the user
    made several requests and each was taken up. NA with a single request.

``swe_localization`` (repository repair envs): LACKING when the agent submits without having edited
any file, or every edit it made was outside the files named in the failing tests' tracebacks and
the issue; PRESENT when it edited a file it had located from the issue or the test output; NA
without any repository interaction.

Each label comes with a reason (the evidence), used in the report and in the capability specs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from .transcript import Event, parse_events

NA, PRESENT, LACKING = "NA", "PRESENT", "LACKING"
LABELS = (NA, PRESENT, LACKING)


@dataclass(frozen=True)
class CapabilityDef:
    """A capability of the dictionary.

    Attributes:
        name: snake_case name.
        definition: what an agent with the capability does (one or two sentences).
        family: which env family's trajectories it applies to (``tau`` or ``swe``; ``any`` for induced ones).
    """

    name: str
    definition: str
    family: str = "any"


BUILTIN_CAPABILITIES: dict[str, CapabilityDef] = {c.name: c for c in (
    CapabilityDef("structured_data_reasoning",
                  "Reads the retrieved records correctly: acts on the record the user means, picks the option "
                  "the user asked for (cheapest, earliest, the described variant), and computes amounts and "
                  "counts from the data without error.", "tau"),
    CapabilityDef("multi_step_completion",
                  "Carries a conversation with several requests through to the end: every request the user "
                  "raises is taken up and completed, not just the first.", "tau"),
    CapabilityDef("precondition_verification",
                  "Checks the policy's preconditions against the records before any write (eligibility, "
                  "status, ownership, explicit confirmation) and refuses what the policy forbids.", "tau"),
    CapabilityDef("tool_calling_precision",
                  "Sends tool calls whose arguments match the schema and the data exactly (types, required "
                  "fields, existing ids), and corrects a call the tool rejected.", "tau"),
    CapabilityDef("swe_localization",
                  "Finds the code responsible for a failing behaviour from the issue and the test output "
                  "before editing, and edits that code rather than unrelated files.", "swe"),
)}

TAU_CAPABILITIES = ("structured_data_reasoning", "multi_step_completion", "precondition_verification",
                    "tool_calling_precision")


@dataclass
class Verdict:
    """One label and the evidence for it."""

    label: str
    reason: str = ""


# ============================================================================ helpers
AIRLINE_WRITES = {"book_reservation", "cancel_reservation", "update_reservation_baggages",
                  "update_reservation_flights", "update_reservation_passengers", "send_certificate"}
RETAIL_WRITES = {"cancel_pending_order", "modify_pending_order_address", "modify_pending_order_items",
                 "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
                 "exchange_delivered_order_items"}
_WRITE_VERBS = ("book", "cancel", "update", "modify", "send", "return", "exchange", "create", "delete", "set",
                "add", "remove", "transfer_funds", "pay")
# Errors that say the call itself was wrong (not that the policy or the state forbade it).
_ARGUMENT_ERROR = re.compile(r"invalid arguments|missing required|must be a json|unknown tool|not found|"
                             r"cannot parse|expected|is not a variant|is not in order|has \d+ item\(s\) but|"
                             r"is empty|invalid reason|no user with|no user named|not a valid", re.I)
_CONFIRMATION = re.compile(r"^\s*(yes|yeah|yep|sure|ok|okay|correct|confirmed|i confirm|please go ahead|go ahead)\b",
                           re.I)
_IDENTITY = re.compile(r"^\s*my (user id|email|e-mail|name|full name|zip code|zip|postal code|reservation id|order id|"
                       r"customer id) is\b", re.I)
_MONEY = re.compile(r"\$\s?(\d[\d,]*(?:\.\d+)?)")
_SPECIFIC = re.compile(r"\d|#W|\b[A-Z0-9]{6}\b")
_HEALTH_WEATHER = re.compile(r"sick|ill\b|illness|health|doctor|medical|hospital|injur|storm|weather|hurricane|"
                             r"snow|flood|typhoon|tornado", re.I)


def _is_write(name: str, domain: str) -> bool:
    if domain == "airline":
        return name in AIRLINE_WRITES
    if domain == "retail":
        return name in RETAIL_WRITES
    return name.split("_")[0] in _WRITE_VERBS


def _amounts(text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in _MONEY.findall(text or "")]


def _close(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) < 0.011


def _has_phrase(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words, case-insensitive, whatever punctuation is around it
    ("the Desk Lamp." and "the Desk Lamp, please" both name the Desk Lamp; "Lamp" alone does not)."""
    phrase = " ".join(str(phrase).lower().split())
    if not phrase:
        return False
    pattern = r"(?<![a-z0-9])" + r"\s+".join(map(re.escape, phrase.split(" "))) + r"(?![a-z0-9])"
    return re.search(pattern, (text or "").lower()) is not None


def _clause_after(text: str, word: str) -> str:
    """The clause that follows ``word`` in ``text``, up to the next punctuation mark or " from "/" in "
    ("everything except the Bookshelf from my order with the Skateboard" keeps only the Bookshelf)."""
    low = (text or "").lower()
    i = low.find(f" {word} ")
    if i < 0:
        return ""
    rest = low[i + len(word) + 2:]
    return re.split(r"[,.;:!?]|\s(?:from|in|on|of) my\b|\s(?:from|in) (?:the )?order\b", rest, maxsplit=1)[0]


#: An agent question that asks which record a request is about ("Which reservation, flight or trip is it about?").
_WHICH = re.compile(r"(?:^|[.!?]\s+)which\b[^.!?]*\?", re.I)
#: How a user's answer to it names the record (the airline target's ``size.ask_details_prob`` answers).
_DETAIL_FLIGHT = re.compile(r"^\s*flight ([A-Z]{3}\d{3}),? on (\d{4}-\d{2}-\d{2})", re.I)
_DETAIL_RESERVATION = re.compile(r"^\s*the reservation id is ([A-Z0-9]{6})\b", re.I)


def _with_details(request: str, details: str) -> str:
    """The request as if it had named its record: a user who said "my flight" / "my reservation" and gave the
    record only when asked ("Flight HAT012, on 2024-05-15.", "The reservation id is D3NTTH.") asked about that
    flight or reservation. The answer is appended too, so its codes and dates count as the user's cues."""
    m = _DETAIL_FLIGHT.match(details)
    if m:
        request = re.sub(r"\bmy flight\b", f"flight {m.group(1)} on {m.group(2)}", request, count=1, flags=re.I)
    m = _DETAIL_RESERVATION.match(details)
    if m:
        request = re.sub(r"\bmy reservation\b", f"reservation {m.group(1)}", request, count=1, flags=re.I)
    return f"{request} {details}"


def _classify_user(text: str, asked_which: bool = False) -> str:
    """``stop``, ``confirm``, ``identity``, ``details`` (the answer to the agent's "which ...?" question: it
    names the record of the request being handled, it is not a new request) or ``request``."""
    if "###" in text:
        return "stop"
    if _CONFIRMATION.match(text):
        return "confirm"
    if asked_which and "?" not in text:
        return "details"
    sentences = [x for x in re.split(r"(?<=[.!])\s+", text.strip()) if x]
    if sentences and "?" not in text and all(_IDENTITY.match(x) for x in sentences):
        return "identity"
    return "request"


class _State:
    """What the agent had learned so far in a τ² conversation (records read, the user, the time)."""

    def __init__(self, events: list[Event], domain: str):
        self.domain = domain
        self.now: datetime | None = None
        system = next((e.text for e in events if e.kind == "system"), "")
        m = re.search(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})", system)
        if m:
            self.now = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}")
        self.user_id: str | None = None
        self.user: dict = {}
        self.records: dict[str, dict] = {}  # reservation/order id -> last read result
        self.status: dict[tuple[str, str], str] = {}  # (flight number, date) -> status
        self.searches: list[list[dict]] = []
        self.products: dict[str, dict] = {}
        self.reads = 0

    def observe(self, ev: Event) -> None:
        if not ev.ok:
            return
        r = ev.result
        args = ev.arguments or {}
        if ev.name in ("find_user_id_by_email", "find_user_id_by_name_zip") and isinstance(r, str):
            self.user_id = self.user_id or r.strip().strip('"')
        if not _is_write(ev.name, self.domain):
            self.reads += 1
        if isinstance(r, dict):
            if ev.name == "get_user_details":
                self.user = r
                self.user_id = self.user_id or r.get("user_id")
            if "reservation_id" in r and "flights" in r:
                self.records[str(r["reservation_id"])] = r
            if "order_id" in r and "items" in r:
                self.records[str(r["order_id"])] = r
            if "variants" in r and "product_id" in r:
                self.products[str(r["product_id"])] = r
            if ev.name == "get_flight_status" and "status" in r:
                self.status[(str(args.get("flight_number")), str(args.get("date")))] = str(r["status"])
        elif isinstance(r, str) and ev.name == "get_flight_status":
            self.status[(str(args.get("flight_number")), str(args.get("date")))] = r.strip().strip('"')
        elif isinstance(r, list) and ev.name.startswith("search_"):
            flights = [f for f in r if isinstance(f, dict)]
            self.searches.append(flights)
            for f in flights:
                if "status" in f and "date" in f:
                    self.status[(str(f.get("flight_number")), str(f["date"]))] = str(f["status"])

    def flight_option(self, number: str, date: str) -> tuple[dict | None, list[dict]]:
        """The search result for a flight on a date, and the list it came in."""
        for flights in reversed(self.searches):
            for f in flights:
                if str(f.get("flight_number")) == number and str(f.get("date")) == date:
                    return f, flights
        return None, []


#: Flight statuses and the words an answer states them with.
_STATUS_NAMES = {"landed": ("landed",), "cancelled": ("cancelled", "canceled"), "delayed": ("delayed",),
                 "on time": ("on time",), "flying": ("flying", "in the air"), "available": ("available", "scheduled")}


def _statuses_named(text: str) -> set[str]:
    """The flight statuses a message states (``"is in the air"`` names ``flying``)."""
    low = text.lower()
    return {status for status, words in _STATUS_NAMES.items()
            if any(re.search(rf"\b{re.escape(w)}\b", low) for w in words)}


def _cue_score(request: str, record: dict, other_ids: set[str]) -> int:
    """How many of the user's descriptive cues (airport codes, dates, product names) the record carries."""
    cues = set()
    for code in re.findall(r"\b[A-Z]{3}\b", request):
        cues.add(code.lower())
    for day in re.findall(r"\d{4}-\d{2}-\d{2}", request):
        cues.add(day)
    for number in re.findall(r"\b[A-Z]{3}\d{3}\b", request):  # a flight number the user names
        cues.add(number.lower())
    blob = str(record).lower()
    score = sum(1 for c in cues if c in blob)
    items = record.get("items") if isinstance(record.get("items"), list) else []
    # each product the user names counts once, however many units of it the order holds
    score += sum(1 for name in {str(i.get("name", "")) for i in items if isinstance(i, dict)}
                 if name and _has_phrase(request, name))
    trip = record.get("flight_type")
    low = request.lower()
    said = "one_way" if re.search(r"one[- ]way", low) else "round_trip" if re.search(r"round[- ]trip", low) else None
    if said and trip and trip != said:  # the user described another kind of trip: a contradiction, not a cue
        score -= 1
    return score


# ============================================================================ τ² rules
class _TauLabeler:
    def __init__(self, record: dict):
        self.record = record
        self.events = parse_events(record.get("messages") or [])
        names = {e.name for e in self.events if e.kind == "call"}
        env = str(record.get("env_id", ""))
        self.domain = ("airline" if "airline" in env or "get_reservation_details" in names else
                       "retail" if "retail" in env or "get_order_details" in names else "other")
        self.state = _State(self.events, self.domain)

    # -------------------------------------------------------------- walk
    def run(self) -> dict[str, Verdict]:
        precision_errors: dict[str, str] = {}  # tool -> last unfixed argument error
        policy: list[str] = []
        reasoning: list[str] = []
        writes = 0
        checked = 0
        request = ""
        requests: list[int] = []
        dropped: list[str] = []
        last_agent = ""
        last_user_kind = ""
        answered = False
        for i, ev in enumerate(self.events):
            if ev.kind == "user":
                kind = _classify_user(ev.text, asked_which=bool(request and _WHICH.search(last_agent)))
                if kind == "details":
                    request = _with_details(request, ev.text)
                if kind == "request":
                    request = ev.text
                    requests.append(i)
                    last_agent = ""  # what the agent said before this request is about an earlier one
                    if len(requests) >= 2:
                        taken = self._taken_up(i)
                        if not taken:
                            dropped.append(ev.text)
                last_user_kind = kind
                continue
            if ev.kind == "agent":
                last_agent = ev.text
                if not any(e.kind == "call" and _is_write(e.name, self.domain)
                           for e in self._segment(i)):
                    verdict = self._check_answer(ev.text, request)
                    if verdict is not None:
                        checked += 1
                        if verdict:
                            reasoning.append(verdict)
                continue
            if ev.kind != "call":
                continue
            if ev.error is not None:
                if _ARGUMENT_ERROR.search(ev.error):
                    precision_errors[ev.name] = f"{ev.name} failed: {ev.error[:160]}"
            elif ev.name in precision_errors:
                precision_errors.pop(ev.name)
            rejected = ev.error is not None and bool(_ARGUMENT_ERROR.search(ev.error))
            if _is_write(ev.name, self.domain) and ev.arguments is not None:
                writes += 1
                # A call the tool rejected for its arguments is a precision failure, but its intent is still
                # visible: the data checks read it with numeric strings as numbers and a garbled id as the
                # known record it extends (what an analyst reading the transcript would take it to mean).
                if rejected:
                    ev = self._intended(ev, last_agent)
                wrong = self._check_write_data(ev, request)
                checked += 1
                if wrong:
                    reasoning.append(wrong)
                else:
                    confirmed = last_user_kind == "confirm" and "?" in last_agent
                    # A call the tool rejected for its arguments changed nothing, so it was no write without
                    # consent (an agent that fires a malformed write and then asks is imprecise, not careless).
                    if not confirmed and not rejected:
                        policy.append(f"{ev.name} was called without an explicit yes from the user")
                    violation = self._check_policy(ev, request, rejected)
                    if violation:
                        policy.append(violation)
            elif _is_write(ev.name, self.domain):
                writes += 1
            self.state.observe(ev)
            answered = answered or ev.ok

        calls = [e for e in self.events if e.kind == "call"]
        out: dict[str, Verdict] = {}
        if self.record.get("termination") == "too_many_errors":
            # The env ended the episode on a run of rejected turns: actions it could not read as a message or
            # a tool call (malformed JSON, several calls at once) or failing calls, never corrected. An
            # unreadable action leaves no message in the transcript, so the termination is the evidence.
            last = f"; last: {list(precision_errors.values())[-1]}" if precision_errors else ""
            out["tool_calling_precision"] = Verdict(
                LACKING, "the episode ended on too many rejected turns in a row (malformed or failing tool calls, "
                         f"never corrected){last}")
        elif not calls:
            out["tool_calling_precision"] = Verdict(NA, "no tool calls")
        elif precision_errors:
            out["tool_calling_precision"] = Verdict(LACKING, "; ".join(precision_errors.values()))
        else:
            out["tool_calling_precision"] = Verdict(PRESENT, f"{len(calls)} tool calls, none left failing")
        if policy:
            out["precondition_verification"] = Verdict(LACKING, "; ".join(policy))
        elif writes:
            out["precondition_verification"] = Verdict(PRESENT, f"{writes} write(s), each allowed by the policy")
        else:
            out["precondition_verification"] = Verdict(NA, "no write attempted")
        if reasoning:
            out["structured_data_reasoning"] = Verdict(LACKING, "; ".join(reasoning))
        elif self.state.reads and checked:
            out["structured_data_reasoning"] = Verdict(PRESENT, f"{checked} decision(s) consistent with the data")
        elif self.state.reads:
            # Data was read but no write or answer rested on it: nothing shows whether it was read right.
            out["structured_data_reasoning"] = Verdict(NA, "no write or answer rested on the data it read")
        else:
            out["structured_data_reasoning"] = Verdict(NA, "no data retrieved")
        if len(requests) < 2:
            out["multi_step_completion"] = Verdict(NA, "a single request")
        elif dropped:
            out["multi_step_completion"] = Verdict(
                LACKING, "request(s) left unhandled: " + " | ".join(d[:120] for d in dropped))
        else:
            out["multi_step_completion"] = Verdict(PRESENT, f"{len(requests)} requests, each taken up")
        return out

    def _intended(self, ev: Event, announced: str) -> Event:
        args: dict[str, Any] = {}
        for k, v in (ev.arguments or {}).items():
            if isinstance(v, str) and re.fullmatch(r"-?\d+", v) and k not in ("zip", "payment_id") and \
                    not k.endswith("_id") and not k.endswith("ids"):
                v = int(v)
            elif isinstance(v, str) and k in ("reservation_id", "order_id") and v not in self.state.records:
                known = [rid for rid in self.state.records if v.startswith(rid) and rid]
                if len(known) == 1:
                    v = known[0]
            elif k == "user_id" and isinstance(v, str) and self.state.user_id and v != self.state.user_id and \
                    v.startswith(self.state.user_id):
                v = self.state.user_id
            args[k] = v
        key = "reservation_id" if self.domain == "airline" else "order_id"
        if key not in args and ev.name not in ("book_reservation", "send_certificate", "modify_user_address"):
            # the id the agent announced in the message that asked for confirmation
            named = [rid for rid in self.state.records if rid and rid in announced]
            if len(named) == 1:
                args[key] = named[0]
        return Event("call", name=ev.name, arguments=args, raw_arguments=ev.raw_arguments, error=ev.error,
                     index=ev.index)

    def _segment(self, i: int) -> list[Event]:
        """The events from the last user turn before ``i`` to the next user turn after it."""
        start = i
        while start > 0 and self.events[start - 1].kind != "user":
            start -= 1
        end = i
        while end + 1 < len(self.events) and self.events[end + 1].kind != "user":
            end += 1
        return self.events[start:end + 1]

    def _taken_up(self, i: int) -> bool:
        """Whether the agent did anything about the user request at event ``i`` before the next user turn."""
        j = i + 1
        acted = False
        while j < len(self.events) and self.events[j].kind != "user":
            ev = self.events[j]
            if ev.kind == "call" or (ev.kind == "agent" and _SPECIFIC.search(ev.text)):
                acted = True
            j += 1
        if j >= len(self.events) and i + 1 >= len(self.events):
            return False
        return acted

    # -------------------------------------------------------------- structured data
    def _target_id(self, ev: Event) -> str | None:
        args = ev.arguments or {}
        for key in ("reservation_id", "order_id"):
            if key in args:
                return str(args[key])
        return None

    def _record_mismatch(self, target: str, request: str, kind_key: str) -> str | None:
        st = self.state
        same_kind = {rid: r for rid, r in st.records.items() if kind_key in r}
        if target in request:
            return None
        named = [rid for rid in same_kind if rid in request]
        if named:
            return f"acted on {target} while the user named {named[0]}"
        if target not in same_kind or len(same_kind) < 2:
            return None
        mine = {rid: r for rid, r in same_kind.items() if st.user_id is None or r.get("user_id") in (None, st.user_id)}
        scores = {rid: _cue_score(request, r, set(same_kind)) for rid, r in mine.items()}
        if not scores or target not in scores:
            return None
        best = max(scores.values())
        if best > 0 and scores[target] < best:
            better = sorted(r for r, s in scores.items() if s == best)[0]
            return (f"acted on {target}, but {better} is the record that matches the user's description "
                    f"({best} cue(s) vs {scores[target]})")
        return None

    def _check_write_data(self, ev: Event, request: str) -> str | None:
        st, args, name = self.state, ev.arguments or {}, ev.name
        target = self._target_id(ev)
        if target is not None:
            mismatch = self._record_mismatch(target, request, "flights" if self.domain == "airline" else "items")
            if mismatch:
                return mismatch
        rec = st.records.get(target or "", {})
        low = request.lower()
        if name in ("update_reservation_flights", "book_reservation") and isinstance(args.get("flights"), list):
            old = {(s.get("flight_number"), s.get("date")) for s in rec.get("flights", [])}
            cabin = str(args.get("cabin") or rec.get("cabin") or "")
            for seg in args["flights"]:
                if not isinstance(seg, dict) or (seg.get("flight_number"), seg.get("date")) in old:
                    continue
                chosen, options = st.flight_option(str(seg.get("flight_number")), str(seg.get("date")))
                if chosen is None:
                    continue
                if "cheapest" in low or "lowest" in low:
                    price = lambda f: (f.get("prices") or {}).get(cabin)  # noqa: E731
                    pool = [f for f in options if f.get("status", "available") == "available"
                            and price(f) is not None]
                    if pool and price(chosen) is not None and price(chosen) > min(price(f) for f in pool):
                        best = min(pool, key=price)
                        return (f"{name}: chose {chosen['flight_number']} at ${price(chosen)} although "
                                f"{best['flight_number']} costs ${price(best)} (the user asked for the cheapest)")
                if "earliest" in low or "morning" in low:
                    dep = lambda f: str(f.get("scheduled_departure_time_est", ""))  # noqa: E731
                    pool = [f for f in options if f.get("status", "available") == "available"]
                    if pool and dep(chosen) > min(dep(f) for f in pool):
                        best = min(pool, key=dep)
                        return (f"{name}: chose {chosen['flight_number']} departing {dep(chosen)} although "
                                f"{best['flight_number']} departs at {dep(best)} (the user asked for the earliest)")
        if name == "update_reservation_passengers" and rec and isinstance(args.get("passengers"), list):
            before = rec.get("passengers", [])
            changed = [i for i, (a, b) in enumerate(zip(before, args["passengers"])) if a != b]
            named = [i for i, p in enumerate(before)
                     if f"{p.get('first_name', '')} {p.get('last_name', '')}".lower() in low]
            if changed and named and not set(changed) <= set(named):
                who = before[changed[0]]
                return (f"update_reservation_passengers changed {who.get('first_name')} {who.get('last_name')}, "
                        f"but the user asked about another passenger")
        if name == "update_reservation_baggages" and rec and st.user.get("membership"):
            allowance = _free_bags(st.user["membership"], str(rec.get("cabin"))) * len(rec.get("passengers", []))
            total = args.get("total_baggages")
            # Fewer bags than the reservation holds is a removal, which the policy forbids whatever the
            # paid count: that is the precondition check's finding, not an arithmetic slip.
            removal = isinstance(total, int) and total < int(rec.get("total_baggages", 0) or 0)
            if isinstance(total, int) and allowance >= 0 and not removal:
                expected = max(int(rec.get("nonfree_baggages", 0)), total - allowance)
                if args.get("nonfree_baggages") != expected:
                    return (f"update_reservation_baggages: {args.get('nonfree_baggages')} paid bag(s) for {total} "
                            f"bags, but the free allowance is {allowance} ({st.user['membership']}, "
                            f"{rec.get('cabin')}, {len(rec.get('passengers', []))} passenger(s)): {expected} paid")
        if name == "send_certificate":
            rate, pax, _ = self._disruption(request)
            amount = args.get("amount")
            if rate and pax and isinstance(amount, (int, float)) and not _close(amount, rate * pax):
                return f"send_certificate for ${amount}, but the rule gives ${rate} x {pax} passenger(s) = ${rate * pax}"
        if name in ("modify_pending_order_items", "exchange_delivered_order_items"):
            for new_id in args.get("new_item_ids") or []:
                wrong = self._variant_mismatch(str(new_id), request)
                if wrong:
                    return f"{name}: {wrong}"
        if name == "return_delivered_order_items" and rec:
            names = {str(i.get("item_id")): str(i.get("name", "")) for i in rec.get("items", [])}
            returned = [names.get(str(x), "") for x in args.get("item_ids") or []]
            if " except " in f" {low} ":
                kept = _clause_after(f" {low} ", "except")
                bad = [n for n in returned if n and _has_phrase(kept, n)]
                if bad:
                    return f"return_delivered_order_items returned the {bad[0]}, which the user wanted to keep"
            else:
                mentioned = [n for n in set(names.values()) if n and _has_phrase(low, n)]
                bad = [n for n in returned if n and mentioned and n not in mentioned]
                if bad:
                    return f"return_delivered_order_items returned the {bad[0]}, which the user did not ask about"
        if name == "modify_pending_order_payment" or (name in RETAIL_WRITES and "payment_method_id" in args):
            wrong = self._method_mismatch(str(args.get("payment_method_id", "")), request)
            if wrong:
                return f"{name}: {wrong}"
        if name == "modify_user_address":
            for rid, r in st.records.items():
                addr = r.get("address") if isinstance(r, dict) else None
                if isinstance(addr, dict) and all(args.get(k) == addr.get(k) for k in addr) and "order" in low:
                    mismatch = self._record_mismatch(rid, request, "items")
                    if mismatch:
                        return f"modify_user_address copied the address of the wrong order: {mismatch}"
        return None

    def _disruption(self, request: str = "") -> tuple[int, int, dict | None]:
        """(certificate rate, passengers, reservation) for the disrupted flight of the reservation the request
        names (else of the reservation the agent read last that has one)."""
        records = list(self.state.records.values())
        named = [r for r in records if str(r.get("reservation_id", "\0")) in request]
        for r in named or records[::-1]:
            for s in r.get("flights", []) if isinstance(r.get("flights"), list) else []:
                status = self.state.status.get((str(s.get("flight_number")), str(s.get("date"))))
                if status in ("cancelled", "delayed"):
                    return (100 if status == "cancelled" else 50), len(r.get("passengers", [])), r
        return 0, 0, None

    def _variant_mismatch(self, new_id: str, request: str) -> str | None:
        low = request.lower()
        for product in self.state.products.values():
            variants = product.get("variants") or {}
            if new_id not in variants:
                continue

            def score(v: dict) -> int:
                return sum(1 for k, val in (v.get("options") or {}).items() if f"{k} {val}".lower() in low)

            chosen = variants[new_id]
            pool = [v for v in variants.values() if v.get("available")]
            best = max((score(v) for v in pool), default=0)
            if best > score(chosen):
                return (f"chose item {new_id} ({chosen.get('options')}), which matches the options the user "
                        f"described less well than another available variant")
        return None

    def _method_mismatch(self, method_id: str, request: str) -> str | None:
        methods = self.state.user.get("payment_methods") or {}
        method = methods.get(method_id)
        if not isinstance(method, dict):
            return None
        m = re.search(r"card ending in (\d{4})", request)
        if m and method.get("source") == "credit_card" and str(method.get("last_four")) != m.group(1):
            return f"used {method_id} (ending in {method.get('last_four')}), but the user named the card ending in {m.group(1)}"
        if "my paypal" in request.lower() and method.get("source") not in ("paypal", None) and \
                "payment" in request.lower() and "original" not in request.lower():
            return f"used {method_id} ({method.get('source')}), but the user asked for PayPal"
        return None

    def _check_answer(self, text: str, request: str) -> str | None | bool:
        """For an agent message answering a question from data: a contradiction (str), ``False`` when
        consistent, ``None`` when there is nothing to check."""
        st, low, said = self.state, request.lower(), text
        amounts = _amounts(said)
        if "cheapest" in low and "fare" in low and amounts and st.searches:
            cabin = next((c for c in ("basic_economy", "economy", "business") if c.replace("_", " ") in low), None)
            if cabin and cabin == "economy" and "basic economy" in low:
                cabin = "basic_economy"
            prices = [(f.get("prices") or {}).get(cabin) for f in st.searches[-1]
                      if f.get("status", "available") == "available"]
            prices = [p for p in prices if p is not None]
            if prices:
                if not _close(amounts[0], min(prices)):
                    return f"answered ${amounts[0]} as the cheapest fare; the search shows ${min(prices)}"
                return False
        m = re.search(r"status of flight (\w+)(?: on (\d{4}-\d{2}-\d{2}))?", request, re.I)
        if m:
            number, day = m.group(1), m.group(2)
            read = [s for (n, d), s in st.status.items() if n == number and (day is None or d == day)]
            named = _statuses_named(said)
            if read and named:
                if read[-1] in named:
                    return False
                return (f"answered that flight {number} is {' / '.join(sorted(named))}; get_flight_status "
                        f"returned {read[-1]!r}")
        m = re.search(r"pay in total for reservation (\w+)", request, re.I)
        if m and m.group(1) in st.records and amounts:
            total = sum(p.get("amount", 0) for p in st.records[m.group(1)].get("payment_history", []))
            if not any(_close(a, total) for a in amounts):
                return f"answered ${amounts[0]} as the total paid; the payment history sums to ${total}"
            return False
        m = re.search(r"bags can i bring for free on reservation (\w+)", request, re.I)
        if m and m.group(1) in st.records and st.user.get("membership"):
            r = st.records[m.group(1)]
            allowance = _free_bags(st.user["membership"], str(r.get("cabin"))) * len(r.get("passengers", []))
            stated = re.findall(r"(\d+) free checked bag", said)
            if stated:
                if int(stated[-1]) != allowance:
                    return f"answered {stated[-1]} free bags; policy and data give {allowance}"
                return False
        m = re.search(r"how many (.+?) options are available", low)
        if m:
            product = next((p for p in st.products.values() if str(p.get("name", "")).lower() == m.group(1)), None)
            numbers = re.findall(r"(\d+) available", said)
            if product and numbers:
                n = sum(1 for v in (product.get("variants") or {}).values() if v.get("available"))
                if int(numbers[0]) != n:
                    return f"answered {numbers[0]} available options; the product lists {n}"
                return False
        m = re.search(r"how much does the (.+?) with (.+?) cost", low)
        if m and amounts:
            product = next((p for p in st.products.values() if str(p.get("name", "")).lower() == m.group(1)), None)
            if product:
                wanted = m.group(2)
                best = [v for v in (product.get("variants") or {}).values()
                        if all(f"{k} {val}".lower() in wanted for k, val in (v.get("options") or {}).items())]
                if best:
                    if not any(_close(a, best[0].get("price", -1)) for a in amounts):
                        return f"answered ${amounts[0]}; the described variant costs ${best[0].get('price')}"
                    return False
        if re.search(r"(status|tracking number|how much did i pay) .*my order", low) and "#w" not in low:
            orders = {rid: r for rid, r in st.records.items() if "items" in r}
            scores = {rid: _cue_score(request, r, set(orders)) for rid, r in orders.items()}
            if scores and max(scores.values()) > 0:
                best = max(scores, key=lambda k: (scores[k], k))
                values = lambda r: {str(r.get("status", ""))} | {  # noqa: E731
                    str(t) for f in r.get("fulfillments", []) for t in f.get("tracking_id", [])} | {
                    f"{p.get('amount', 0):.2f}" for p in r.get("payment_history", [])}
                mine = {v for v in values(orders[best]) if v}
                if any(v in said for v in mine):
                    return False
                for rid, r in orders.items():
                    if rid != best and any(v and v in said for v in values(r) - mine):
                        return f"answered with the data of order {rid}; the order the user described is {best}"
        return None

    # -------------------------------------------------------------- policy
    def _check_policy(self, ev: Event, request: str, rejected: bool = False) -> str | None:
        st, args, name = self.state, ev.arguments or {}, ev.name
        target = self._target_id(ev)
        rec = st.records.get(target or "")
        if name == "modify_user_address" and st.user_id and args.get("user_id") not in (None, st.user_id):
            return f"modify_user_address on account {args.get('user_id')}, which is not the authenticated user's"
        if target is not None and rec is None and not rejected and name not in ("book_reservation",):
            return f"{name} on {target} without reading the record first"
        if rec is not None and st.user_id and rec.get("user_id") not in (None, st.user_id):
            return f"{name} on {target}, which belongs to {rec.get('user_id')}, not to the authenticated user"
        if self.domain == "retail" and rec is not None:
            status = str(rec.get("status", ""))
            if name in ("cancel_pending_order", "modify_pending_order_address", "modify_pending_order_items",
                        "modify_pending_order_payment") and status != "pending":
                return f"{name} on order {target} whose status is '{status}' (only 'pending' orders)"
            if name in ("return_delivered_order_items", "exchange_delivered_order_items") and status != "delivered":
                return f"{name} on order {target} whose status is '{status}' (only 'delivered' orders)"
        if self.domain != "airline":
            return None
        if name == "cancel_reservation" and rec is not None:
            return self._cancel_violation(rec, request)
        if name == "update_reservation_flights" and rec is not None:
            new = {(s.get("flight_number"), s.get("date")) for s in args.get("flights") or [] if isinstance(s, dict)}
            old = {(s.get("flight_number"), s.get("date")) for s in rec.get("flights", [])}
            if rec.get("cabin") == "basic_economy" and new != old:
                return f"changed the flights of basic-economy reservation {target}"
            today = st.now.date().isoformat() if st.now else None
            flown = [s for s in rec.get("flights", []) if today and str(s.get("date")) < today]
            if flown:
                return f"changed reservation {target}, whose flight {flown[0].get('flight_number')} has departed"
        if name == "update_reservation_baggages" and rec is not None:
            if isinstance(args.get("total_baggages"), int) and args["total_baggages"] < int(rec.get("total_baggages", 0)):
                return f"reduced the checked bags of {target} from {rec.get('total_baggages')} (bags cannot be removed)"
        if name == "update_reservation_passengers" and rec is not None and isinstance(args.get("passengers"), list):
            if len(args["passengers"]) != len(rec.get("passengers", [])):
                return (f"changed the number of passengers of {target} from {len(rec.get('passengers', []))} to "
                        f"{len(args['passengers'])}")
        if name == "send_certificate":
            rate, _, disrupted = self._disruption(request)
            if not rate or disrupted is None:
                return "sent a certificate without a cancelled or delayed flight on the user's reservation"
            # eligibility is that of the reservation this request is about, not of another one the agent read
            # earlier in the conversation (a bundle of two compensation requests)
            eligible = st.user.get("membership") in ("silver", "gold") or \
                disrupted.get("insurance") == "yes" or disrupted.get("cabin") == "business"
            if not eligible:
                return (f"sent a certificate for reservation {disrupted.get('reservation_id')} to a regular member "
                        f"without insurance or business class on it")
        return None

    def _disrupted(self, r: dict) -> bool:
        return any(self.state.status.get((str(s.get("flight_number")), str(s.get("date")))) in ("cancelled", "delayed")
                   for s in r.get("flights", []))

    def _cancel_violation(self, rec: dict, request: str) -> str | None:
        st = self.state
        created = rec.get("created_at")
        if st.now and created:
            try:
                if st.now - datetime.fromisoformat(str(created)) <= timedelta(hours=24):
                    return None
            except ValueError:
                pass
        if rec.get("cabin") == "business":
            return None
        if self._disrupted(rec) and any(st.status.get((str(s.get("flight_number")), str(s.get("date")))) == "cancelled"
                                        for s in rec.get("flights", [])):
            return None
        if rec.get("insurance") == "yes" and _HEALTH_WEATHER.search(request):
            return None
        return (f"cancelled {rec.get('reservation_id')}: booked {created}, cabin {rec.get('cabin')}, insurance "
                f"{rec.get('insurance')}, no airline-cancelled flight seen — none of the four grounds holds")


def _free_bags(membership: str, cabin: str) -> int:
    from trace_envs.domains.airline.db import free_bags

    try:
        return free_bags(membership, cabin)
    except (KeyError, ValueError):
        return -1


# ============================================================================ SWE rules
def _label_swe(record: dict) -> dict[str, Verdict]:
    events = parse_events(record.get("messages") or [])
    calls = [e for e in events if e.kind == "call"]
    if not calls:
        return {"swe_localization": Verdict(NA, "no repository interaction")}
    text = " ".join(e.text for e in events if e.kind in ("user", "system"))
    observed = " ".join(e.text for e in calls if e.ok)
    mentioned = set(re.findall(r"[\w/.-]+\.py", text + " " + observed))
    edits = [e for e in calls if re.search(r"edit|replace|write|patch|create|insert", e.name) and e.arguments]
    edited = sorted({str(v) for e in edits for k, v in (e.arguments or {}).items()
                     if k in ("path", "file", "filename", "file_path") and isinstance(v, str)})
    if not edits:
        return {"swe_localization": Verdict(LACKING, "submitted without editing any file")}
    located = [p for p in edited if any(p.endswith(m) or m.endswith(p) for m in mentioned)]
    if not located:
        return {"swe_localization": Verdict(LACKING, f"edited {', '.join(edited) or 'files'} — none of them named "
                                                     f"by the issue, the tests or the files it inspected")}
    return {"swe_localization": Verdict(PRESENT, f"edited {', '.join(located)}, located from the issue/tests")}


# ============================================================================ the labeler
def env_family(record: dict) -> str:
    """``swe`` for repository repair trajectories, ``tau`` for customer-service ones (from the env id / tools)."""
    env = str(record.get("env_id", ""))
    if "swe" in env:
        return "swe"
    return "tau"


class OfflineLabeler:
    """Labels trajectories for the built-in capabilities by rules (see the module docstring).

    ``label(record)`` returns ``{capability: Verdict}`` for the capabilities of the record's env family;
    capabilities of another family are NA.
    """

    name = "offline"

    def capabilities(self, records: list[dict]) -> list[CapabilityDef]:
        """The built-in capabilities that apply to at least one of ``records``' env families."""
        families = {env_family(r) for r in records}
        return [c for c in BUILTIN_CAPABILITIES.values() if c.family in families]

    def label(self, record: dict) -> dict[str, Verdict]:
        family = env_family(record)
        out = {c: Verdict(NA, f"not a {BUILTIN_CAPABILITIES[c].family} trajectory") for c in BUILTIN_CAPABILITIES}
        rules: Callable[[dict], dict[str, Verdict]] = _label_swe if family == "swe" else \
            (lambda r: _TauLabeler(r).run())
        out.update(rules(record))
        return out
