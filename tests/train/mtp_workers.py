"""Rank function of the multi-process MTP tests (forked ranks import it by name)."""

from __future__ import annotations


def mtp_steps(rank: int, world_size: int, recipe: str, kind: str, output_dir: str, steps: int) -> dict:
    """`steps` optimizer steps of the recipe at `recipe` under `parallel.kind = kind`: each step's loss
    and loss metrics (the heads' losses), and rank 0's weights after them (gathered under FSDP)."""
    from dataclasses import replace

    from ditty.config.loader import load_recipe
    from ditty.config.sections import ParallelConfig
    from ditty.train import Trainer

    config = load_recipe(recipe).config
    config = replace(config, parallel=ParallelConfig(kind=kind), run=replace(config.run, output_dir=output_dir))
    trainer = Trainer(config)
    losses, loss_metrics = [], []
    for _ in range(steps):
        result = trainer.train_step(trainer.stream.next_step())
        losses.append(result.loss)
        loss_metrics.append(result.metrics)
        trainer.state.step += 1
    full = trainer.engine.full_state_dict(trainer.model)  # FSDP gathers the shards; None: the module holds them
    module = trainer.engine.unwrap(trainer.model)
    state = {k: v.detach().clone() for k, v in (full if full is not None else module.state_dict()).items()}
    trainer.run_lock.release()
    return {"losses": losses, "loss_metrics": loss_metrics, "state": state if rank == 0 else {}}
