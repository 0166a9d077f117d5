"""Reward functions: `functions` resolves, checks, calls and weights them (TRL's signature);
`builtin_rewards` holds the ready-made ones; `scorer` makes a trained reward model one.

Names of `functions` import from here too (`from ditty.objectives.rewards import load_reward_functions`),
as they did when it was one module."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    functions = importlib.import_module("ditty.objectives.rewards.functions")
    try:
        return getattr(functions, name)
    except AttributeError:
        raise AttributeError(f"module 'ditty.objectives.rewards' has no attribute {name!r}") from None
