"""Tiny GRPO recipes for the rollout backend tests (tests/rl/test_vllm.py, test_rollout_backends.py): the 2-layer Llama
of tests/conftest.py, the built-in addition prompts, 2 prompts x 4 completions per step."""

from __future__ import annotations

import json
from pathlib import Path

RECIPE = """
[run]
output_dir = "{out}"
device = "cpu"
seed = 0
num_threads = 1
[model]
path = "{model}"
[data]
source = "builtin"
name = "addition"
format = "prompt"
max_seq_len = 32
num_samples = 200
[train]
steps = {steps}
global_batch_size = 8
micro_batch_size = 8
log_every = 1
eval_every = 0
eval_samples = 0
precision = "fp32"
[optimizer]
lr = 1e-3
[checkpoint]
every = 2
every_minutes = 0.0
[[pipeline.preprocessors]]
use = "tests.train.resume_hooks:SignalAt"
[logging]
progress = false
[rl]
kind = "grpo"
group_size = 4
rewards = ["tests.rl.rewards_for_tests:text_hash_reward"]
[rollout]
max_new_tokens = 4
"""
NOT_COMPARED = ("tokens_per_s", "elapsed_s", "mfu", "hfu", "peak_mem_mb", "rollout/generate_s", "rollout/tokens_per_s")


def write_recipe(folder: Path, model: str, steps: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.toml"
    path.write_text(RECIPE.format(out=folder / "run", model=model, steps=steps))
    return path


def records(run_dir: Path) -> list[dict]:
    """The logged steps without the timings (what a bitwise resume reproduces)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [
        {k: v for k, v in r.items() if k not in NOT_COMPARED and not k.startswith("rollout/generation")}
        for r in rows
        if "loss" in r
    ]
