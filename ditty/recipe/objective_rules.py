"""The compiler's side of the objective table (ditty.objectives.table): the chosen row's own rules,
and a warning for every set key of a section that only other rows read."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from ditty.config.errors import Problem, error, warning
from ditty.objectives.table import OBJECTIVES, objective_choice
from ditty.recipe.rule_base import Context, value_at

ROW_SECTIONS = ("preference", "rl", "distill")
"""The sections that belong to objective rows (every other section is read by every row)."""

FIXES = {
    "preference": 'set data.format = "preference" (or "unpaired_preference" for kto) to train a preference kind, '
    "or remove [preference]",
    "rl": 'set rl.kind = "grpo" to use it, or remove it',
    "distill": 'set distill.kind = "gkd" to use it, or remove it',
}


def objective_problems(ctx: Context) -> Iterator[Problem]:
    name, key = objective_choice(ctx.config)
    row = OBJECTIVES.get(name)
    if row is None:
        yield error(key, f"{value_at(ctx.config, key)!r} names no objective ditty trains", _available())
        return
    for problem in row.rules(ctx):
        yield replace(problem, rule=problem.rule or f"objective.{row.name}")
    yield from unused_sections(ctx, row)


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
