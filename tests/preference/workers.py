"""Rank functions of the multi-process preference tests (spawned processes import them by name)."""

from __future__ import annotations


def dpo_losses(rank: int, world_size: int, config, steps: int) -> list[float]:
    """The losses of `steps` optimizer steps of `config` on this process group."""
    from ditty.train import Trainer

    trainer = Trainer(config)
    return [trainer.train_step(trainer.stream.next_step()).loss for _ in range(steps)]
