"""Fixtures of the model-task tests: tiny pretrained-format models of each family (saved once per
session) and small data files of each task format."""

from __future__ import annotations

import pytest

from tests.tasks.data import write_task_files
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
