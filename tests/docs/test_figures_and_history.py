"""How-to pages say how; the dated records under docs/benchmarks/ say how much. A how-to page holds at
most 8 three-decimal figures (0.973), all of them together at most 40, and a page that quotes any
links the record it comes from. No page or record speaks of the project's own history (an issue's
number, a round, a session, "the first CPU"): a reader cannot look those up."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RECORDS = DOCS / "benchmarks"
FIGURE = re.compile(r"\b0\.[0-9]{3}\b")
PER_PAGE, IN_ALL = 8, 40
HISTORY = re.compile(
    r"\bissues? #?\d+|\bround[- ]\d+\b|\bfirst CPU\b|\bsessions?\b|\bthe lead's\b|\bhelper session\b",
    re.IGNORECASE,
)


def how_to_pages() -> list[Path]:
    """README.md, RELIABILITY.md (the reliability page includes it) and every page but the records."""
    return [
        ROOT / "README.md",
        ROOT / "RELIABILITY.md",
        *sorted(p for p in DOCS.rglob("*.md") if RECORDS not in p.parents),
    ]


def test_how_to_pages_hold_few_figures_and_link_their_records():
    counts = {page: len(FIGURE.findall(page.read_text(encoding="utf-8"))) for page in how_to_pages()}
    crowded = {str(page.relative_to(ROOT)): n for page, n in counts.items() if n > PER_PAGE}
    assert not crowded, f"more than {PER_PAGE} three-decimal figures: move the results to docs/benchmarks/ {crowded}"
    assert sum(counts.values()) <= IN_ALL, f"{sum(counts.values())} three-decimal figures in the how-to pages"
    for page, n in counts.items():
        if n:
            assert re.search(r"benchmarks/20\d\d-\d\d-\d\d-[\w-]+\.md", page.read_text(encoding="utf-8")), (
                f"{page.relative_to(ROOT)} quotes {n} figure(s) and links no benchmark record"
            )


def test_no_page_or_record_speaks_of_the_project_s_history():
    found = []
    for page in [*how_to_pages(), *sorted(RECORDS.glob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if match := HISTORY.search(line):
                found.append(f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "rewrite as plain facts:\n" + "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    assert len(FIGURE.findall("0.973 and 0.97, 0.9731, 10.973")) == 1
    for said in ("issue 37's target", "round 3", "on the first CPU", "this session's tests", "Issue #12"):
        assert HISTORY.search(said), said
    assert not HISTORY.search("pytest-dev/pytest-xdist#1386 and the issues it names")
