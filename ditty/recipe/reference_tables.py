"""The recipe reference as tables: one per TOML table of a recipe, a row per key with its type, its
default and its meaning, generated from the config dataclasses and their field docstrings.

What a key needs of other keys is said in its row, from the compiler's own tables: the rows of the
compatibility table (ditty.recipe.compatibility_rules), of the tensor/context-parallel support table
(ditty.recipe.scale_rules) and of the requirements the other rules check (ditty.recipe.key_requirements)
that report on the key. docs/recipes/reference.md shows `reference_markdown()` (the docs hook
tools/docs_tables.py renders it at build time), so the page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from ditty.config.schema import fields_of, is_config_class, type_name
from ditty.config.writer import format_value

UNSET = "unset"


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    meaning: str
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    header: str
    """How the table is written in TOML: `[data]`, `[data.eval]`, `[[data.sources]]`."""
    path: str
    """The dotted prefix of its keys on the command line (`data.eval`); "" for entries of an array."""
    doc: str
    rows: tuple[Row, ...]


def recipe_tables(root: type | None = None) -> list[Table]:
    """Every table of a recipe rooted at `root` (default: ditty's Trainer.Config), in the root's order;
    a section's sub-tables and arrays of tables follow it."""
    if root is None:
        from ditty.config.root import TrainerConfig

        root = TrainerConfig
    needs = _needs()
    out: list[Table] = []
    for section in fields_of(root):
        if section.is_section:
            _add(section.type, section.name, f"[{section.name}]", section.doc, needs, out)
    return out


def _add(cls: type, path: str, header: str, doc: str, needs: dict[str, list[str]], out: list[Table]) -> None:
    rows, later = [], []
    for info in fields_of(cls, f"{path}." if path else ""):
        entry = _array_entry(info.type)
        if info.is_section:
            later.append((info.type, info.path, f"[{info.path}]", info.doc))
            continue
        if entry is not None:
            later.append((entry, "", f"[[{info.path}]]", info.doc))
        rows.append(
            Row(
                info.name,
                type_name(info.type),
                _default(info.default),
                _one_line(info.doc),
                tuple(needs.get(info.path, ())),
            )
        )
    out.append(Table(header, path, _one_line(doc) or _one_line(cls.__doc__ or ""), tuple(rows)))
    for sub in later:
        _add(*sub, needs, out)


def _array_entry(tp: Any) -> type | None:
    """The dataclass of an array of tables (`list[DataSourceConfig]`), else None."""
    if typing.get_origin(tp) in (list, tuple):
        args = typing.get_args(tp)
        if args and is_config_class(args[0]):
            return args[0]
    return None


def _default(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if value is None:
        return UNSET
    if is_config_class(type(value)):
        return "its table's defaults"
    try:
        return format_value(value)
    except (ValueError, TypeError):
        return repr(value)


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


def _needs() -> dict[str, list[str]]:
    """What each dotted key needs, from the compiler's tables: {key: [sentence, ...]}."""
    from ditty.recipe.compatibility_rules import COMPAT_RULES
    from ditty.recipe.key_requirements import REQUIREMENTS
    from ditty.recipe.scale_rules import SCALE_RULES

    out: dict[str, list[str]] = {}
    for rule in [*COMPAT_RULES, *SCALE_RULES]:
        if rule.condition:
            said = "Refused" if rule.severity == "error" else "A warning"
            out.setdefault(rule.key, []).append(f"{said} with {rule.condition}.")
    for requirement in REQUIREMENTS:
        out.setdefault(requirement.key, []).append(requirement.text)
    return out


def reference_markdown(root: type | None = None) -> str:
    """The tables as Markdown: a heading per table, then key | type | default | meaning."""
    lines: list[str] = []
    for table in recipe_tables(root):
        level = "##" if table.header.count(".") == 0 else "###"
        lines += [f"{level} `{table.header}`", ""]
        if table.doc:
            lines += [table.doc, ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for row in table.rows:
            meaning = " ".join([row.meaning, *(f"*{need}*" for need in row.needs)])
            lines.append(f"| `{row.key}` | {_cell(row.type)} | `{_cell(row.default)}` | {_cell(meaning)} |")
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
