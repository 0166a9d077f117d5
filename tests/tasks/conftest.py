"""Fixtures of the model-task tests: tiny pretrained-format models of each family (saved once per
session) and small data files of each task format."""

from __future__ import annotations

import pytest
import torch

from tests.tasks.data import write_task_files
from tests.tasks.helpers import CASES, task_config
from tests.tasks.models import save_encoder, save_seq2seq


@pytest.fixture(scope="session")
def task_models(tmp_path_factory) -> dict[str, str]:
    """{family: directory} for bert, distilbert, roberta, deberta-v2 (masked-LM checkpoints, WordPiece
    tokenizer) and t5, bart (seq2seq checkpoints, byte tokenizer)."""
    root = tmp_path_factory.mktemp("task-models")
    dirs = {family: save_encoder(root / family, family) for family in ("bert", "distilbert", "roberta", "deberta-v2")}
    dirs.update({family: save_seq2seq(root / family, family) for family in ("t5", "bart")})
    return dirs


@pytest.fixture(scope="session")
def task_files(tmp_path_factory) -> dict[str, str]:
    """{format: jsonl path} with training and validation files ("<format>_val")."""
    return write_task_files(tmp_path_factory.mktemp("task-data"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory, task_models, task_files):
    """Each case of tests.tasks.helpers.CASES trained once on one process (2 steps), with a batch of
    validation samples and the logits of the trained model on it."""
    from ditty.data.collate import fetch_rows
    from ditty.train import Trainer
    from ditty.train.pipeline import call_model

    out = {}
    for case in CASES:
        run_dir = tmp_path_factory.mktemp(case.id) / "run"
        trainer = Trainer(task_config(run_dir, case, task_models, task_files))
        result = trainer.train()
        bundle = trainer.data.bundle
        batch = bundle.collator.for_validation()(fetch_rows(bundle.val, [0, 1, 2]), [0, 1, 2])
        model = trainer.engine.unwrap(trainer.model).eval()
        with torch.no_grad():
            logits = call_model(model, batch, {}, lm=True).logits
        out[case.id] = dict(case=case, run_dir=run_dir, result=result, batch=batch, logits=logits, trainer=trainer)
    return out
