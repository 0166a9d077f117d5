"""`make test` and `make test-quick` run the same tests but the slow ones, the way the docs say, and
their workers keep each xdist group together."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def make_recipe(target: str) -> str:
    """The command lines of one Makefile target."""
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, f"no target {target} in the Makefile"
    return match.group(1)


def test_quick_tier_is_the_full_run_without_the_slow_marker():
    full, quick = make_recipe("test"), make_recipe("test-quick")
    assert "-m pytest -n 2 --dist loadgroup" in full and "-m " not in full.split("pytest", 1)[1]
    assert '-m pytest -n 2 --dist loadgroup -q -m "not slow"' in quick  # the same workers and grouping
    marker = re.search(r'^\s*"slow: (.*)",$', (REPO / "pyproject.toml").read_text(), re.M)
    assert marker and "make test-quick" in marker.group(1)  # registered, and says who skips it


def test_the_docs_say_what_test_quick_skips():
    page = " ".join((REPO / "docs" / "getting-started.md").read_text().split())
    assert "`make test-quick` skips the tests marked `slow`" in page
    record = "benchmarks/2026-11-26-test-suite-time.md"
    assert f"[Test suite time]({record})" in page and "## Test suite time" in (REPO / "docs" / record).read_text()


# `make test` runs `pytest -n 2 --dist loadgroup`: tests marked xdist_group("parallel") (each starts
# several processes) share one worker, so two multi-process tests never run at once on two cores.
# When a pytest release stops xdist from grouping, nothing says so: the tests spread over both
# workers and fail now and then (a rank killed, a memory bound missed). This test says so.
@pytest.mark.xdist_group("suite_grouping")
def test_xdist_keeps_a_group_on_one_worker(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("the suite is not run with `-n N --dist loadgroup` (a worker of `make test` is)")
    assert request.node.nodeid.endswith("@suite_grouping"), (
        f"xdist's --dist loadgroup did not group this test (no @group suffix on {request.node.nodeid!r}) "
        f"under pytest {version('pytest')} and pytest-xdist {version('pytest-xdist')}: "
        "pytest-dev/pytest-xdist#1386; install the dev extra's pytest (pip install -e '.[dev]')"
    )
