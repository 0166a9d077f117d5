"""Tensor parallel (with sequence parallel) composed with FSDP2 on 4 real gloo processes, against one
process: the same losses and gradients, step by step, for every family ditty verifies.

One spawn of 4 ranks runs every scenario of the module in turn (`runs`), after the one-process
references; the tests then read the run directories. Settings: fp32, no dropout, the same seed and
global batch of 8, 2-layer 64-wide models with a 260-token vocabulary (the byte tokenizer's 259
rounded up to a multiple of tp).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tests.conftest import _save_tiny
from tests.parallel.harness import relative_error, run_ranks
from tests.parallel.model_parallel_hooks import GradientRecorder, recipe, train_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

TOLERANCE = 1e-5
FAMILIES = {"llama": {}, "mistral": {"sliding_window": None}, "qwen2": {}, "qwen3": {}}

# name -> (family, the 4-rank run's changes, micro-batch per rank, whether gradients are recorded).
# The one-process reference runs the same recipe with micro-batch 4 (2 micro-batches, as 2 data ranks
# x 2 micro-batches of 2 would be) and no [parallel] changes.
SCENARIOS = {
    "tp-llama": ("llama", {"parallel": {"tp": 2}}, 2, True),
    "tp-mistral": ("mistral", {"parallel": {"tp": 2}}, 2, False),
    # the generated-answer metric runs under tensor parallel too (whole logits outside training)
    "tp-qwen2": ("qwen2", {"parallel": {"tp": 2}, "train": {"eval_samples": 4}}, 2, False),
    # per-head q_norm/k_norm, the chunked loss on vocabulary shards, activation checkpointing. SGD:
    # AdamW divides each gradient by its own running size, so the 4e-7 float noise of step 1 in the
    # tiny gradients of Qwen3's per-head norms became 5e-6 by step 2 (measured); SGD keeps 4e-7.
    "tp-qwen3": (
        "qwen3",
        {
            "parallel": {"tp": 2},
            "train": {"loss_chunks": 4, "activation_checkpointing": "full"},
            "optimizer": {"kind": "sgd", "momentum": 0.9, "lr": 0.05},
        },
        2,
        True,
    ),
}


def _without_parallel(changes: dict) -> dict:
    return {section: values for section, values in changes.items() if section != "parallel"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ditty.train import Trainer

    root = tmp_path_factory.mktemp("model-parallel")
    models = {family: _save_tiny(root / family, family, vocab_size=260, **extra) for family, extra in FAMILIES.items()}
    out = {"one": {}, "four": {}}
    started = time.monotonic()
    for name, (family, changes, _micro, record) in SCENARIOS.items():
        out["one"][name] = str(root / "one" / name)
        config = recipe(out["one"][name], models[family], micro=4, **_without_parallel(changes))
        (GradientRecorder if record else Trainer)(config).train()
    one_process = time.monotonic() - started
    configs, recorders = [], []
    for name, (family, changes, micro, record) in SCENARIOS.items():
        out["four"][name] = str(root / "four" / name)
        configs.append(recipe(out["four"][name], models[family], kind="fsdp", micro=micro, **changes))
        recorders.append(record)
    started = time.monotonic()
    run_ranks(train_all, 4, configs, recorders, timeout=600)
    print(f"one process: {one_process:.0f} s; 4 ranks, {len(configs)} runs: {time.monotonic() - started:.0f} s")
    out["models"] = models
    return out


def records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def losses(run_dir: str) -> list[float]:
    return [r["loss"] for r in records(run_dir) if "loss" in r]


def assert_same_losses(run: str, reference: str) -> None:
    got, want = losses(run), losses(reference)
    assert len(got) == len(want) == 3
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{os.path.basename(run)}: losses {got}, worst relative error {worst:.1e}")
    assert worst < TOLERANCE


def assert_same_gradients(run: str, reference: str) -> None:
    for step in (1, 2, 3):
        got = torch.load(os.path.join(run, f"grads-{step}.pt"))
        want = torch.load(os.path.join(reference, f"grads-{step}.pt"))
        assert sorted(got) == sorted(want)
        error = relative_error(got, want)
        print(f"{os.path.basename(run)} step {step}: gradients' relative error {error:.1e}")
        assert error < TOLERANCE


def test_tp_llama_matches_one_process_in_losses_and_gradients(runs):
    assert_same_losses(runs["four"]["tp-llama"], runs["one"]["tp-llama"])
    assert_same_gradients(runs["four"]["tp-llama"], runs["one"]["tp-llama"])


def test_tp_qwen3_chunked_loss_on_vocabulary_shards_matches_one_process(runs):
    assert_same_losses(runs["four"]["tp-qwen3"], runs["one"]["tp-qwen3"])
    assert_same_gradients(runs["four"]["tp-qwen3"], runs["one"]["tp-qwen3"])


@pytest.mark.parametrize("name", ["tp-mistral", "tp-qwen2"])
def test_tp_trains_every_verified_family_like_one_process(runs, name):
    assert_same_losses(runs["four"][name], runs["one"][name])
    final = [r for r in records(runs["four"][name]) if "val_loss" in r][-1]
    reference = [r for r in records(runs["one"][name]) if "val_loss" in r][-1]
    assert final["val_loss"] == pytest.approx(reference["val_loss"], rel=TOLERANCE)
    assert final.get("val_exact_match") == reference.get("val_exact_match")


def test_tp_final_model_is_an_ordinary_hugging_face_model(runs):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = os.path.join(runs["four"]["tp-llama"], "final")
    AutoModelForCausalLM.from_pretrained(final)  # loads as is
    got = load_file(os.path.join(final, "model.safetensors"))
    want = load_file(os.path.join(runs["one"]["tp-llama"], "final", "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert relative_error(got, want) < TOLERANCE
