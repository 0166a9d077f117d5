"""The first rules the compiler runs: every number finite, counts and rates positive (or at least
zero), fractions and coefficients in their ranges."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

from ditty.config.errors import Problem
from ditty.recipe.rule_base import Context, error, rule, value_at

# --- values that must be positive, non-negative, or in a range ----------------------------------

_POSITIVE = [
    "train.global_batch_size",
    "train.micro_batch_size",
    "train.log_every",
    "train.max_skipped_steps",
    "data.max_seq_len",
    "data.num_samples",
    "data.max_row_bytes",
    "optimizer.lr",
    "optimizer.eps",
    "optimizer.muon_lr",
    "optimizer.ns_steps",
    "peft.r",
]
_NON_NEGATIVE = [
    "train.eval_every",
    "train.eval_samples",
    "train.max_grad_norm",
    "optimizer.weight_decay",
    "optimizer.momentum",
    "optimizer.muon_momentum",
    "optimizer.muon_weight_decay",
    "scheduler.warmup_steps",
    "scheduler.min_lr_ratio",
    "checkpoint.every",
    "checkpoint.every_minutes",
    "checkpoint.keep_last",
    "peft.dropout",
    "run.seed",
    "run.num_threads",
    "rl.reward_timeout_s",
]


@rule("value.finite")
def finite_numbers(ctx: Context) -> Iterator[Problem]:
    """No number anywhere in a recipe may be nan or infinite (TOML allows `nan` and `inf`): they
    would pass every range check below (nan compares false) and fail, or silently poison the
    weights, once training starts."""
    stack: list[tuple[str, Any]] = [("", ctx.config)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                yield error(path, f"is {value}: a recipe number must be finite", f"set `{path}` to a finite number")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            stack += [(_join(path, f.name), getattr(value, f.name)) for f in reversed(dataclasses.fields(value))]
        elif isinstance(value, dict):
            stack += [(_join(path, str(k)), v) for k, v in reversed(value.items())]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value)))]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@rule("value.positive")
def positive_values(ctx: Context) -> Iterator[Problem]:
    """Counts, sizes and rates that must be above zero (or at least zero). A config built in Python
    may leave a value None ("not set": train.max_grad_norm = None turns clipping off)."""
    for path in _POSITIVE:
        value = value_at(ctx.config, path)
        if value is not None and value <= 0:
            yield error(path, f"must be greater than 0, got {value}", f"set `{path}` to a positive number")
    for path in _NON_NEGATIVE:
        value = value_at(ctx.config, path)
        if value is not None and value < 0:
            yield error(path, f"must not be negative, got {value}", f"set `{path}` to 0 or more")


@rule("value.ranges")
def ranges(ctx: Context) -> Iterator[Problem]:
    """Fractions and coefficients with a bounded range."""
    cfg = ctx.config
    if cfg.train.steps is not None and cfg.train.steps <= 0:
        yield error("train.steps", f"must be at least 1, got {cfg.train.steps}", "set a positive step count")
    if cfg.train.steps is None and cfg.train.epochs <= 0:
        yield error("train.epochs", f"must be greater than 0, got {cfg.train.epochs}")
    if not 0 <= cfg.data.val_fraction < 1:
        yield error("data.val_fraction", f"must be in [0, 1), got {cfg.data.val_fraction}")
    if not 0 <= cfg.scheduler.min_lr_ratio <= 1:
        yield error("scheduler.min_lr_ratio", f"must be in [0, 1], got {cfg.scheduler.min_lr_ratio}")
    if not 0 < cfg.scheduler.decay_fraction <= 1:
        yield error("scheduler.decay_fraction", f"must be in (0, 1], got {cfg.scheduler.decay_fraction}")
    for index, beta in enumerate(cfg.optimizer.betas):
        if not 0 <= beta < 1:
            yield error("optimizer.betas", f"beta{index + 1} must be in [0, 1), got {beta}")
    if not 0 <= cfg.peft.dropout < 1:
        yield error("peft.dropout", f"must be in [0, 1), got {cfg.peft.dropout}")
