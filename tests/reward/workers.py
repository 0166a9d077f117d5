"""Rank functions of the reward-model tests (importable by spawned processes)."""

from __future__ import annotations


def train_reward(rank: int, world: int, recipe: str, parallel: str) -> list:
    """The recipe on this world with `parallel.kind`; rank 0 returns the per-step losses and the last record."""
    from dataclasses import replace

    from ditty.config.loader import load_recipe
    from ditty.train import Trainer
    from tests.reward.helpers import records

    config = load_recipe(recipe).config
    config = replace(config, parallel=replace(config.parallel, kind=parallel))
    Trainer(config).train()
    if rank:
        return []
    from pathlib import Path

    logged = records(Path(config.run.output_dir))
    return [[r["loss"] for r in logged if "loss" in r], logged[-1]]
