"""Tensor parallel (with sequence parallel) and Ulysses context parallel composed with FSDP2 on 4 real
gloo processes, against one process: the same losses and gradients, step by step, for every family
ditty verifies, and the activation memory a long row saves under context parallel.

One spawn of 4 ranks runs every scenario of the module in turn (`runs`), after the one-process
references; the tests then read the run directories. Settings: fp32, no dropout, the same seed and
global batch of 8, 2-layer 64-wide models; Llama and Qwen3 with the byte tokenizer's 259 tokens (uneven
vocabulary shards: 130 and 129 rows at tp = 2), Mistral and Qwen2 with 260 (even ones).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tests.conftest import _save_tiny
from tests.parallel.harness import relative_error, run_ranks
from tests.parallel.model_parallel_hooks import recipe, train_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

TOLERANCE = 1e-5
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": None, "vocab_size": 260},
    "qwen2": {"vocab_size": 260},
    "qwen3": {},
}

# name -> (family, the 4-rank run's changes, micro-batch per rank, the trainer (model_parallel_hooks.TRAINERS)).
# The one-process reference runs the same recipe without the [parallel] changes, with micro-batch
# REFERENCE_MICRO (global batch 8: 2 micro-batches of 4, as 2 data ranks x 2 micro-batches of 2 are).
SCENARIOS = {
    "tp-llama": ("llama", {"parallel": {"tp": 2}}, 2, "gradients"),
    "tp-mistral": ("mistral", {"parallel": {"tp": 2}}, 2, "plain"),
    # the generated-answer metric runs under tensor parallel too (whole logits outside training)
    "tp-qwen2": ("qwen2", {"parallel": {"tp": 2}, "train": {"eval_samples": 4}}, 2, "plain"),
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
        "gradients",
    ),
    # Ulysses on packed rows of 256 tokens (many samples each: their boundaries must hold across ranks);
    # the reference isolates them with its dense block mask, the 4 ranks with per-sample SDPA
    "cp-packed-256": ("llama", {"parallel": {"cp": 2}, "data": {"packing": True, "max_seq_len": 256}}, 2, "gradients"),
    # an adapter under context parallel (the support table's fix for LoRA with tp)
    "lora-cp": ("llama", {"parallel": {"cp": 2}, "peft": {"kind": "lora", "r": 4}}, 2, "plain"),
    # both: rows padded to a multiple of cp, heads split over tp then cp, 2 key/value heads repeated
    "tp-cp": ("llama", {"parallel": {"tp": 2, "cp": 2}}, 4, "gradients"),
    # one step of two packed rows of 16,384 tokens: autograd's saved bytes per micro-batch
    "cp-16k": (
        "llama",
        {
            "parallel": {"cp": 2},
            "train": {"global_batch_size": 2, "steps": 1},
            "data": {"packing": True, "max_seq_len": 16384, "num_samples": 2300, "val_fraction": 0.005},
        },
        1,
        "activations",
    ),
}
REFERENCE_MICRO = {"cp-16k": 1}


def _without_parallel(changes: dict) -> dict:
    return {section: values for section, values in changes.items() if section != "parallel"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.parallel.model_parallel_hooks import TRAINERS

    root = tmp_path_factory.mktemp("model-parallel")
    models = {family: _save_tiny(root / family, family, **extra) for family, extra in FAMILIES.items()}
    out = {"one": {}, "four": {}}
    started = time.monotonic()
    for name, (family, changes, _micro, trainer) in SCENARIOS.items():
        out["one"][name] = str(root / "one" / name)
        config = recipe(
            out["one"][name], models[family], micro=REFERENCE_MICRO.get(name, 4), **_without_parallel(changes)
        )
        TRAINERS[trainer](config).train()
    one_process = time.monotonic() - started
    configs, trainers = [], []
    for name, (family, changes, micro, trainer) in SCENARIOS.items():
        out["four"][name] = str(root / "four" / name)
        configs.append(recipe(out["four"][name], models[family], kind="fsdp", micro=micro, **changes))
        trainers.append(trainer)
    started = time.monotonic()
    run_ranks(train_all, 4, configs, trainers, timeout=900)
    print(f"one process: {one_process:.0f} s; 4 ranks, {len(configs)} runs: {time.monotonic() - started:.0f} s")
    out["models"] = models
    return out


def records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def losses(run_dir: str) -> list[float]:
    return [r["loss"] for r in records(run_dir) if "loss" in r]


def assert_same_losses(run: str, reference: str, steps: int = 3) -> None:
    got, want = losses(run), losses(reference)
    assert len(got) == len(want) == steps
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


def assert_same_val_loss(run: str, reference: str) -> None:
    """Evaluation runs whole rows on every context rank (Ulysses only trains): the same val_loss."""
    final = [r for r in records(run) if "val_loss" in r][-1]
    want = [r for r in records(reference) if "val_loss" in r][-1]
    assert final["val_loss"] == pytest.approx(want["val_loss"], rel=TOLERANCE)


def test_cp_on_packed_rows_of_256_tokens_matches_one_process(runs):
    assert_same_losses(runs["four"]["cp-packed-256"], runs["one"]["cp-packed-256"])
    assert_same_val_loss(runs["four"]["cp-packed-256"], runs["one"]["cp-packed-256"])
    assert_same_gradients(runs["four"]["cp-packed-256"], runs["one"]["cp-packed-256"])
    widths = [r["tokens"] for r in records(runs["four"]["cp-packed-256"]) if "loss" in r]
    assert widths[0] > 8 * 200  # eight packed rows of up to 256 tokens per step, not eight samples


def test_lora_under_cp_matches_one_process(runs):
    assert_same_losses(runs["four"]["lora-cp"], runs["one"]["lora-cp"])
    assert os.path.exists(os.path.join(runs["four"]["lora-cp"], "final", "adapter_config.json"))


def test_tp_and_cp_together_match_one_process(runs):
    assert_same_losses(runs["four"]["tp-cp"], runs["one"]["tp-cp"])
    assert_same_val_loss(runs["four"]["tp-cp"], runs["one"]["tp-cp"])
    assert_same_gradients(runs["four"]["tp-cp"], runs["one"]["tp-cp"])


def test_a_16k_row_keeps_at_most_six_tenths_of_its_activations_per_rank_under_cp_2(runs):
    def measured(run_dir: str) -> list[dict]:
        found = []
        for name in sorted(os.listdir(run_dir)):
            if name.startswith("activations-rank-"):
                with open(os.path.join(run_dir, name), encoding="utf-8") as handle:
                    found += [json.loads(line) for line in handle]
        return found

    one, four = measured(runs["one"]["cp-16k"]), measured(runs["four"]["cp-16k"])
    assert len(one) == 2 and len(four) == 4  # 2 micro-batches of one row; one row per data rank
    widths = sorted(r["tokens"] for r in one)  # packed rows close to 16,384 tokens, padded to even under cp
    assert widths[0] > 16000 and sorted({r["tokens"] for r in four}) == sorted({-(-w // 2) for w in widths})
    ratio = max(r["saved_bytes"] for r in four) / max(r["saved_bytes"] for r in one)
    print(
        f"16,384-token row: {max(r['saved_bytes'] for r in one) / 2**20:.1f} MiB saved for the backward on one "
        f"process, {max(r['saved_bytes'] for r in four) / 2**20:.1f} MiB per rank under cp = 2 (ratio {ratio:.2f})"
    )
    assert ratio <= 0.6
    assert_same_losses(runs["four"]["cp-16k"], runs["one"]["cp-16k"], steps=1)


def test_the_plan_counts_each_rank_tensor_parallel_shard_exactly(runs):
    """`ditty check --plan` for the (dp 2, tp 2) run: its per-rank parameter and optimizer-state bytes
    are the ones the run measured in its local tensors (env.json, the largest rank)."""
    from ditty.plan import Target, make_plan
    from ditty.plan.memory import local_parameter_bytes
    from ditty.plan.parameters import rank_state

    config = recipe(runs["four"]["tp-llama"], runs["models"]["llama"], kind="fsdp", micro=2, parallel={"tp": 2})
    plan = make_plan(config, Target(device="cpu", gpus_per_node=4), with_knobs=False)
    with open(os.path.join(runs["four"]["tp-llama"], "env.json"), encoding="utf-8") as handle:
        measured = json.load(handle)["memory"]
    params = max(local_parameter_bytes(plan.memory.held, plan.settings, rank) for rank in range(4))
    optimizer = max(rank_state(plan.memory.held, plan.settings, rank).optimizer for rank in range(4))
    print(
        f"per rank: parameters {params} planned, {measured['parameter_bytes_per_rank']} measured; "
        f"optimizer state {optimizer} planned, {measured['optimizer_state_bytes_per_rank']} measured"
    )
    assert params == measured["parameter_bytes_per_rank"]
    assert optimizer == measured["optimizer_state_bytes_per_rank"]
