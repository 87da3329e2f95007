"""A pytest plugin that writes each test's explicit status to a JSON file.

Copied into every SWE sandbox image (``/opt/trace/lib``) and loaded with
``-p trace_pytest_report``. It exists because parsing pytest's console output
is how SWE-style graders came to count a test missing from the output as
passed: here a test counts as passed only if pytest reported its setup, call
and teardown as passed. Anything else is recorded as such: ``failed``,
``error`` (setup or teardown failed), ``skipped``, ``xfail``, ``xpass``; a test
the run never reached (a crash, a timeout) is simply absent, and graders
treat absent as failed.

The report path comes from the ``TRACE_PYTEST_REPORT`` environment variable.
The grader loads this file by its absolute path before the repository is on
``sys.path`` (``sandbox_pytest.py``); the report file is opened, and what writes
it is bound, when pytest configures, before any test module is imported.
This file must import nothing but the standard library: it runs inside the
sandbox's Python, not TRACE's.
"""

import json
import os

_dumps = json.dumps
_REPORT = {"fh": None}

_STATUS = {}
_COLLECT_ERRORS = []


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            status = "xfail" if report.skipped else "xpass"
        else:
            status = report.outcome  # passed / failed / skipped
        if _STATUS.get(nodeid) in (None, "pending"):
            _STATUS[nodeid] = status
    elif report.failed:
        _STATUS[nodeid] = "error"
    elif report.when == "setup":
        _STATUS[nodeid] = "skipped" if report.skipped else "pending"


def pytest_collectreport(report):
    if report.failed:
        _COLLECT_ERRORS.append(report.nodeid)


def pytest_configure(config):
    path = os.environ.get("TRACE_PYTEST_REPORT")
    if path and _REPORT["fh"] is None:
        _REPORT["fh"] = open(path, "w", encoding="utf-8")


def pytest_sessionfinish(session, exitstatus):
    fh = _REPORT["fh"]
    if fh is None:
        return
    # "pending" = setup passed but no call was ever reported: not a pass.
    statuses = {k: ("error" if v == "pending" else v) for k, v in _STATUS.items()}
    fh.seek(0)  # whatever else wrote to the file meanwhile is overwritten and cut off
    fh.write(_dumps({"tests": statuses, "collect_errors": _COLLECT_ERRORS, "exitstatus": int(exitstatus)}))
    fh.truncate()
    fh.close()
    _REPORT["fh"] = None
