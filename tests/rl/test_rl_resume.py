"""A GRPO run killed with SIGKILL resumes with the same rollouts and losses, bitwise: the sampling
RNG, the prompt cursor and (mid-reuse, updates_per_rollout = 2) the buffered rollouts are part of
the checkpoint. Real `python -m ditty run` processes; the kill comes from a test-only preprocessor
at a fixed step (tests.train.resume_hooks:SignalAt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditty.config.sections import ComponentSpec
from ditty.config.writer import recipe_to_toml
from tests.rl.helpers import grpo_config
from tests.train.test_resume import complete_steps, ditty

pytestmark = pytest.mark.slow


def write(tmp_path: Path) -> Path:
    from dataclasses import replace

    config = grpo_config(
        tmp_path,
        train=dict(steps=6),
        checkpoint=dict(every=3, every_minutes=0.0),
        rewards=["tests.rl.rewards_for_tests:length_reward"],
        updates_per_rollout=2,
        temperature=1.0,
    )
    config = replace(
        config,
        pipeline=replace(config.pipeline, preprocessors=[ComponentSpec(use="tests.train.resume_hooks:SignalAt")]),
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "grpo.toml"
    path.write_text(recipe_to_toml(config))
    return path


def records(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = ("step", "loss", "grad_norm", "reward", "reward_std", "completions/mean_length")
    return [tuple(r.get(k) for k in keys) for r in rows if "loss" in r]


def test_sigkill_mid_reuse_resumes_with_the_same_rollouts_and_losses(tmp_path):
    reference = write(tmp_path / "a")
    done = ditty("run", str(reference))
    assert done.returncode == 0, done.stderr[-3000:]
    expected = records(tmp_path / "a" / "run")
    assert len(expected) == 6 and len({r[3] for r in expected}) > 1  # rollouts differ from one to the next

    recipe = write(tmp_path / "b")
    # 0-based step 4 (the 5th), its 2nd micro-batch: after step-3, which holds the half-used rollouts.
    killed = ditty("run", str(recipe), env={"DITTY_TEST_SIGNAL_AT": "4:1:KILL"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "b" / "run") == ["step-3"]
    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 3" in resumed.stdout
    assert records(tmp_path / "b" / "run") == expected  # bitwise
