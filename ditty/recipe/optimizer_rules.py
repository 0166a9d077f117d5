"""Rules on `[optimizer]` beyond the compatibility table: the group patterns."""

from __future__ import annotations

from typing import Iterator

from ditty.config.errors import Problem
from ditty.optim.groups import check_patterns
from ditty.recipe.rules import Context, rule


@rule("optimizer.groups")
def group_patterns(ctx: Context) -> Iterator[Problem]:
    """`optimizer.no_decay` and `optimizer.lr_multipliers` are roles or valid regular expressions."""
    yield from check_patterns(ctx.config.optimizer)
