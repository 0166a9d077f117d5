"""reference = "precompute": the starting model's log-probabilities, computed once before training into
the run directory, give the loss of the live frozen copy; a resumed run reads them back."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest
import torch

from ditty.cli import main
from ditty.objectives.reference import REFERENCE_FILE, FrozenModel, Precomputed
from ditty.train import Trainer
from tests.preference.recipes import PAIRS, preference_recipe, write_pairs
from tests.preference.test_loss import _config, _fixed_batch, reference_dir  # noqa: F401 - a fixture


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

    monkeypatch.setattr(FrozenModel, "sequence_logps", no_second_pass)
    from transformers import AutoModelForCausalLM

    starting = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)  # what a rerun starts from
    again = Precomputed.for_run(trainer.run, starting, chunks=8)
    assert again.table == table


def _rerun(tmp_path, capsys, recipe, *flags):
    code = main(["run", str(recipe), "--checkpoint.every", "2", *flags])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_table_from_another_starting_model_is_computed_again(tmp_path, capsys, caplog, tiny_llama_dir, reference_dir):
    """Killed before its first checkpoint, a run is started again with another model.path: the file in
    the run directory holds the first model's figures, and they are not reused."""
    data = write_pairs(tmp_path / "p.jsonl")
    extra = '[preference]\nreference = "precompute"'
    first = preference_recipe(tmp_path, reference_dir, data, extra=extra, steps=2)
    assert _rerun(tmp_path, capsys, first)[0] == 0
    stale = torch.load(tmp_path / "run" / REFERENCE_FILE, weights_only=True)
    shutil.rmtree(tmp_path / "run" / "final")  # as if killed: the table written, no final/
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    code, out = _rerun(tmp_path, capsys, preference_recipe(tmp_path, tiny_llama_dir, data, extra=extra, steps=2))
    assert code == 0, out
    assert "computed from another starting model" in caplog.text, caplog.text
    fresh = torch.load(tmp_path / "run" / REFERENCE_FILE, weights_only=True)
    assert fresh["fingerprint"] != stale["fingerprint"] and fresh["table"].keys() == stale["table"].keys()
    assert fresh["table"] != stale["table"]
    (tmp_path / "clean").mkdir()
    clean = preference_recipe(tmp_path / "clean", tiny_llama_dir, data, extra=extra, steps=2)
    code, out = _rerun(tmp_path / "clean", capsys, clean)
    assert code == 0, out
    assert torch.load(tmp_path / "clean" / "run" / REFERENCE_FILE, weights_only=True)["table"] == fresh["table"]


def test_changed_data_under_force_resume_scores_the_new_pairs(tmp_path, capsys, caplog, tiny_llama_dir):
    data = write_pairs(tmp_path / "p.jsonl")
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data, extra='[preference]\nreference = "precompute"', steps=2)
    assert _rerun(tmp_path, capsys, recipe)[0] == 0
    before = torch.load(tmp_path / "run" / REFERENCE_FILE, weights_only=True)["table"]
    changed = [
        {"prompt": "9+9=", "chosen": "18", "rejected": "19"},
        {"prompt": "9+8=", "chosen": "17", "rejected": "1"},
    ]
    write_pairs(tmp_path / "p.jsonl", PAIRS[:-2] + changed)  # as many rows, two of them new
    code, out = _rerun(
        tmp_path, capsys, recipe, "--train.steps", "4", "--checkpoint.force_resume", "true",
        "--checkpoint.overwrite_finished", "true",
    )  # fmt: skip
    assert code == 0 and "Traceback" not in out, out
    assert "4 sequences of the data were not in" in caplog.text, caplog.text
    after = torch.load(tmp_path / "run" / REFERENCE_FILE, weights_only=True)["table"]
    assert len(after) == len(before) + 4 and all(after[key] == value for key, value in before.items())
