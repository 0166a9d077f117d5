"""Writing a config tree back to TOML: `ditty init` and the run directory's `recipe.toml`.

tomli-w formats the values but writes no comments and has no `None`, so the layout is ours: one
table per section, each field preceded by its docstring as a comment, and an unset optional field
written as a commented-out line (loading the file gives it back as unset, so the round trip holds).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Any

import tomli_w

from ditty.config.loader import TRAINER_KEY
from ditty.config.schema import field_docs, is_config_class

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # used with fullmatch: `$` would accept a trailing newline
_WRAP = 96


def recipe_to_toml(config: Any, *, trainer: str | None = None, comments: bool = True, header: str = "") -> str:
    """The complete recipe for `config`, re-loadable into an equal config."""
    out: list[str] = []
    if header:
        out += [f"# {line}".rstrip() for line in header.splitlines()] + [""]
    if trainer:
        out += [f"{TRAINER_KEY} = {format_value(trainer)}", ""]
    _write_table(config, "", out, comments)
    return "\n".join(out).rstrip() + "\n"


def _write_table(section: Any, path: str, out: list[str], comments: bool) -> None:
    docs = field_docs(type(section))
    scalars: list[dataclasses.Field] = []
    subtables: list[dataclasses.Field] = []
    arrays_of_tables: list[dataclasses.Field] = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if is_config_class(type(value)):
            subtables.append(f)
        elif isinstance(value, list) and value and all(is_config_class(type(v)) for v in value):
            arrays_of_tables.append(f)
        else:
            scalars.append(f)
    if path and (scalars or not subtables):
        out.append(f"[{path}]")
    for f in scalars:
        value = getattr(section, f.name)
        if comments and docs.get(f.name):
            out += _comment(docs[f.name])
        key = _key(f.name)
        out.append(f"# {key} =  (not set)" if value is None else f"{key} = {format_value(value)}")
    if path and scalars:
        out.append("")
    for f in subtables:
        child = f"{path}.{_key(f.name)}" if path else _key(f.name)
        if comments and docs.get(f.name) and not path:
            out += _comment(docs[f.name])
        _write_table(getattr(section, f.name), child, out, comments)
    for f in arrays_of_tables:
        child = f"{path}.{_key(f.name)}" if path else _key(f.name)
        for item in getattr(section, f.name):
            out.append(f"[[{child}]]")
            for item_field in dataclasses.fields(item):
                value = getattr(item, item_field.name)
                # An unset optional key ([[data.sources]] format, columns) reads back as unset.
                key = _key(item_field.name)
                out.append(f"# {key} =  (not set)" if value is None else f"{key} = {format_value(value)}")
            out.append("")


def format_value(value: Any) -> str:
    """One TOML value; tables become inline tables so a field stays on its line."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(str(k))} = {format_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if is_config_class(type(value)):
        # An unset optional key is left out: reading the table back gives it its default, None.
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return format_value({name: item for name, item in fields.items() if item is not None})
    if value is None:
        # Only configs built in Python can hold this (a recipe file cannot); the caller decides.
        raise ValueError("TOML has no null value: a None inside a table or list cannot be written")
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else format_value(name)


def _comment(doc: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(" ".join(doc.split()), _WRAP - 2)]
