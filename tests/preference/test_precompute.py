"""reference = "precompute": the starting model's log-probabilities, computed once before training into
the run directory, give the loss of the live frozen copy; a resumed run reads them back."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from ditty.objectives.reference import REFERENCE_FILE, Precomputed
from ditty.train import Trainer
from tests.preference.test_loss import _config, _fixed_batch


def test_precomputed_reference_equals_the_frozen_copy_and_is_reused(tmp_path, tiny_llama_dir, monkeypatch):
    auto = _config(tmp_path, tiny_llama_dir, "dpo")  # full finetune: a frozen copy of the starting weights
    trainer = Trainer(auto)
    _, batch = _fixed_batch(trainer)
    expected = [trainer.train_step([batch]).loss for _ in range(2)]

    run = str(tmp_path / "precompute")
    config = replace(
        auto, run=replace(auto.run, output_dir=run), preference=replace(auto.preference, reference="precompute")
    )
    trainer = Trainer(config)
    assert isinstance(trainer.pipeline.loss.reference, Precomputed)
    assert os.path.exists(os.path.join(run, REFERENCE_FILE))
    losses = [trainer.train_step([batch]).loss for _ in range(2)]
    assert losses == pytest.approx(expected, abs=1e-6)
    table = dict(trainer.pipeline.loss.reference.table)
    assert len(table) == len(batch["input_ids"])  # every chosen and every rejected sequence, once

    def no_second_pass(*args, **kwargs):
        raise AssertionError("the reference was computed again instead of read from the run directory")

    monkeypatch.setattr("ditty.objectives.reference.compute_table", no_second_pass)
    from ditty.objectives.reference import build_reference

    again = build_reference(trainer.run, "precompute", chunks=8, key="preference.reference")
    assert again.table == table
