"""The DPO family under tensor parallel: per-sequence log-probabilities on the head's vocabulary shards
(ditty.stages.vocab_parallel_logps), the policy and its frozen reference copy split alike. `tiny_dpo`
as a full finetune (the reference a sharded copy of the starting weights) at tp = 2 through the real
launcher against one process: 3 steps with the same losses, gradient norms and DPO metrics (the
metrics are averaged over the data-parallel ranks, not counted once per tensor-parallel rank). The
rows that read a scalar head, whole distributions or generate stay refused under tp, and every
post-training row under cp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "--peft.kind", "none", "--train.steps", "3", "--train.global_batch_size", "8", "--train.micro_batch_size", "2",
    "--train.log_every", "1", "--train.eval_every", "0", "--train.eval_samples", "0", "--scheduler.warmup_steps",
    "0", "--optimizer.lr", "1e-5", "--logging.progress", "false", "--checkpoint.every", "0", "--run.device", "cpu",
]  # fmt: skip
NOT_COMPARED = ("tokens_per_s", "elapsed_s", "mfu", "hfu", "peak_mem_mb")


def ditty(*args: str, processes: int = 1) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ditty", *args]
    if processes > 1:
        command += ["--nproc-per-node", str(processes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NOT_COMPARED} for r in rows if "loss" in r]


def test_dpo_at_tp_2_matches_one_process(tmp_path, tiny_llama_dir):
    flags = ["tiny_dpo", "--model.path", tiny_llama_dir, *SHORT]
    one = ditty("run", *flags, "--run.output_dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    tp = ditty(
        "run", *flags, "--run.output_dir", str(tmp_path / "tp"), "--parallel.kind", "fsdp", "--parallel.tp", "2",
        processes=2,
    )  # fmt: skip
    assert tp.returncode == 0, tp.stderr[-3000:]
    want, got = steps(tmp_path / "one"), steps(tmp_path / "tp")
    assert [r["step"] for r in got] == [1, 2, 3] and want[0].keys() == got[0].keys()
    assert "rewards/margins" in got[0] and "logps/chosen" in got[0]
    for expected, actual in zip(want, got):
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, actual[key], value)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["tiny_grpo", "--parallel.tp", "2"], "generate with the model"),
        (["tiny_reward", "--parallel.tp", "2"], "scalar head"),
        (["tiny_dpo", "--parallel.cp", "2", "--peft.kind", "none"], "not on sequence shards (cp)"),
    ],
)
def test_the_other_post_training_rows_stay_refused_under_tp_or_cp(tmp_path, tiny_llama_dir, flags, words):
    done = ditty(
        "check", *flags, "--model.path", tiny_llama_dir, "--parallel.kind", "fsdp", "--run.output_dir", str(tmp_path),
        processes=2,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "scale.post-training" in done.stdout + done.stderr or words in done.stdout + done.stderr
    assert words in done.stdout + done.stderr, done.stdout + done.stderr
