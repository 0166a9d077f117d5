"""Rank functions of the multi-process preference tests (spawned processes import them by name)."""

from __future__ import annotations


def dpo_losses(rank: int, world_size: int, config, steps: int) -> list[float]:
    """The losses of `steps` optimizer steps of `config` on this process group."""
    import os

    from ditty.train import Trainer

    if config.parallel.kind == "deepspeed":
        os.environ["DS_ACCELERATOR"] = "cpu"

    trainer = Trainer(config)
    return [trainer.train_step(trainer.stream.next_step()).loss for _ in range(steps)]


def dpo_losses_and_reference(rank: int, world_size: int, config, steps: int) -> tuple[list[float], str]:
    """The losses of `steps` steps, and how the reference holds its weights: "sharded" (every
    parameter a DTensor shard), "adapter" (the policy with its adapter off), "table" (precomputed)."""
    from torch.distributed.tensor import DTensor

    from ditty.objectives.reference import AdapterDisabled, FrozenModel, Precomputed
    from ditty.train import Trainer

    trainer = Trainer(config)
    reference = trainer.pipeline.loss.reference
    if isinstance(reference, FrozenModel):
        sharded = all(isinstance(p, DTensor) for p in reference.model.parameters())
        how = "sharded" if sharded else "whole"
    else:
        how = {AdapterDisabled: "adapter", Precomputed: "table"}[type(reference)]
    return [trainer.train_step(trainer.stream.next_step()).loss for _ in range(steps)], how
