"""The bundled tiny_sft under tensor parallel as users run it: the byte tokenizer's 259 tokens at tp = 2
(no vocabulary flag: 130 and 129 rows per rank), untied and tied (`--model.config.tie_word_embeddings
true`), through the real launcher (`ditty run tiny_sft --parallel.kind fsdp --parallel.tp 2
--nproc-per-node 4`) against one process: 4 steps of a global batch of 8, losses within 1e-5, the
same held-out loss, and a `final/` that `AutoModelForCausalLM` loads with 259 embedding rows (one
tensor for a tied head). The tied run killed with SIGKILL resumes bitwise, and its checkpoint resumes
on one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.parallel.harness import relative_error, run_ranks, run_ranks_until_killed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5
VOCAB = 259
HOOK = "tests.train.resume_hooks:SignalAt"
SHORT = [
    "--train.steps", "4", "--train.global_batch_size", "8", "--train.log_every", "1", "--train.eval_every", "0",
    "--train.eval_samples", "16", "--scheduler.warmup_steps", "1", "--data.num_samples", "400",
    "--run.device", "cpu", "--logging.progress", "false", "--checkpoint.every", "2", "--train.micro_batch_size", "2",
]  # fmt: skip
"""4 steps of 8 samples in micro-batches of 2: 4 of them on one process, 2 per data rank at dp 2 x tp 2."""
TP = ["--parallel.kind", "fsdp", "--parallel.tp", "2"]
TIED = ["--model.config.tie_word_embeddings", "true"]


def ditty_run(out: Path, *flags: str, processes: int = 1) -> None:
    command = [sys.executable, "-m", "ditty", "run", "tiny_sft", *SHORT, "--run.output_dir", str(out), *flags]
    if processes > 1:
        command += ["--nproc-per-node", str(processes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def tied_config(out: Path, *flags: str, hook: bool = False):
    """The tied tp run's recipe as the harness trains it (flags as `ditty run` reads them); `hook`: with
    the stage that kills its process where DITTY_TEST_SIGNAL_AT says (a no-op when it is unset)."""
    from ditty.config.loader import load_recipe
    from ditty.config.overrides import apply_overrides
    from ditty.config.sections import ComponentSpec

    config = apply_overrides(load_recipe("tiny_sft"), [*SHORT, *TIED, "--run.output_dir", str(out), *flags]).config
    if hook:
        config = replace(config, pipeline=replace(config.pipeline, preprocessors=[ComponentSpec(use=HOOK)]))
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ditty.train import Trainer
    from tests.parallel.model_parallel_hooks import train_all, train_killed_at

    root = tmp_path_factory.mktemp("tp-any-vocabulary")
    out = {name: root / name for name in ("one", "tp", "one-tied", "tp-tied", "killed", "one-resumed")}
    ditty_run(out["one"])
    ditty_run(out["tp"], *TP, processes=4)  # the command docs/scale/parallel.md shows
    ditty_run(out["one-tied"], *TIED)
    ditty_run(out["tp-tied"], *TIED, *TP, processes=4)
    # SIGKILL inside step 3 of the tied run (the harness's ranks: the same recipe), then `resume = "auto"`
    killed = tied_config(out["killed"], *TP, hook=True)
    run_ranks_until_killed(train_killed_at, 4, killed, "2:1:KILL", timeout=600)
    killed_at = max(losses(out["killed"]))
    resumed_from = run_ranks(train_all, 4, [killed], ["plain"], timeout=600)[0]  # the hook unarmed
    one = Trainer(
        tied_config(out["one-resumed"], "--checkpoint.resume", str(out["tp-tied"] / "checkpoints" / "step-2"))
    )
    resumed_from.append(one.resume.step)
    one.train()
    return {name: str(path) for name, path in out.items()} | {"killed_at": killed_at, "resumed_from": resumed_from}


def records(run_dir) -> list[dict]:
    with open(os.path.join(str(run_dir), "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def worst(got: dict[int, float], want: dict[int, float]) -> float:
    return max(abs(got[s] - want[s]) / abs(want[s]) for s in got)


@pytest.mark.parametrize("name", ["tp", "tp-tied"])
def test_tp_2_on_the_byte_vocabulary_matches_one_process(runs, name):
    reference = "one" if name == "tp" else "one-tied"
    got, want = losses(runs[name]), losses(runs[reference])
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    print(f"{name}: losses {[round(got[s], 7) for s in sorted(got)]}, worst relative error {worst(got, want):.1e}")
    assert worst(got, want) < TOLERANCE
    held_out = [r for r in records(runs[name]) if "val_loss" in r][-1]
    expected = [r for r in records(runs[reference]) if "val_loss" in r][-1]
    assert held_out["val_loss"] == pytest.approx(expected["val_loss"], rel=TOLERANCE)
    assert held_out["val_exact_match"] == expected["val_exact_match"]  # greedy decoding on gathered logits


@pytest.mark.parametrize("name", ["tp", "tp-tied"])
def test_final_holds_the_original_vocabulary_and_loads_with_transformers(runs, name):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = os.path.join(runs[name], "final")
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.get_input_embeddings().weight.shape[0] == VOCAB
    assert model.get_output_embeddings().weight.shape[0] == VOCAB
    tied = name == "tp-tied"
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    got = load_file(os.path.join(final, "model.safetensors"))
    want = load_file(os.path.join(runs["one-tied" if tied else "one"], "final", "model.safetensors"))
    assert sorted(got) == sorted(want) and ("lm_head.weight" in got) != tied  # a tied head is saved once
    error = relative_error(got, want)
    print(f"{name}: final weights' relative error {error:.1e}")
    assert error < TOLERANCE
    with torch.no_grad():
        logits = model(torch.tensor([[ord(c) for c in "12+34="]])).logits
    assert logits.shape[-1] == VOCAB and torch.isfinite(logits).all()


def test_a_killed_tied_run_resumes_bitwise_and_on_one_process(runs):
    assert runs["killed_at"] == 2  # killed inside step 3, after step-2's checkpoint
    assert runs["resumed_from"] == [2, 2]  # the killed run (tp 2 x dp 2) and one process
    uninterrupted = losses(runs["tp-tied"])
    assert losses(runs["killed"]) == uninterrupted  # every step, bitwise
    got = losses(runs["one-resumed"])
    assert sorted(got) == [3, 4]
    print(f"one process from the tied tp run's step 2: worst relative error {worst(got, uninterrupted):.1e}")
    assert worst(got, uninterrupted) < TOLERANCE


def test_ditty_export_of_the_tied_tp_checkpoint_keeps_one_259_row_matrix(runs, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ditty.cli import main

    exported = tmp_path / "exported"
    assert main(["export", os.path.join(runs["tp-tied"], "checkpoints", "step-4"), "-o", str(exported)]) == 0
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert model.get_input_embeddings().weight.shape[0] == VOCAB
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    got = load_file(str(exported / "model.safetensors"))
    want = load_file(os.path.join(runs["tp-tied"], "final", "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)  # step 4 = the final model
