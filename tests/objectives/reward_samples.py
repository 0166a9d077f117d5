"""Reward functions a user might write, named by reference in tests/objectives/test_rewards.py."""

from __future__ import annotations

import math

NOT_A_FUNCTION = 3


def trl_style(completions, answer, **kwargs):
    """TRL's documented form: named columns, the rest absorbed."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def with_prompts(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def original_style(task, completion_text):
    return 1.0


def positional_only(prompts, completions, /):
    return [0.0 for _ in completions]


def raises_on_seven(prompts, completions, **columns):
    return [1.0 / (len(p) - 3) if "7" not in p else [][0] for p in prompts]


def one_short(prompts, completions, **columns):
    return [1.0] * (len(completions) - 1)


def nan_for_long(prompts, completions, **columns):
    return [math.nan if len(c) > 2 else 0.5 for c in completions]


def none_for_empty(prompts, completions, **columns):
    return [None if not c else 1.0 for c in completions]


def returns_a_number(prompts, completions, **columns):
    return 1.0
