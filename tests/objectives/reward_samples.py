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


def strips_answers(prompts, completions, answer, **columns):
    """A function that edits its arguments in place (a column, the prompts, a chat message)."""
    answer[:] = [a.strip().upper() for a in answer]
    prompts.clear()
    for completion in completions:
        if isinstance(completion, list):
            completion[-1]["content"] = "changed"
    return [0.0 for _ in completions]


def sees_answers(prompts, completions, answer, **columns):
    """1.0 where the column arrived as the data has it (the text ' x ' with its spaces)."""
    return [float(a == " x ") for a in answer]


def exits(prompts, completions, **columns):
    import sys

    sys.exit(3)


def never_returns(prompts, completions, **columns):
    import time

    while True:
        time.sleep(0.05)


def catches_everything(prompts, completions, **columns):
    """A function whose broad `except Exception` must not swallow the timeout."""
    import time

    while True:
        try:
            time.sleep(0.05)
        except Exception:  # noqa: BLE001 - what careless user code does
            pass


def huge(prompts, completions, **columns):
    return [1e308 for _ in completions]


async def asynchronous(prompts, completions, **columns):
    return [0.0 for _ in completions]
