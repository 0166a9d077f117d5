"""Every bundled recipe opens with a short header a user can read before copying it: at most 12
comment lines before the first table, saying what it trains, the commands that run it, and where its
documentation is. Measurements and tuning notes belong in docs/benchmarks/, not in the recipe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ditty.config.bundled import bundled_recipes

ROOT = Path(__file__).resolve().parents[2]
MAX_HEADER_COMMENTS = 12


def header(path: Path) -> list[str]:
    """The comment lines before the first table (or array of tables) of a recipe."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            break
        if line.lstrip().startswith("#"):
            lines.append(line.lstrip().lstrip("#").strip())
    return lines


@pytest.mark.parametrize("recipe", bundled_recipes(), ids=lambda r: r.name)
def test_the_header_is_short_and_says_how_to_run_it_and_where_to_read_more(recipe):
    lines = header(recipe.path)
    assert len(lines) <= MAX_HEADER_COMMENTS, (
        f"{recipe.name}: {len(lines)} comment lines before the first table (at most {MAX_HEADER_COMMENTS}); "
        "move measurements and tuning notes to a dated file in docs/benchmarks/"
    )
    text = "\n".join(lines)
    assert lines[0].startswith(f"{recipe.name}: "), "the first line names the recipe and says what it trains"
    assert f"ditty run {recipe.name}" in text, "the header shows the command that trains it"
    pages = re.findall(r"\bdocs/[\w./-]+\.md\b", text)
    assert pages, "the header links its documentation page (docs/...md)"
    for page in pages:
        assert (ROOT / page).is_file(), f"{recipe.name}: {page} does not exist"


def test_the_header_counts_comments_only_before_the_first_table(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("# one\n#\n# two\n\n[run]\n# inside a table: not the header\nseed = 0\n")
    assert header(recipe) == ["one", "", "two"]
