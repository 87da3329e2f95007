"""lab/headline-planted/scripts/status_answers.py: the reading check counts, for the flight-status episodes whose status call returned a
status of today, how many answers state that status; a constant answer shows as right only where it is the truth.
(The routing half teacher-forces a composed model: the composer's routing statistics are tested with it.)"""

from __future__ import annotations

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def status():
    return load_script("status_answers", "lab/headline-planted/scripts")


def _episode(returned: str | None, answer: str, scenario: str = "flight_status") -> dict:
    messages = [{"role": "user", "content": "What is the status of flight HAT001 on 2024-05-15?"}]
    if returned is not None:
        messages += [{"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "get_flight_status", "arguments": "{}"}}]},
                     {"role": "tool", "name": "get_flight_status", "content": returned}]
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."},
                 {"role": "assistant", "content": "You're welcome."}]
    return {"env_id": "trace/tau_airline-v0", "seed": 0, "scenario": scenario, "messages": messages}


def test_a_constant_answer_is_right_only_where_it_is_the_truth(status):
    constant = [_episode(s, "I checked: flight HAT001 on 2024-05-15 has landed.")
                for s in ("landed", "delayed", "flying", "cancelled")]
    c = status.read_counts(constant)
    assert (c["today"], c["right"], c["stated"]) == (4, 1, {"landed": 4})


def test_only_todays_statuses_count_and_a_missing_call_is_counted_apart(status):
    records = [
        _episode("delayed", "Flight HAT001 on 2024-05-15 is delayed."),     # read right
        _episode("flying", "I checked: it is on time."),                     # read wrong
        _episode("available", "It is available."),                           # a future flight: not a reading
        _episode(None, "It has landed."),                                    # no status call
        _episode("landed", "It has landed.", scenario="info"),               # another family
    ]
    c = status.read_counts(records)
    assert c == {"flight_status": 4, "no_status_call": 1, "today": 2, "right": 1,
                 "stated": {"delayed": 1, "on time": 1}}
    assert status.stated_status(records[0]) == "delayed" and status.returned_status(records[2]) is None
