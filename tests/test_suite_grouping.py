"""`make test` runs `pytest -n 2 --dist loadgroup`: tests marked xdist_group("parallel") (each starts
several processes) share one worker, so two multi-process tests never run at once on two cores. When
a pytest release stops xdist from grouping, nothing says so: the tests spread over both workers and
fail now and then (a rank killed, a memory bound missed). This test says so."""

from __future__ import annotations

from importlib.metadata import version

import pytest


@pytest.mark.xdist_group("suite_grouping")
def test_xdist_keeps_a_group_on_one_worker(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("the suite is not run with `-n N --dist loadgroup` (a worker of `make test` is)")
    assert request.node.nodeid.endswith("@suite_grouping"), (
        f"xdist's --dist loadgroup did not group this test (no @group suffix on {request.node.nodeid!r}) "
        f"under pytest {version('pytest')} and pytest-xdist {version('pytest-xdist')}: "
        "pytest-dev/pytest-xdist#1386; install the dev extra's pytest (pip install -e '.[dev]')"
    )
