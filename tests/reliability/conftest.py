"""`trial`: each fault test fills in what it injected and what came out; the fixture appends the
record (with whether the test passed) to $DITTY_RELIABILITY_RECORD for tools/reliability_table.py."""

from __future__ import annotations

import pytest

from tests.reliability.helpers import write_record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.passed_call = report.passed


@pytest.fixture
def trial(request):
    """A dict to fill: fault, injected (how), lost_steps, exit_code (and anything else)."""
    record: dict = {"test": request.node.nodeid}
    yield record
    if "fault" in record:
        record["survived"] = bool(getattr(request.node, "passed_call", False))
        write_record(record)
