"""`[mtp]` through whole runs: the heads' metrics in metrics.jsonl, final/ and `ditty generate --speculative
mtp`; a run killed with SIGKILL resumes bitwise; 2 real gloo ranks (DDP and FSDP2) train as 1 process,
for SFT and on-policy distillation; an adapter run keeps its heads; and `ditty check` refuses heads where
they cannot apply, with exit code 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.objectives import test_distill
from tests.parallel.harness import run_ranks
from tests.train.mtp_workers import mtp_steps
from tests.train.test_resume import RANDOM_LLAMA, complete_steps, ditty, losses, write_recipe

pytestmark = pytest.mark.slow

MTP = ["--mtp.depth", "2", "--mtp.weight", "0.3", "--train.loss_chunks", "4"]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def heads_losses(run: Path) -> list[tuple]:
    return [(r["step"], r["mtp/loss/1"], r["mtp/loss/2"], r["grad_norm"]) for r in records(run)]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {**load_file(str(run / "final" / "model.safetensors")), **load_file(str(run / "final" / "mtp.safetensors"))}


def test_a_run_logs_the_heads_and_drafts_greedy_text_with_them(tmp_path):
    recipe = write_recipe(tmp_path)
    done = ditty("run", str(recipe), *MTP, "--train.eval_every", "6", "--train.eval_samples", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    logged = records(tmp_path / "run")
    assert all({"mtp/loss/1", "mtp/loss/2", "mtp/loss"} <= set(r) for r in logged)
    evaluated = [r for r in logged if "val_loss" in r]
    assert evaluated and all(0.0 <= r["val_mtp_acceptance/2"] <= 1.0 and r["val_mtp_loss/1"] > 0 for r in evaluated)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")  # loads as a plain model
    plain = ditty("generate", str(tmp_path / "run"), "12+34=", "--max-new-tokens", "8")
    drafted = ditty("generate", str(tmp_path / "run"), "12+34=", "--max-new-tokens", "8", "--speculative", "mtp")
    assert plain.returncode == drafted.returncode == 0, drafted.stderr[-2000:]
    assert drafted.stdout == plain.stdout
    assert "speculative (mtp, depth 2)" in drafted.stderr


def test_kill_9_then_resume_is_bitwise_equal(tmp_path):
    reference = write_recipe(tmp_path, "reference.toml", out="reference")
    assert ditty("run", str(reference), *MTP).returncode == 0
    recipe = write_recipe(tmp_path)
    killed = ditty("run", str(recipe), *MTP, env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "run") == ["step-4"]
    resumed = ditty("run", str(recipe), *MTP)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    assert losses(tmp_path / "run") == losses(tmp_path / "reference")
    assert heads_losses(tmp_path / "run") == heads_losses(tmp_path / "reference")
    expected, got = final_weights(tmp_path / "reference"), final_weights(tmp_path / "run")
    assert sorted(got) == sorted(expected) and any(k.startswith("mtp.") for k in got)
    assert all(torch.equal(got[name], expected[name]) for name in expected)

    # `ditty export` of the last checkpoint writes the heads beside the model too
    exported = ditty("export", str(tmp_path / "run"), "-o", str(tmp_path / "exported"))
    assert exported.returncode == 0, exported.stderr[-2000:]
    from safetensors.torch import load_file

    heads = load_file(str(tmp_path / "exported" / "mtp.safetensors"))
    assert sorted(heads) == sorted(k for k in got if k.startswith("mtp."))


def test_an_adapter_run_trains_its_heads_in_full_and_keeps_them(tmp_path):
    recipe = write_recipe(tmp_path, peft='kind = "lora"\nr = 4\ntarget_modules = ["q_proj", "v_proj"]')
    done = ditty("run", str(recipe), *MTP, "--train.steps", "4", "--checkpoint.final_format", "merged")
    assert done.returncode == 0, done.stderr[-3000:]
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "mtp.safetensors").is_file()
    assert (final / "merged" / "mtp.safetensors").is_file()
    from ditty.train.generate import generate

    merged = str(final / "merged")  # the adapter's base is a random model: no hub id to load it from
    assert generate(merged, "12+34=", 6, speculative="mtp") == generate(merged, "12+34=", 6)


def sft_recipe(tmp_path: Path) -> str:
    # without dropout: its masks are drawn per process, so 2 ranks would not draw 1 process's
    path = write_recipe(
        tmp_path, "sft.toml", model=RANDOM_LLAMA.replace("attention_dropout = 0.1", "attention_dropout = 0.0")
    )
    path.write_text(path.read_text() + "[mtp]\ndepth = 2\nweight = 0.3\n")
    return str(path)


def distill_recipe(tmp_path: Path, teacher: str) -> str:
    path = test_distill.distill_recipe(tmp_path, teacher, "data_only_steps = 0")
    text = path.read_text().replace("global_batch_size = 8", "global_batch_size = 16")
    path.write_text(text + "[mtp]\ndepth = 2\nweight = 0.3\n")
    return str(path)


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize(("row", "kind"), [("sft", "ddp"), ("sft", "fsdp"), ("gkd", "fsdp")])
def test_two_ranks_train_the_heads_as_one_process(tmp_path, tiny_llama_dir, row, kind):
    recipe = sft_recipe(tmp_path) if row == "sft" else distill_recipe(tmp_path, tiny_llama_dir)
    (one,) = run_ranks(mtp_steps, 1, recipe, "none", str(tmp_path / "one"), 3, timeout=400)
    two = run_ranks(mtp_steps, 2, recipe, kind, str(tmp_path / "two"), 3, timeout=400)
    assert two[0]["losses"] == two[1]["losses"]
    assert len(set(one["losses"])) == 3
    for a, b in zip(one["losses"], two[0]["losses"]):
        assert abs(a - b) < 1e-6, (one["losses"], two[0]["losses"])
    for mine, theirs in zip(one["loss_metrics"], two[0]["loss_metrics"]):
        for key in ("mtp/loss/1", "mtp/loss/2"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-5)
    heads = [k for k in one["state"] if "ditty_mtp." in k]
    assert heads and set(heads) <= set(two[0]["state"])
    worst = max(float((one["state"][k] - two[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-6, worst


def test_check_refuses_heads_for_a_classifier_with_exit_2_and_no_traceback():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ditty", "check", "tiny_bert_topics", "--mtp.depth", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "`mtp.depth`" in done.stderr and "model.task = 'seq-classification'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
