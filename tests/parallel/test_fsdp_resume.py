"""An FSDP run on two processes resumes on one, with the README's command (`--parallel.kind none`)."""

from __future__ import annotations

import json

import pytest

from ditty.cli import main

SHORT = ["--data.num_samples", "2000", "--train.eval_samples", "8", "--train.eval_every", "0"]
SHORT += ["--scheduler.warmup_steps", "1", "--logging.progress", "false", "--train.micro_batch_size", "32"]


@pytest.mark.slow  # two gloo processes, then one: ~40 s
def test_fsdp_on_two_processes_resumes_on_one(tmp_path, capsys):
    out = str(tmp_path / "run")
    two = ["run", "tiny_sft", "--run.output_dir", out, "--train.steps", "2", *SHORT]
    assert main([*two, "--nproc-per-node", "2", "--parallel.kind", "fsdp"]) == 0
    capsys.readouterr()

    one = ["run", "tiny_sft", "--run.output_dir", out, "--train.steps", "4", *SHORT, "--parallel.kind", "none"]
    one += ["--checkpoint.overwrite_finished", "true"]  # extending a finished run is asked for in so many words
    assert main(one) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "resumed from step 2" in captured.out + captured.err
    records = [json.loads(line) for line in open(f"{out}/metrics.jsonl", encoding="utf-8")]
    assert max(r["step"] for r in records) == 4
