"""The compiler's side of the objective table (ditty.objectives.table): the chosen row's own rules,
and a warning for every set key of a section that only other rows read."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from ditty.config.errors import Problem, error, warning
from ditty.objectives.table import OBJECTIVES, objective_choice
from ditty.recipe.rule_base import Context, value_at

ROW_SECTIONS = ("preference", "rl", "distill", "rollout")
"""The sections that belong to objective rows (every other section is read by every row)."""

FIXES = {
    "preference": 'set data.format = "preference" (or "unpaired_preference" for kto) to train a preference kind, '
    "or remove [preference]",
    "rl": 'set rl.kind = "grpo" to use it, or remove it',
    "distill": 'set distill.kind = "gkd" to use it, or remove it',
    "rollout": 'it is read by the rows that sample (rl.kind, preference.pairs = "online", distill.kind); remove it',
}


def objective_problems(ctx: Context) -> Iterator[Problem]:
    name, key = objective_choice(ctx.config)
    row = OBJECTIVES.get(name)
    if row is None:
        yield error(key, f"{value_at(ctx.config, key)!r} names no objective ditty trains", _available())
        return
    for problem in [*data_format_problems(ctx, row), *row.rules(ctx)]:
        yield replace(problem, rule=problem.rule or f"objective.{row.name}")
    yield from unused_sections(ctx, row)


def data_format_problems(ctx: Context, row) -> Iterator[Problem]:
    """A row chosen by a section of its own reads the formats it declares (`data_formats`); the model
    tasks' rows are held to theirs by the task rules. The first format it does not read, of the data
    or of a source, is the error; the fix names the rows that do read it."""
    if not row.sections or not row.data_formats:
        return
    data = ctx.config.data
    for fmt in [data.format, *(s.format for s in data.sources if s.format is not None)]:
        if fmt in row.data_formats:
            continue
        wanted = " or ".join(f'"{f}"' for f in row.data_formats)
        readers = [r.name for r in OBJECTIVES.values() if r.sections and fmt in r.data_formats]
        fix = f'set data.format = "{row.data_formats[0]}"'
        if readers:
            fix += f", or train {' or '.join(readers)}, which read{'s' if len(readers) == 1 else ''} it"
        message = f'{row.name} reads data.format = {wanted} ({row.reads}), not data.format = "{fmt}"'
        yield error("data.format", message, fix)
        return


def unused_sections(ctx: Context, row) -> Iterator[Problem]:
    """A key of a section the chosen row does not read has no effect: one warning per section, at its
    first key set (a switch like `--preference.kind dpo` counts even at its default value)."""
    for section in ROW_SECTIONS:
        if section in row.sections:
            continue
        set_keys = sorted(
            path
            for path, origin in ctx.provenance.items()
            if path.startswith(section + ".") and (ctx.is_set(path) or (origin == "flag" and path.endswith(".kind")))
        )
        if not set_keys:
            continue
        message = f'has no effect: this recipe trains "{row.name}" ({row.summary}), which does not read [{section}]'
        yield replace(warning(set_keys[0], message, FIXES[section]), rule="objective.unused")


def _available() -> str:
    return "choose one of the objectives: " + ", ".join(sorted(OBJECTIVES))
