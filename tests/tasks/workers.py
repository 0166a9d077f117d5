"""Rank functions of the model-task tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path


def train_cases(rank: int, world: int, case_ids: list[str], root: str, model_dirs: dict, files: dict) -> dict:
    """Every case trained with FSDP on this world (micro-batch 2: the same global batch of 8 as one
    process with micro 4); rank 0 returns {case id: per-step losses and the last record}."""
    import torch

    from ditty.train import Trainer
    from tests.tasks.helpers import CASES, losses, records, task_config

    torch.manual_seed(0)
    out = {}
    for case in (c for c in CASES if c.id in case_ids):
        run_dir = Path(root) / case.id
        Trainer(task_config(run_dir, case, model_dirs, files, micro=2, parallel="fsdp")).train()
        if rank == 0:
            out[case.id] = {"losses": losses(run_dir), "last": records(run_dir)[-1], "run_dir": str(run_dir)}
    return out
