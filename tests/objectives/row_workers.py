"""Rank function of the multi-process tests of the objective rows (forked ranks import it by name)."""

from __future__ import annotations


def row_steps(
    rank: int, world_size: int, recipe: str, kind: str, output_dir: str, steps: int, tp: int = 1, cp: int = 1
) -> dict:
    """`steps` optimizer steps of the recipe at `recipe` under `parallel.kind = kind` (and `tp`, `cp`): each
    step's loss, stream metrics and loss metrics, and rank 0's weights after them (gathered under FSDP)."""
    from dataclasses import replace

    from ditty.config.loader import load_recipe
    from ditty.config.sections import ParallelConfig
    from ditty.train import Trainer

    config = load_recipe(recipe).config
    config = replace(
        config, parallel=ParallelConfig(kind=kind, tp=tp, cp=cp), run=replace(config.run, output_dir=output_dir)
    )
    trainer = Trainer(config)
    losses, metrics, loss_metrics = [], [], []
    for _ in range(steps):
        batches = trainer.stream.next_step()
        metrics.append(getattr(trainer.stream, "step_metrics", dict)())  # a data stream reports none
        result = trainer.train_step(batches)
        losses.append(result.loss)
        loss_metrics.append(result.metrics)
        trainer.state.step += 1
    full = trainer.engine.full_state_dict(trainer.model)  # FSDP gathers the shards; None: the module holds them
    module = trainer.engine.unwrap(trainer.model)
    state = {k: v.detach().clone() for k, v in (full if full is not None else module.state_dict()).items()}
    trainer.run_lock.release()
    return {"losses": losses, "metrics": metrics, "loss_metrics": loss_metrics, "state": state if rank == 0 else {}}


def assert_trains_alike(one: dict, other: dict, metric: str = "", tolerance: float = 1e-5) -> None:
    """Two `row_steps` results trained alike: every step's loss and the loss's metrics within
    `tolerance` (metrics: relative, 1e-6 absolute), `metric` among them, the weights after them too."""
    import pytest

    for a, b in zip(one["losses"], other["losses"]):
        assert abs(a - b) < tolerance, (one["losses"], other["losses"])
    for alone, split in zip(one["loss_metrics"], other["loss_metrics"]):
        assert alone.keys() == split.keys() and (not metric or metric in alone)
        for key, value in alone.items():
            assert split[key] == pytest.approx(value, rel=tolerance, abs=1e-6), (key, split[key], value)
    worst = max(float((one["state"][k] - other["state"][k]).abs().max()) for k in one["state"])
    assert worst < tolerance, worst
