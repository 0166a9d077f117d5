"""The bundled post-training recipes run a few steps from one tiny start, in-process: the runs whose
metrics tests/objectives/test_pinned_runs.py pins (and `python -m tests.objectives.pinned_runs DIR`
records, to pin them again after a deliberate change)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Each run: a bundled recipe and the flags that make it a few steps long. Everything else is the recipe.
COMMON = ["--logging.progress", "false", "--train.log_every", "1", "--checkpoint.every", "0"]
SAMPLED_ONLY = ("--rl.guidance_column", "", "--rl.negative_advantage_scale", "1.0")
RUNS = {
    # The GRPO pins were recorded at the recipe's earlier optimizer and schedule (AdamW at lr 1.5e-4, no
    # warmup, wsd), with every completion sampled and GRPO's own advantages; they pin the loss, not the
    # recipe: both runs pass them. The exact-match reward is named
    # by its module's former name, which still imports (ditty.MOVED_MODULES) and names the pinned metrics.
    "grpo": [
        "tiny_grpo",
        *("--optimizer.kind", "adamw", "--optimizer.lr", "1.5e-4"),
        *("--scheduler.kind", "wsd", "--scheduler.warmup_steps", "0"),
        *("--scheduler.decay_fraction", "0.25"),
        *SAMPLED_ONLY,
        "--train.steps",
        "3",
        "--train.eval_samples",
        "32",
        "--rl.rewards",
        '["ditty.objectives.builtin_rewards:exact_match","tests.rl.rewards_for_tests:text_hash_reward"]',
    ],
    "grpo_kl": [
        "tiny_grpo",
        *("--optimizer.kind", "adamw", "--optimizer.lr", "1.5e-4"),
        *("--scheduler.kind", "wsd", "--scheduler.warmup_steps", "0"),
        *("--scheduler.decay_fraction", "0.25"),
        *SAMPLED_ONLY,
        "--train.steps",
        "3",
        "--train.eval_samples",
        "32",
        "--train.micro_batch_size",
        "64",
        "--rl.beta",
        "0.04",
        "--rl.updates_per_rollout",
        "2",
        "--rl.importance",
        "sequence",
        "--rl.loss",
        "grpo",
        "--rl.rewards",
        '["tests.rl.rewards_for_tests:text_hash_reward"]',
    ],
    # beta 2: the values below were recorded at it (the recipe says 0.5); the pins check the loss, not the recipe
    "dpo": [
        "tiny_dpo",
        "--train.steps",
        "3",
        "--train.eval_samples",
        "32",
        "--scheduler.warmup_steps",
        "1",
        "--preference.beta",
        "2.0",
    ],
    "reward": ["tiny_reward", "--train.steps", "3", "--train.eval_samples", "64", "--scheduler.warmup_steps", "1"],
}
KEYS_NOT_PINNED = (
    "tokens_per_s",
    "elapsed_s",
    "mfu",
    "hfu",
    "rollout/generate_s",
    "rollout/tokens_per_s",
    "rollout/generation_share",
    "memory",
    "peak",
)


def run(name: str, model_dir: str, out: Path) -> list[dict]:
    from ditty.cli import main

    recipe, *flags = RUNS[name]
    code = main(["run", recipe, "--model.path", model_dir, "--run.output_dir", str(out / name), *COMMON, *flags])
    assert code == 0, f"{name}: exit {code}"
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(k.startswith(p) for p in KEYS_NOT_PINNED)} for r in records]


if __name__ == "__main__":
    from tests.conftest import _save_tiny

    out = Path(sys.argv[1])
    model = _save_tiny(out / "start", "llama")
    pins = {name: run(name, model, out) for name in RUNS}
    (out / "pins.json").write_text(json.dumps(pins, indent=1, sort_keys=True))
    print(json.dumps(pins, indent=1, sort_keys=True))
