"""Post-training under tensor parallel: per-token log-probabilities on the head's vocabulary shards
(ditty.stages.vocab_parallel_logps). `tiny_dpo` as a full finetune (the reference a sharded copy of the
starting weights) at tp 2 x dp 2 through the real launcher against one process: 4 steps with the same
losses, gradient norms and DPO metrics (the metrics are averaged over the data-parallel ranks, not
counted once per tensor-parallel rank). `tiny_grpo` at tp 2 x dp 2 (4 processes; each tp group shares
its prompts and samples them alike with generate on the sharded policy, logits gathered) and RLOO at
tp = 2 against one process: the same rewards, losses and gradient norms, and the held-out evaluation.
Online pairs, GKD and the reward model under tp: tests/parallel/test_tp_rows.py; the DPO family, the
reward model and GKD on the data under cp: tests/parallel/test_cp_rows.py. The vLLM backends stay
refused under tp, and under cp the rows that sample and a precomputed reference.
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
    "--peft.kind", "none", "--train.steps", "4", "--train.global_batch_size", "8", "--train.micro_batch_size", "2",
    "--train.log_every", "1", "--train.eval_every", "0", "--train.eval_samples", "0", "--scheduler.warmup_steps",
    "0", "--optimizer.lr", "1e-5", "--logging.progress", "false", "--checkpoint.every", "0", "--run.device", "cpu",
]  # fmt: skip
NOT_COMPARED = (
    "tokens_per_s",
    "elapsed_s",
    "mfu",
    "hfu",
    "peak_mem_mb",
    "rollout/generate_s",
    "rollout/tokens_per_s",
    "rollout/generation_share",
)
"""Timings and memory: the two runs share a machine, not a clock."""


def ditty(*args: str, processes: int = 1) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ditty", *args]
    if processes > 1:
        command += ["--nproc-per-node", str(processes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NOT_COMPARED} for r in rows if "loss" in r]


def test_dpo_at_tp_2_by_dp_2_matches_one_process(tmp_path, tiny_llama_dir):
    # the acceptance: 4 processes (tp 2 x dp 2), 4 steps of 8 pairs
    flags = ["tiny_dpo", "--model.path", tiny_llama_dir, *SHORT]
    one = ditty("run", *flags, "--run.output_dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    tp = ditty(
        "run", *flags, "--run.output_dir", str(tmp_path / "tp"), "--parallel.kind", "fsdp", "--parallel.tp", "2",
        processes=4,
    )  # fmt: skip
    assert tp.returncode == 0, tp.stderr[-3000:]
    want, got = steps(tmp_path / "one"), steps(tmp_path / "tp")
    assert [r["step"] for r in got] == [1, 2, 3, 4] and want[0].keys() == got[0].keys()
    assert "rewards/margins" in got[0] and "logps/chosen" in got[0]
    for expected, actual in zip(want, got):
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, actual[key], value)


GRPO = [
    "--train.global_batch_size", "16", "--train.micro_batch_size", "8", "--train.log_every", "1",
    "--train.eval_every", "0", "--logging.progress", "false", "--checkpoint.every", "0", "--run.device", "cpu",
    "--rollout.generation_batch_size", "1", "--rl.rewards", '["tests.rl.rewards_for_tests:text_hash_reward"]',
]  # fmt: skip


@pytest.mark.parametrize(
    "flags, processes",
    [
        (["--train.steps", "4", "--train.eval_samples", "0"], 4),  # tp 2 x dp 2
        (["--rl.advantage", "rloo", "--train.steps", "2", "--train.eval_samples", "8"], 2),  # and the final evaluation
    ],
    ids=["grpo-tp2-dp2", "rloo-tp2"],
)
def test_grpo_and_rloo_under_tp_match_one_process(tmp_path, flags, processes):
    from tests.rl.helpers import save_turn_ending_llama

    model = save_turn_ending_llama(tmp_path / "start", hidden_size=64, intermediate_size=128)
    recipe = ["tiny_grpo", "--model.path", model, *GRPO, *flags]
    one = ditty("run", *recipe, "--run.output_dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    tp = ditty(
        "run", *recipe, "--run.output_dir", str(tmp_path / "tp"), "--parallel.kind", "fsdp", "--parallel.tp", "2",
        processes=processes,
    )  # fmt: skip
    assert tp.returncode == 0, tp.stderr[-3000:]
    want, got = steps(tmp_path / "one"), steps(tmp_path / "tp")
    assert len(got) == len(want) and want[0].keys() == got[0].keys() and "reward" in got[0]
    assert all(r["reward_std"] > 0 for r in want)  # rewards that tell the samples apart
    for expected, actual in zip(want, got):
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (key, actual[key], value)
    evaluated = [json.loads(line) for line in (tmp_path / "tp" / "metrics.jsonl").read_text().splitlines()]
    alone = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("val_exact_match") for r in evaluated] == [r.get("val_exact_match") for r in alone]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["tiny_grpo", "--parallel.tp", "2", "--rollout.backend", "vllm-server"], "takes whole weights"),
        (["tiny_distill", "--parallel.tp", "2", "--rollout.backend", "vllm"], "takes whole weights"),
        (["tiny_grpo", "--parallel.cp", "2"], "whole rows a rank makes alone"),
        (["tiny_distill", "--parallel.cp", "2"], "whole rows a rank makes alone"),
        (["tiny_dpo", "--parallel.cp", "2", "--preference.reference", "precompute"], "nothing to look up"),
    ],
)
def test_sampling_on_vllm_under_tp_and_post_training_under_cp_stay_refused(tmp_path, tiny_llama_dir, flags, words):
    done = ditty(
        "check", *flags, "--model.path", tiny_llama_dir, "--parallel.kind", "fsdp", "--run.output_dir", str(tmp_path),
        processes=2,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stdout + done.stderr, done.stdout + done.stderr
