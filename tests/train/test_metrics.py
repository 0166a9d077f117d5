"""metrics.jsonl fields, the curves PNG (and its redraw), TensorBoard events."""

from __future__ import annotations

import glob
import math
import os
from dataclasses import replace

import pytest

from ditty.metrics import JsonlSink, plot_run
from ditty.metrics.logger import read_metrics
from ditty.train import Trainer
from tests.train.helpers import read_jsonl, small_config, write_prompt_completion


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("metrics")
    config = small_config(
        tmp, tiny_llama_dir, write_prompt_completion(tmp / "pc.jsonl"), steps=6, log_every=2, eval_every=3
    )
    config = replace(config, logging=replace(config.logging, tensorboard=True))
    return Trainer(config).train()


def test_metrics_jsonl_fields(run):
    records = read_jsonl(os.path.join(run.run_dir, "metrics.jsonl"))
    assert [r["step"] for r in records] == [2, 3, 4, 6]
    for record in records:
        for key in ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed_s"):
            assert key in record, (key, record)
        assert math.isfinite(record["loss"]) and record["tokens_per_s"] > 0
    tokens = [r["tokens"] for r in records]
    assert tokens == sorted(tokens) and tokens[0] > 0
    eval_steps = [r["step"] for r in records if "val_loss" in r]
    assert eval_steps == [3, 6]  # every 3 steps; the last step's evaluation is not repeated


def test_every_record_has_mfu_within_the_cpu_probe(run):
    """mfu divides model FLOPs/s by the machine's measured fp32 peak (ditty.metrics.peak): between 0
    and 1; hfu equals it without activation checkpointing."""
    records = read_jsonl(os.path.join(run.run_dir, "metrics.jsonl"))
    for record in records:
        assert 0 < record["mfu"] < 1 and record["hfu"] == record["mfu"], record


def test_tokens_count_non_padding_inputs(run):
    """tokens equals the sum of attention-mask ones the model saw (8 samples x 6 steps)."""
    records = read_jsonl(os.path.join(run.run_dir, "metrics.jsonl"))
    assert 6 * 8 * 5 < records[-1]["tokens"] < 6 * 8 * 64


def test_curves_png_and_redraw(run, tmp_path):
    png = os.path.join(run.run_dir, "curves.png")
    assert os.path.getsize(png) > 1000
    out = plot_run(run.run_dir, out_path=str(tmp_path / "again.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_events_written(run):
    assert glob.glob(os.path.join(run.run_dir, "tensorboard", "events.out.tfevents.*"))


def test_jsonl_keeps_non_finite_values_readable(tmp_path):
    sink = JsonlSink(str(tmp_path))
    sink.write({"step": 1, "loss": float("nan"), "skipped": True})
    sink.close()
    (record,) = read_metrics(str(tmp_path))
    assert math.isnan(record["loss"]) and record["skipped"] is True
