"""A finished run is never overwritten without being asked in so many words, and another run's
checkpoint is never resumed into a directory holding a different run. Each refusal is exit 2
naming what would be lost, before anything is written: every file stays as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.reliability.helpers import complete_steps, ditty, final_weights, losses, no_traceback, write_recipe

OVERWRITE = ("--checkpoint.overwrite_finished", "true")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished 4-step runs, A and B (another seed): checkpoints at steps 2 and 4, final/."""
    tmp = tmp_path_factory.mktemp("finished")
    for name, seed in (("A", 0), ("B", 1)):
        recipe = write_recipe(tmp, steps=4, out=name, name=f"{name}.toml")
        recipe.write_text(recipe.read_text().replace("seed = 0", f"seed = {seed}"))
        result = ditty("run", str(recipe))
        assert result.code == 0, result.err[-3000:]
    return tmp


def _snapshot(run: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != "run.lock"}


def _copy(runs: Path, tmp_path: Path, name: str = "A") -> tuple[Path, Path]:
    shutil.copytree(runs / name, tmp_path / name)
    return write_recipe(tmp_path, steps=4, out=name), tmp_path / name


def _refused(result, run: Path, before: dict, *said: str) -> None:
    assert result.code == 2 and no_traceback(result), result.text[-3000:]
    assert all(text in result.err for text in said), result.err[-3000:]
    assert _snapshot(run) == before  # nothing was touched


@pytest.mark.parametrize("checkpoints", ["deleted", "kept"])
def test_a_finished_run_is_not_replaced_by_a_rerun(checkpoints, runs, tmp_path, trial):
    """The issue's reproduction: final/ with no checkpoint left, rerun with a changed recipe (it
    started again from step 0 and replaced final/); and a rerun that would train it further."""
    trial.update(
        fault=f"run dir: finished, run again ({'no checkpoint left' if checkpoints == 'deleted' else 'more steps'})",
        injected="checkpoints/ deleted, --optimizer.lr changed" if checkpoints == "deleted" else "train.steps 4 -> 6",
    )
    recipe, run = _copy(runs, tmp_path)
    if checkpoints == "deleted":
        shutil.rmtree(run / "checkpoints")
        flags = ("--optimizer.lr", "1e-3")
        would = "start it again from step 0"
    else:
        flags = ("--train.steps", "6")
        would = "and train to step 6"
    before = _snapshot(run)
    result = ditty("run", str(recipe), *flags)
    trial.update(exit_code=result.code, lost_steps=0)
    _refused(result, run, before, "holds a finished run", would, "final/", "recipe.toml", "metrics.jsonl", OVERWRITE[0])
    if checkpoints == "deleted":  # the same recipe is refused too: it would retrain from step 0 all the same
        _refused(ditty("run", str(recipe)), run, before, "start it again from step 0")
    else:  # the same recipe with its last checkpoint is a finished run: nothing to do, exit 0
        same = ditty("run", str(recipe))
        assert same.code == 0 and "nothing to do" in same.out and _snapshot(run) == before


def test_asked_in_so_many_words_a_finished_run_trains_further(runs, tmp_path):
    recipe, run = _copy(runs, tmp_path)
    result = ditty("run", str(recipe), "--train.steps", "6", *OVERWRITE)
    assert result.code == 0 and "resumed from step 4" in result.out, result.err[-3000:]
    assert [step for step, _ in losses(run)] == [1, 2, 3, 4, 5, 6] and complete_steps(run)[-1] == 6
    # The permission is not saved: the run's recipe.toml, run as is, asks again.
    assert "overwrite_finished = false" in (run / "recipe.toml").read_text()


def test_another_run_s_checkpoint_is_not_resumed_into_a_finished_run(runs, tmp_path, trial):
    trial.update(
        fault="run dir: another run's checkpoint resumed into it",
        injected='checkpoint.resume = "A/checkpoints/step-2" with run.output_dir = B (finished)',
    )
    shutil.copytree(runs / "A", tmp_path / "A")
    recipe, other = _copy(runs, tmp_path, "B")
    step_2 = str(tmp_path / "A" / "checkpoints" / "step-2")
    before = _snapshot(other)
    result = ditty("run", str(recipe), "--checkpoint.resume", step_2, *OVERWRITE)  # even with the overwrite flag
    trial.update(exit_code=result.code, lost_steps=0)
    a_id = json.loads((tmp_path / "A" / "env.json").read_text())["run_id"]
    b_id = json.loads((other / "env.json").read_text())["run_id"]
    _refused(
        result, other, before, f"holds another run (run id {b_id})", f"(run id {a_id})", 'checkpoint.resume = "auto"'
    )


def test_another_run_s_checkpoint_starts_a_new_run_in_a_new_directory(runs, tmp_path):
    shutil.copytree(runs / "A", tmp_path / "A")
    step_2 = str(tmp_path / "A" / "checkpoints" / "step-2")
    recipe = write_recipe(tmp_path, steps=4, out="C")
    forked = ditty("run", str(recipe), "--checkpoint.resume", step_2)
    assert forked.code == 0 and "resumed from step 2" in forked.out, forked.err[-3000:]
    assert losses(tmp_path / "C") == losses(runs / "A")[2:]  # the same run continued, bitwise
    ids = {json.loads((tmp_path / name / "env.json").read_text())["run_id"] for name in ("A", "C")}
    assert len(ids) == 2  # a new run, with an id of its own
    # Into the run that wrote it (a copy of A keeps A's id), the checkpoint resumes.
    recipe, own = _copy(runs, tmp_path / "again")
    into_own = ditty("run", str(recipe), "--checkpoint.resume", step_2, *OVERWRITE)
    assert into_own.code == 0 and "resumed from step 2" in into_own.out, into_own.err[-3000:]
    assert same_final(own, runs / "A")


def same_final(a: Path, b: Path) -> bool:
    from tests.reliability.helpers import same_weights

    return same_weights(final_weights(a), final_weights(b))


def test_a_finished_run_rerun_with_a_changed_value_says_it_is_finished(runs, tmp_path, trial):
    trial.update(
        fault="run dir: finished, run again (a changed value)", injected="--optimizer.lr changed, checkpoints kept"
    )
    recipe, run = _copy(runs, tmp_path)
    before = _snapshot(run)
    result = ditty("run", str(recipe), "--optimizer.lr", "1e-3")
    trial.update(exit_code=result.code, lost_steps=0)
    _refused(result, run, before, f"{run} holds a finished run (step 4, final/)", "optimizer.lr: 0.003 -> 0.001")
    assert "choose a new run.output_dir" in result.err and "--checkpoint.overwrite_finished true" in result.err


def test_fewer_steps_than_the_checkpoint_is_refused_without_advice_that_cannot_work(runs, tmp_path):
    """train.steps below the newest checkpoint's step: exit 2 saying so, before any advice to force
    the resume (which would fail on the same step count)."""
    recipe, run = _copy(runs, tmp_path)
    shutil.rmtree(run / "final")  # an interrupted run, its last checkpoint at step 4
    before = _snapshot(run)
    for flags in ((), ("--checkpoint.force_resume", "true")):
        result = ditty("run", str(recipe), "--train.steps", "2", "--scheduler.warmup_steps", "0", *flags)
        _refused(result, run, before, "is at step 4, past train.steps = 2")
        assert "force_resume" not in result.err
