"""The recipe reference is one table per recipe section, generated from the config classes: every
field of every section (and of its sub-tables and arrays of tables) has a row with its type, its
default as TOML and its docstring, and the rows say what a key needs of the other keys."""

from __future__ import annotations

import re
from pathlib import Path

from ditty.config.root import TrainerConfig
from ditty.config.schema import fields_of, walk_leaves
from ditty.recipe.reference_tables import recipe_tables, reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def rows_by_table() -> dict[str, dict[str, str]]:
    """{table header: {key: its row}} of the rendered Markdown."""
    out: dict[str, dict[str, str]] = {}
    header = None
    for line in reference_markdown().splitlines():
        heading = re.match(r"^#{2,3} `(\[.*\])`$", line)
        if heading:
            header = heading.group(1)
            out[header] = {}
        elif header and (row := re.match(r"^\| `([\w-]+)` \|", line)):
            out[header][row.group(1)] = line
    return out


def test_every_field_of_every_section_has_a_row_in_its_table():
    tables = rows_by_table()
    for section in fields_of(TrainerConfig):
        assert f"[{section.name}]" in tables, f"no table for [{section.name}]"
    for leaf in walk_leaves(TrainerConfig):
        section, key = leaf.path.rsplit(".", 1)
        assert key in tables[f"[{section}]"], f"{leaf.path} is missing from the table [{section}]"
    sources = tables["[[data.sources]]"]
    assert {"path", "weight", "name", "val_path"} <= set(sources)
    assert "use" in tables["[[pipeline.loss]]"]


def test_a_row_holds_the_type_the_default_and_the_docstring():
    rows = rows_by_table()
    lr = rows["[optimizer]"]["lr"]
    assert "| float |" in lr and "learning rate" in lr.lower(), lr
    kind = rows["[rl]"]["importance"]  # a choice: its values in the type column
    assert '"token", "sequence"' in kind and '`"token"`' in kind, kind
    assert "| `unset` |" in rows["[model]"]["path"]
    assert all(row.count(" | ") >= 3 for table in rows.values() for row in table.values())


def test_what_a_key_needs_is_said_beside_it():
    rows = rows_by_table()
    assert "vllm" in rows["[rollout]"]["max_staleness"].split("*")[-2], rows["[rollout]"]["max_staleness"]
    assert 'rollout.backend = "vllm" or "vllm-server"' in rows["[rollout]"]["sampler_correction"]
    assert "Refused with" in rows["[parallel]"]["tp"], rows["[parallel]"]["tp"]  # the support table's rows
    assert "Refused with" in rows["[quant]"]["kind"]  # the compatibility table's


def test_the_page_is_generated_and_the_class_reference_moved_to_the_python_api():
    page = (ROOT / "docs" / "recipes" / "reference.md").read_text()
    assert "<!-- ditty-recipe-reference -->" in page and ":::" not in page
    api = (ROOT / "docs" / "python-api" / "config.md").read_text()
    assert "::: ditty.config.root.TrainerConfig" in api
    assert len(recipe_tables()) < 40  # a table per section, not a contents entry per attribute
