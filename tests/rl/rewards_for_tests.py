"""Reward functions the [rl] tests name in recipes ("tests.rl.rewards_for_tests:NAME")."""

from __future__ import annotations

import math


def wrong_signature(task, completion_text):
    return 0.0


def raises(prompts, completions, **columns):
    for prompt in prompts:
        if prompt == FAILING_PROMPT[0] or FAILING_PROMPT[0] == "*":
            raise RuntimeError("the answer checker crashed")
    return [0.0] * len(completions)


def wrong_count(prompts, completions, **columns):
    return [0.0] * (len(completions) - 1)


def nan_reward(prompts, completions, **columns):
    return [math.nan] * len(completions)


def length_reward(prompts, completions, **columns):
    """A reward every completion gets differently: its length (so advantages are not all zero)."""
    return [float(len(c)) for c in completions]


def text_hash_reward(prompts, completions, **columns):
    """A reward in [0, 1) that differs between almost any two completions, even of one length."""
    import zlib

    return [zlib.crc32(str(c).encode()) % 1000 / 1000 for c in completions]


FAILING_PROMPT = ["*"]


CALLS = {"count": 0}
FAIL_FROM_CALL = {"value": 3}


def fails_later(prompts, completions, **columns):
    """Scores normally for the first rollouts, then raises (a checker that breaks mid-run)."""
    CALLS["count"] += 1
    if CALLS["count"] >= FAIL_FROM_CALL["value"]:
        raise ZeroDivisionError("division by zero in the checker")
    return [float(len(c)) for c in completions]


def exits_three(prompts, completions, **columns):
    import sys

    sys.exit(3)


def hangs_later(prompts, completions, **columns):
    """Scores normally for the first rollouts, then never returns (a checker stuck on a lock)."""
    import time

    CALLS["count"] += 1
    while CALLS["count"] >= FAIL_FROM_CALL["value"]:
        time.sleep(0.05)
    return [float(len(c)) for c in completions]


def huge(prompts, completions, **columns):
    return [1e308 for _ in completions]
