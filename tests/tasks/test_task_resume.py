"""Every model task resumes exactly after SIGKILL: a run killed in the middle of a step (a real
`ditty run` process, killed by a test-only preprocessor) and run again gives bitwise the
per-step losses of an uninterrupted run (fp32 CPU, one thread)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from ditty.config.writer import recipe_to_toml
from ditty.train import Trainer
from tests.tasks.helpers import Case, losses, task_config

RESUMED = (
    Case("seq-classification", "bert"),
    Case("token-classification", "roberta", adapter=True),
    Case("seq2seq", "t5"),
    Case("masked-lm", "roberta"),
)


def run_killed(recipe: Path, at: str) -> subprocess.CompletedProcess:
    """`ditty run RECIPE` in a real process of its own, forked from a server that imported torch and
    ditty once (tests/train/forked.py), which the test-only preprocessor kills at `at`."""
    from tests.train import forked

    with tempfile.TemporaryDirectory(prefix="ditty-forked-") as folder:
        log = Path(folder) / "run.log"
        code, _, _ = forked.run(["run", str(recipe)], log, env={"DITTY_TEST_SIGNAL_AT": at})
        text = log.read_text() if log.exists() else ""
    return subprocess.CompletedProcess(["ditty", "run", str(recipe)], code, text, text)


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
