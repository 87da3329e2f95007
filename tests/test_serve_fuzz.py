"""`trace serve`'s HTTP API fuzzed from its own OpenAPI schema with schemathesis (issue 58).

A real server on 127.0.0.1 (uvicorn in a thread) serving one env id, so a reset that names none plays a real
env with whatever seed, kwargs and options schemathesis makes up. Every route, a bounded number of examples
each: no answer may be a 5xx, and every answer must match the schema (status codes, content type, body).
"""

from __future__ import annotations

import pytest

pytest.importorskip("openenv", reason="the serve extra (pip install 'trace-rl[serve]') is part of `all`")
schemathesis = pytest.importorskip("schemathesis", reason="the dev extra (pip install 'trace-rl[dev]')")

import itertools  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from schemathesis.checks import positive_data_acceptance  # noqa: E402

from trace_envs.adapters.openenv_server import ServerThread, build_app  # noqa: E402

TAU = "trace/tau_airline-v0"


EXAMPLES = 40  # per route


def test_no_route_answers_a_5xx_or_off_its_schema():
    ran: dict[str, int] = {}
    with ServerThread(build_app([TAU], max_sessions=4, idle_timeout_s=30)) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
        for result, mode in itertools.product(list(schema.get_all_operations()), GenerationMode):
            operation = result.ok()  # positive (schema-valid) requests, then negative (schema-invalid) ones
            label = f"{operation.label} ({mode.value})"
            ran[label] = 0

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, derandomize=True)
            def call(case):
                ran[label] += 1
                # not_a_server_error, status_code_conformance, content_type_conformance,
                # response_schema_conformance, negative_data_rejection, ...: a failure raises, naming the check and
                # the request. Left out: positive_data_acceptance, which takes any schema-valid request for one
                # the server must accept; a reset's extra keys are gym.make kwargs (the schema allows any), and
                # which ones an env takes depends on the env, so a kwarg it does not take is a 400 that names them.
                case.call_and_validate(timeout=30, excluded_checks=[positive_data_acceptance])

            try:
                call()
            except Unsatisfiable:  # a route without parameters or body has no schema-invalid request
                assert mode is GenerationMode.NEGATIVE, label
                del ran[label]
    routes = {label.split(" (")[0] for label in ran}
    assert len(routes) >= 8 and {"POST /reset", "POST /step", "POST /mcp", "GET /state"} <= routes, ran
    assert ran["POST /reset (positive)"] > 10 and ran["POST /step (negative)"] > 10, ran
    print("schemathesis examples per route:", ran)
