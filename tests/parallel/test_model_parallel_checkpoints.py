"""DCP checkpoints across meshes: a (dp 2, tp 2) run killed with SIGKILL resumes bitwise; its
checkpoint resumes on (dp 4), on (tp 4) and on one process, and a one-process checkpoint resumes
on (dp 2, tp 2), each within 1e-5 of the run it continues; `ditty export` of the tensor-parallel run
gives an ordinary Hugging Face model.

4 real gloo processes (several spawns of the forked harness), a 2-layer Llama with 4 key/value heads
(so tp = 4 divides them) and the byte tokenizer's 259 tokens (uneven vocabulary shards: 130/129 rows
at tp = 2, 65/65/65/64 at tp = 4, resharded between them), fp32, no dropout, 4 steps with a
checkpoint every 2.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch

from tests.conftest import _save_tiny
from tests.parallel.harness import run_ranks, run_ranks_until_killed
from tests.parallel.model_parallel_hooks import recipe, train_all, train_killed_at

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

TOLERANCE = 1e-5
STEPS = 4
HOOK = "tests.train.resume_hooks:SignalAt"  # armed only where the kill is wanted
COMMON = {"checkpoint": {"every": 2, "keep_last": 3}, "preprocessors": [HOOK]}
MESHES = {"2x2": {"tp": 2}, "4x1": {}, "1x4": {"tp": 4}}


def run_recipe(out, model_dir, mesh=None, **changes):
    """micro-batch 2 everywhere: the global batch of 8 is 2 x 2 x 2 on 2x2, 2 x 4 x 1 on 4x1, 2 x 1 x 4
    on 1x4 and one process."""
    changes = {**COMMON, **changes}
    if mesh is None:
        return recipe(str(out), model_dir, micro=2, steps=STEPS, **changes)
    return recipe(str(out), model_dir, kind="fsdp", micro=2, steps=STEPS, parallel=MESHES[mesh], **changes)


def from_checkpoint(run_dir, step: int) -> dict:
    return {"checkpoint": {**COMMON["checkpoint"], "resume": os.path.join(str(run_dir), "checkpoints", f"step-{step}")}}


def losses(run_dir) -> dict[int, float]:
    with open(os.path.join(str(run_dir), "metrics.jsonl"), encoding="utf-8") as handle:
        return {r["step"]: r["loss"] for r in map(json.loads, handle) if "loss" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ditty.train import Trainer

    root = tmp_path_factory.mktemp("mesh-checkpoints")
    model = _save_tiny(root / "llama", "llama", num_key_value_heads=4)  # 259 tokens
    out = {name: root / name for name in ("one", "2x2", "killed", "4x1", "1x4", "back", "one-resumed")}
    started = time.monotonic()
    Trainer(run_recipe(out["one"], model)).train()
    run_ranks(train_all, 4, [run_recipe(out["2x2"], model, "2x2")], ["plain"], timeout=600)
    # SIGKILL in step 3's second micro-batch: step-2 is the newest complete checkpoint
    run_ranks_until_killed(train_killed_at, 4, run_recipe(out["killed"], model, "2x2"), "2:1:KILL", timeout=600)
    killed_at = max(losses(out["killed"]))
    saved = sorted(p.name for p in (out["killed"] / "checkpoints").iterdir() if (p / "COMPLETE").exists())
    resumed = [
        run_recipe(out["killed"], model, "2x2"),  # the same directory: checkpoint.resume = "auto"
        run_recipe(out["4x1"], model, "4x1", **from_checkpoint(out["2x2"], 2)),
        run_recipe(out["1x4"], model, "1x4", **from_checkpoint(out["2x2"], 2)),
        run_recipe(out["back"], model, "2x2", **from_checkpoint(out["one"], 2)),
    ]
    resumed_from = run_ranks(train_all, 4, resumed, ["plain"] * len(resumed), timeout=600)[0]
    one_resumed = Trainer(run_recipe(out["one-resumed"], model, **from_checkpoint(out["2x2"], 2)))
    resumed_from.append(one_resumed.resume.step)
    one_resumed.train()
    print(f"7 runs ({killed_at} steps before the kill): {time.monotonic() - started:.0f} s")
    return {name: str(path) for name, path in out.items()} | {
        "model": model,
        "killed_at": killed_at,
        "saved_before_kill": saved,
        "resumed_from": resumed_from,
    }


def test_a_killed_2x2_run_resumes_bitwise(runs):
    assert runs["killed_at"] == 2  # killed inside step 3, after step-2's checkpoint
    assert runs["saved_before_kill"] == ["step-2"]
    assert runs["resumed_from"] == [2, 2, 2, 2, 2]  # the killed run, 4x1, 1x4, back on 2x2, one process
    assert losses(runs["killed"]) == losses(runs["2x2"])  # every step, bitwise
    from safetensors.torch import load_file

    got = load_file(os.path.join(runs["killed"], "final", "model.safetensors"))
    want = load_file(os.path.join(runs["2x2"], "final", "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize("where,continues", [("4x1", "2x2"), ("1x4", "2x2"), ("one-resumed", "2x2"), ("back", "one")])
def test_a_checkpoint_resumes_on_another_mesh(runs, where, continues):
    got, want = losses(runs[where]), losses(runs[continues])
    assert sorted(got) == [3, 4]  # resumed after step 2
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"{where} from {continues}'s step 2: losses {[round(got[s], 6) for s in sorted(got)]}, worst {worst:.1e}")
    assert worst < TOLERANCE


def test_ditty_export_of_the_tp_run_is_an_ordinary_hugging_face_model(runs, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ditty.cli import main

    exported = tmp_path / "exported"
    assert main(["export", runs["2x2"], "-o", str(exported)]) == 0
    model = AutoModelForCausalLM.from_pretrained(exported)
    got, want = (
        load_file(str(exported / "model.safetensors")),
        load_file(os.path.join(runs["2x2"], "final", "model.safetensors")),
    )
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)  # step 4 = the final model
    with torch.no_grad():
        logits = model(torch.tensor([[ord(c) for c in "12+34="]])).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == 259
    shutil.rmtree(exported)
