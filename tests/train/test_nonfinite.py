"""A non-finite loss skips the optimizer step (logged); too many in a row stop the run, keeping its files."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest
import torch

from ditty.config.sections import ComponentSpec, PipelineConfig
from ditty.train import NonFiniteLossError, Trainer
from tests.train.helpers import read_jsonl, small_config, with_train, write_prompt_completion

NAN = "tests.train.helpers:NaNLogits"


def _config(tmp_path, model_dir, steps, nan_steps=(), max_skipped=10, always=False):
    data = write_prompt_completion(tmp_path / "pc.jsonl")
    config = with_train(small_config(tmp_path, model_dir, data), steps=steps, max_skipped_steps=max_skipped)
    spec = ComponentSpec(use=NAN, kwargs={"steps": list(nan_steps), "always": always})
    return replace(config, pipeline=PipelineConfig(postprocessors=[spec]))


def test_a_nan_step_is_skipped_logged_and_training_goes_on(tmp_path, tiny_llama_dir, caplog):
    trainer = Trainer(_config(tmp_path, tiny_llama_dir, steps=4, nan_steps=[1]))
    before = {}

    def remember(module, args):  # weights entering step index 2 must equal those leaving step 1's start
        before.setdefault(trainer.state.step, {k: v.clone() for k, v in trainer.model.state_dict().items()})

    trainer.model.register_forward_pre_hook(remember)
    with caplog.at_level("WARNING", logger="ditty.train"):
        result = trainer.train()
    assert result.skipped_steps == 1 and result.steps == 4
    assert "step 2 skipped: non-finite loss" in caplog.text
    records = {r["step"]: r for r in read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))}
    assert records[2]["skipped"] is True and records[2]["skip_reason"] == "non-finite loss"
    assert "skipped" not in records[1] and "skipped" not in records[3]
    assert math.isfinite(records[3]["loss"])
    # the skipped step left the weights as they were, and nothing became NaN
    for key, value in before[1].items():
        assert torch.equal(value, before[2][key]), key
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert os.path.isdir(result.final_dir)


def test_consecutive_skips_stop_the_run_and_keep_earlier_files(tmp_path, tiny_llama_dir):
    trainer = Trainer(_config(tmp_path, tiny_llama_dir, steps=10, always=True, max_skipped=3))
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive steps had a non-finite loss"):
        trainer.train()
    run = tmp_path / "run"
    assert (run / "env.json").exists() and (run / "recipe.toml").exists()
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if r.get("skipped")] == [1, 2, 3]
    assert not (run / "final").exists()
    assert (run / "curves.png").exists()
