"""Every model task resumes exactly after SIGKILL: a run killed in the middle of a step (a real
`python -m ditty run` process, killed by a test-only preprocessor) and run again gives bitwise the
per-step losses of an uninterrupted run (fp32 CPU, one thread)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ditty.config.writer import recipe_to_toml
from ditty.train import Trainer
from tests.tasks.helpers import Case, losses, task_config

REPO = Path(__file__).resolve().parents[2]
RESUMED = (
    Case("seq-classification", "bert"),
    Case("token-classification", "roberta", adapter=True),
    Case("seq2seq", "t5"),
    Case("masked-lm", "roberta"),
)


def run_killed(recipe: Path, at: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DITTY_TEST_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), DITTY_TEST_SIGNAL_AT=at)
    return subprocess.run(
        [sys.executable, "-m", "ditty", "run", str(recipe)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", RESUMED, ids=lambda c: c.id)
def test_a_killed_task_run_resumes_with_bitwise_equal_losses(tmp_path, task_models, task_files, case, capsys):
    config = task_config(tmp_path / "run", case, task_models, task_files, steps=6, every=2, signal_hook=True)
    reference = replace(config, run=replace(config.run, output_dir=str(tmp_path / "reference")))
    Trainer(reference).train()
    expected = losses(tmp_path / "reference")
    assert [step for step, _ in expected] == list(range(1, 7))

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_to_toml(config))
    killed = run_killed(recipe, "4:1:KILL")  # 0-based step 4 = the 5th, its second micro-batch
    assert killed.returncode in (-9, 137), killed.stderr[-3000:]
    assert [step for step, _ in losses(tmp_path / "run")] == [1, 2, 3, 4]

    Trainer(config).train()  # the same recipe again: resumes from step-4
    assert "resumed from step 4" in capsys.readouterr().out
    assert losses(tmp_path / "run") == expected
