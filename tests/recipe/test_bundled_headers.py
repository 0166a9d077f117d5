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


NUMBER_WORDS = "two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".split()
COUNTED = re.compile(
    rf"\b(?:({'|'.join(NUMBER_WORDS)})(?: bundled)? recipes\b|all ({'|'.join(NUMBER_WORDS)})\b)", re.IGNORECASE
)


def test_every_count_of_the_bundled_recipes_in_the_docs_is_right():
    """getting-started said "all ten" of thirteen: a page that counts the bundled recipes counts them all."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    counted = len(bundled_recipes())
    for page in pages:
        if "benchmarks" in page.parts:  # dated records of their day
            continue
        for match in COUNTED.finditer(page.read_text(encoding="utf-8")):
            word = (match.group(1) or match.group(2)).lower()
            assert NUMBER_WORDS.index(word) + 2 == counted, (
                f"{page.relative_to(ROOT)}: {match.group(0)!r}, not {counted}"
            )


def _figures(text: str) -> list[str]:
    return re.findall(r"\b\d+\.\d+\b", text)


def _same(short: str, figure: str) -> bool:
    """`short` is `figure` rounded (half up) to its decimals."""
    from decimal import ROUND_HALF_UP, Decimal

    return Decimal(figure).quantize(Decimal(short), rounding=ROUND_HALF_UP) == Decimal(short)


@pytest.mark.parametrize("recipe", bundled_recipes(), ids=lambda r: r.name)
def test_what_ditty_ls_says_a_recipe_reaches_is_what_the_docs_say(recipe):
    """`ditty ls` quoted tiny_reward's 0.930 where docs/recipes/bundled.md says 0.844: the figures of a
    recipe's first line appear in its row there, and the last of them (outside parentheses) is the
    headline of what it reaches (the "reaches" cell up to its first parenthesis or semicolon)."""
    said = re.sub(r"\([^)]*\)", "", recipe.description)
    figures = _figures(said)
    header, row = None, None
    for line in (ROOT / "docs/recipes/bundled.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| recipe |"):
            header = line
        elif line.startswith(f"| `{recipe.name}` |"):
            row = line
            break
    if not figures or row is None:
        return

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    reaches = cells(row)[cells(header).index("reaches")]
    headline = re.split(r"[(;]", reaches)[0]
    everywhere = _figures(row)
    for figure in figures:
        assert any(_same(figure, f) for f in everywhere), f"{recipe.name}: ls says {figure}, its row: {row}"
    assert any(_same(figures[-1], f) for f in _figures(headline)), (
        f"{recipe.name}: ditty ls says it reaches {figures[-1]}, docs/recipes/bundled.md: {headline.strip()!r}"
    )
