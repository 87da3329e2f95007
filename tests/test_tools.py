"""The tool system: schemas from type hints and Google docstrings, validation, errors, truncation."""

from __future__ import annotations

import json
import math
from typing import Literal, Optional, TypedDict

import pytest

from trace_envs import ToolError, tool
from trace_envs.core.tools import (
    ToolSet,
    annotation_schema,
    parse_google_docstring,
    spec_from_function,
    tool_specs,
)


class FlightInfo(TypedDict):
    """One flight of a reservation.

    Attributes:
        flight_number: the flight number, such as "HAT001".
        date: the date of the flight, in the format YYYY-MM-DD.
    """

    flight_number: str
    date: str


class Passenger(TypedDict, total=False):
    """A passenger.

    Attributes:
        first_name: given name.
        dob: date of birth,
            in the format YYYY-MM-DD.
    """

    first_name: str
    dob: str


class Itinerary(TypedDict):
    """A nested object: flights inside a trip.

    Attributes:
        flights: the flights, in order.
        lead: the lead passenger.
    """

    flights: list[FlightInfo]
    lead: Passenger


class Toolkit:
    """A provider with one tool per supported annotation."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    @tool
    def search(self, origin: str, passengers: int, max_price: float, refundable: bool,
               cabin: Literal["economy", "business"], tags: list[str], extras: dict[str, int],
               note: Optional[str] = None, limit: int | None = 10) -> list[str]:
        """Search flights.

        The second paragraph of the description
        is joined into one line.

        Args:
            origin: IATA code of the departure airport,
                such as "JFK".
            passengers: how many people travel.
            max_price: the highest fare to show.
            refundable: only refundable fares.
            cabin: the cabin class.
            tags: labels to match.
            extras: extra items and their counts.
            note: a free-text note.
            limit: at most this many results.

        Returns:
            Matching flight numbers.
        """
        self.calls.append(("search", origin))
        return ["HAT001"]

    @tool(write=True)
    def book(self, flights: list[FlightInfo], trip: Itinerary | None = None) -> str:
        """Book flights.

        Args:
            flights: the flights to book.
            trip: the whole itinerary, if known.
        """
        self.calls.append(("book", flights))
        return "booked"

    @tool(name="fail_politely")
    def refuse(self) -> str:
        """Always refuses with a ToolError."""
        raise ToolError("the reservation is already cancelled; call get_reservation to check its status")

    @tool
    def crash(self) -> str:
        """Always fails unexpectedly."""
        return str(1 / 0)

    @tool
    def dump(self, size: int) -> str:
        """Return a long text.

        Args:
            size: number of characters.
        """
        return "x" * size

    def not_a_tool(self) -> str:
        return "hidden"


FLIGHT_SCHEMA = {
    "type": "object",
    "properties": {
        "flight_number": {"type": "string", "description": 'the flight number, such as "HAT001".'},
        "date": {"type": "string", "description": "the date of the flight, in the format YYYY-MM-DD."},
    },
    "required": ["flight_number", "date"],
    "additionalProperties": False,
}


def _props(name: str) -> dict:
    return tool_specs(Toolkit)[name].parameters["properties"]


def test_schema_of_primitives_literal_list_dict_optional() -> None:
    spec = tool_specs(Toolkit)["search"]
    assert spec.openai_schema["type"] == "function"
    fn = spec.openai_schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search flights.\n\nThe second paragraph of the description is joined into one line."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "origin": {"type": "string", "description": 'IATA code of the departure airport, such as "JFK".'},
            "passengers": {"type": "integer", "description": "how many people travel."},
            "max_price": {"type": "number", "description": "the highest fare to show."},
            "refundable": {"type": "boolean", "description": "only refundable fares."},
            "cabin": {"type": "string", "enum": ["economy", "business"], "description": "the cabin class."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "labels to match."},
            "extras": {"type": "object", "additionalProperties": {"type": "integer"},
                       "description": "extra items and their counts."},
            "note": {"type": ["string", "null"], "description": "a free-text note."},
            "limit": {"type": ["integer", "null"], "description": "at most this many results."},
        },
        "required": ["origin", "passengers", "max_price", "refundable", "cabin", "tags", "extras"],
        "additionalProperties": False,
    }
    assert spec.defaults == {"note": None, "limit": 10}
    assert spec.write is False


def test_schema_of_nested_typeddicts() -> None:
    spec = tool_specs(Toolkit)["book"]
    assert spec.write is True
    props = spec.parameters["properties"]
    assert props["flights"] == {"type": "array", "items": FLIGHT_SCHEMA, "description": "the flights to book."}
    itinerary = props["trip"]  # Itinerary | None: a nullable object
    assert itinerary["description"] == "the whole itinerary, if known."
    assert itinerary["type"] == ["object", "null"]
    assert itinerary["required"] == ["flights", "lead"]
    assert itinerary["properties"]["flights"]["items"] == FLIGHT_SCHEMA
    lead = itinerary["properties"]["lead"]
    assert lead["required"] == []  # total=False
    assert lead["properties"]["dob"]["description"] == "date of birth, in the format YYYY-MM-DD."


def test_compact_schema_is_short_but_validation_is_not() -> None:
    """Compact schemas drop the descriptions of arguments and ``additionalProperties: false`` (prompt tokens),
    keep names, types, enums, required fields and typed ``additionalProperties``; calls are still checked
    against the full schema."""
    full = ToolSet(Toolkit())
    compact = ToolSet(Toolkit(), compact=True)
    search = next(s for s in compact.schemas if s["function"]["name"] == "search")["function"]
    assert search["description"] == "Search flights."
    props = search["parameters"]["properties"]
    assert props["cabin"] == {"type": "string", "enum": ["economy", "business"]}
    assert props["extras"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert "additionalProperties" not in search["parameters"]
    assert search["parameters"]["required"] == tool_specs(Toolkit)["search"].parameters["required"]
    assert len(json.dumps(compact.schemas)) < 0.6 * len(json.dumps(full.schemas))
    book = next(s for s in compact.schemas if s["function"]["name"] == "book")["function"]
    assert "additionalProperties" not in json.dumps(book)
    for toolset in (full, compact):  # an unknown argument is rejected either way
        result = toolset.call("search", {"origin": "JFK", "passengers": 1, "max_price": 9.0, "refundable": True,
                                         "cabin": "economy", "tags": [], "extras": {}, "seats": 2})
        assert not result.ok and "seats" in result.content


def test_tool_names_and_order() -> None:
    assert list(tool_specs(Toolkit)) == ["search", "book", "fail_politely", "crash", "dump"]
    assert ToolSet(Toolkit()).names == ["search", "book", "fail_politely", "crash", "dump"]
    assert ToolSet(Toolkit(), exclude=("crash",)).names == ["search", "book", "fail_politely", "dump"]
    assert ToolSet(Toolkit()).is_write("book") and not ToolSet(Toolkit()).is_write("search")


def test_annotation_schema_rejects_unsupported_types() -> None:
    with pytest.raises(TypeError, match="unsupported tool argument annotation"):
        annotation_schema(set[int])


def test_google_docstring_parsing() -> None:
    description, args = parse_google_docstring("""Do a thing.

        Args:
            a (int): first,
                continued.
            b: second.

        Returns:
            nothing.
        """)
    assert description == "Do a thing."
    assert args == {"a": "first, continued.", "b": "second."}


# ---------------------------------------------------------------- validation

GOOD_SEARCH = {"origin": "JFK", "passengers": 2, "max_price": 300.0, "refundable": False, "cabin": "economy",
               "tags": ["a"], "extras": {"bags": 1}}


@pytest.mark.parametrize("name,arguments,expected", [
    ("search", {**GOOD_SEARCH, "origin": 5}, "origin must be string, got integer 5"),
    ("search", {**GOOD_SEARCH, "passengers": 2.5}, "passengers must be integer, got number 2.5"),
    ("search", {**GOOD_SEARCH, "passengers": True}, "passengers must be integer, got boolean true"),
    ("search", {**GOOD_SEARCH, "max_price": "300"}, 'max_price must be number, got string "300"'),
    ("search", {**GOOD_SEARCH, "refundable": "yes"}, 'refundable must be boolean, got string "yes"'),
    ("search", {**GOOD_SEARCH, "cabin": "first"}, 'cabin must be one of "economy", "business", got string "first"'),
    ("search", {**GOOD_SEARCH, "tags": "a"}, 'tags must be array of string, got string "a"'),
    ("search", {**GOOD_SEARCH, "tags": ["a", 3]}, "tags[1] must be string, got integer 3"),
    ("search", {**GOOD_SEARCH, "extras": {"bags": "one"}}, 'extras.bags must be integer, got string "one"'),
    ("search", {**GOOD_SEARCH, "note": 3}, "note must be string or null, got integer 3"),
    ("search", {k: v for k, v in GOOD_SEARCH.items() if k != "cabin"},
     "missing required argument 'cabin' (one of \"economy\", \"business\")"),
    ("search", {**GOOD_SEARCH, "seat": "12A"}, "unexpected argument 'seat'"),
    ("book", {"flights": [{"flight_number": "HAT001", "date": 20240501}]},
     "flights[0].date must be string, got integer 20240501"),
    ("book", {"flights": [{"flight_number": "HAT001", "date": "2024-05-01"}, {"flight_number": "HAT002"}]},
     "flights[1].date is missing (expected string)"),
    ("book", {"flights": [{"flight_number": "HAT001", "date": "2024-05-01", "seat": "1A"}]},
     "flights[0] has an unexpected field 'seat' (allowed: flight_number, date)"),
    ("book", {"flights": ["HAT001"]}, 'flights[0] must be object {flight_number, date}, got string "HAT001"'),
    ("book", {"flights": [], "trip": {"flights": [], "lead": {"dob": 19900101}}},
     "trip.lead.dob must be string, got integer 19900101"),  # inside an optional object
    ("book", {"flights": [], "trip": {"flights": [{"date": "2024-05-01"}], "lead": {}}},
     "trip.flights[0].flight_number is missing"),
    ("book", {"flights": [], "trip": ["HAT001"]}, 'trip must be object or null, got array ["HAT001"]'),
])
def test_validation_errors_name_the_path(name: str, arguments: dict, expected: str) -> None:
    kit = Toolkit()
    result = ToolSet(kit).call(name, arguments)
    assert result.ok is False
    assert result.content.startswith("Error: invalid arguments for " + name)
    assert expected in result.content, result.content
    assert "Expected: " + name + "(" in result.content  # the signature, so the agent can fix the call
    assert kit.calls == [], "an invalid call must not reach the tool"


@pytest.mark.parametrize("name,arguments", [
    ("search", GOOD_SEARCH),
    ("search", {**GOOD_SEARCH, "max_price": 300, "note": None, "limit": None}),  # int is a number; null is ok
    ("book", {"flights": [{"flight_number": "HAT001", "date": "2024-05-01"}],
              "trip": {"flights": [], "lead": {}}}),
])
def test_valid_calls_run(name: str, arguments: dict) -> None:
    kit = Toolkit()
    result = ToolSet(kit).call(name, arguments)
    assert result.ok, result.content
    assert kit.calls and kit.calls[0][0] == name
    assert result.write is (name == "book")


def test_unknown_tool_and_non_object_arguments() -> None:
    tools = ToolSet(Toolkit())
    unknown = tools.call("cancel", {})
    assert not unknown.ok and unknown.content.startswith("Error: unknown tool 'cancel'")
    assert "Available tools: search, book, fail_politely, crash, dump" in unknown.content
    assert "not_a_tool" not in unknown.content
    not_object = tools.call("dump", [5])
    assert not not_object.ok and "the arguments of dump must be a JSON object, got array [5]" in not_object.content


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, float("1e999")], ids=["nan", "inf", "-inf", "1e999"])
def test_non_finite_numbers_are_rejected_wherever_a_number_is_expected(value: float) -> None:
    kit = Toolkit()
    tools = ToolSet(kit)
    top = tools.call("search", {**GOOD_SEARCH, "max_price": value})
    assert not top.ok and f"max_price must be a finite number, got {value}" in top.content
    as_int = tools.call("search", {**GOOD_SEARCH, "passengers": value})
    assert not as_int.ok and "passengers must be integer" in as_int.content
    in_dict = tools.call("search", {**GOOD_SEARCH, "extras": {"bags": value}})
    assert not in_dict.ok and "extras.bags must be integer" in in_dict.content
    assert kit.calls == []
    # the same number, finite, is fine
    assert tools.call("search", {**GOOD_SEARCH, "max_price": 1e308}).ok


def test_a_call_with_many_problems_gets_a_short_error() -> None:
    result = ToolSet(Toolkit()).call("search", {**GOOD_SEARCH, **{f"bogus_{i}": i for i in range(5_000)}})
    assert not result.ok
    assert "and 4990 more" in result.content and len(result.content) < 2_000


def test_unknown_names_are_echoed_only_in_part() -> None:
    result = ToolSet(Toolkit()).call("n" * 60_000, {})
    assert not result.ok and "unknown tool 'nnnn" in result.content and len(result.content) < 500
    odd = ToolSet(Toolkit()).call({"deep": list(range(10_000))}, {})
    assert not odd.ok and len(odd.content) < 500


def test_arguments_too_deep_to_validate_are_an_error_not_a_raise() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    result = ToolSet(Toolkit()).call("search", {**GOOD_SEARCH, "tags": deep})
    assert not result.ok and "could not be checked" in result.content


def test_tool_error_becomes_an_error_message() -> None:
    result = ToolSet(Toolkit()).call("fail_politely", {})
    assert result.ok is False
    assert result.content == ("Error: the reservation is already cancelled; call get_reservation to check "
                              "its status")


def test_unexpected_exception_is_an_error_result_not_a_raise() -> None:
    result = ToolSet(Toolkit()).call("crash", {})
    assert result.ok is False
    assert result.content.startswith("Error: the tool failed unexpectedly (ZeroDivisionError: division by zero)")


def test_output_truncation() -> None:
    tools = ToolSet(Toolkit(), max_output_chars=100)
    short = tools.call("dump", {"size": 100})
    assert short.ok and short.content == "x" * 100
    long = tools.call("dump", {"size": 1000})
    assert long.ok
    assert long.content.startswith("x" * 100 + "\n")
    assert "[output truncated: 900 more characters]" in long.content
    assert len(long.content) < 200


def test_non_string_output_is_json() -> None:
    result = ToolSet(Toolkit()).call("search", GOOD_SEARCH)
    assert result.content == '["HAT001"]' and result.value == ["HAT001"]


# ---------------------------------------------------------------- errors at class-spec time

def test_missing_docstring_fails_at_spec_time() -> None:
    class NoDoc:
        @tool
        def lookup(self, key: str) -> str:
            return key

    with pytest.raises(TypeError, match=r"tool .*lookup: (needs a docstring|document argument)"):
        tool_specs(NoDoc)


def test_missing_description_fails_at_spec_time() -> None:
    class NoDescription:
        @tool
        def lookup(self, key: str) -> str:
            """
            Args:
                key: the key.
            """
            return key

    with pytest.raises(TypeError, match="needs a docstring describing what it does"):
        tool_specs(NoDescription)


def test_undocumented_argument_fails_at_spec_time() -> None:
    class HalfDocumented:
        @tool
        def lookup(self, key: str, default: str = "") -> str:
            """Look a key up.

            Args:
                key: the key.
            """
            return key

    with pytest.raises(TypeError, match=r"document argument\(s\) \['default'\] in an 'Args:' section"):
        ToolSet(HalfDocumented())


def test_missing_type_hint_fails_at_spec_time() -> None:
    class NoHint:
        @tool
        def lookup(self, key) -> str:
            """Look a key up.

            Args:
                key: the key.
            """
            return key

    with pytest.raises(TypeError, match="argument 'key' needs a type hint"):
        tool_specs(NoHint)


def test_duplicate_tool_names_fail_at_spec_time() -> None:
    class Twice:
        @tool
        def a(self) -> str:
            """A."""
            return "a"

        @tool(name="a")
        def b(self) -> str:
            """B."""
            return "b"

    with pytest.raises(TypeError, match="two tools are named 'a'"):
        tool_specs(Twice)


def test_spec_from_plain_function() -> None:
    def add(a: int, b: int = 1) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    spec = spec_from_function(add)
    assert spec.name == "add" and spec.required == ("a",)
    assert spec.signature_text() == "add(a: integer, b: integer (optional))"
