"""A prompt/completion and a chat dataset train on a tiny Llama saved in Hugging Face format: loss falls."""

from __future__ import annotations

import os

import pytest

from ditty.train import Trainer
from tests.train.helpers import read_jsonl, small_config, write_chat, write_prompt_completion


def _losses(result) -> list[float]:
    return [r["loss"] for r in read_jsonl(os.path.join(result.run_dir, "metrics.jsonl")) if "loss" in r]


@pytest.mark.parametrize("writer", [write_prompt_completion, write_chat], ids=["prompt_completion", "chat"])
def test_loss_falls(tmp_path, tiny_llama_dir, writer):
    path = writer(tmp_path / f"{writer.__name__.split('_', 1)[1]}.jsonl")
    config = small_config(
        tmp_path, tiny_llama_dir, path, steps=12, global_batch_size=8, micro_batch_size=4, log_every=1
    )
    result = Trainer(config).train()
    losses = _losses(result)
    assert len(losses) == 12
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.7 * first, losses
    assert "val_loss" in result.eval_metrics and result.eval_metrics["val_loss"] < losses[0]


def test_packed_rows_and_epochs(tmp_path, tiny_llama_dir):
    """Packing (4-D block mask) through the trainer, and a run measured in epochs instead of steps."""
    from dataclasses import replace

    path = write_prompt_completion(tmp_path / "pc.jsonl", n=40)
    config = small_config(
        tmp_path, tiny_llama_dir, path, steps=None, epochs=1.0, global_batch_size=2, micro_batch_size=1
    )
    config = replace(config, data=replace(config.data, packing=True, max_seq_len=48))
    trainer = Trainer(config)
    result = trainer.train()
    # 35 training samples of 8-16 tokens, about 3-5 per 48-token row: a handful of steps, not 18
    assert 2 <= result.steps < 35 // 2
    assert trainer.stream.cursor >= len(trainer.data.train)
    records = read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    assert all(r["loss"] > 0 for r in records if "loss" in r)


def test_a_global_batch_larger_than_the_data_says_so(tmp_path, tiny_llama_dir, caplog):
    """One "epoch" of 2 samples at a global batch of 8 trains each sample four times: a warning says so."""
    import logging

    path = write_prompt_completion(tmp_path / "pc.jsonl", n=2)
    config = small_config(
        tmp_path, tiny_llama_dir, path, steps=None, epochs=1.0, global_batch_size=8, micro_batch_size=4
    )
    from dataclasses import replace

    config = replace(config, data=replace(config.data, val_fraction=0.0))
    with caplog.at_level(logging.WARNING, logger="ditty.train"):
        assert Trainer(config).train().steps == 1
    assert "the global batch (8 samples) is larger than the training data (2 samples)" in caplog.text
