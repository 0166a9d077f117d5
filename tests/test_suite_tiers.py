"""`make test` and `make test-quick` run the same tests but the slow ones, the way the docs say."""

from __future__ import annotations

import re
from pathlib import Path

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
