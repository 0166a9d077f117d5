"""A streak of non-finite steps never reaches a checkpoint, and the run stops naming the last good one.

The issue's case: with lr = 1e30, steps were skipped as non-finite but checkpoints were still
written on the skipped steps, keep_last pruned the good ones, and a rerun resumed from poison.
"""

from __future__ import annotations

import json
import math

from tests.reliability.helpers import complete_steps, ditty, losses, no_traceback, write_recipe

NAN_HOOK = '\n[[pipeline.postprocessors]]\nuse = "tests.reliability.hooks:NaNFrom"\n'


def _recipe(tmp_path, *, steps=12, keep_last=1):
    path = write_recipe(tmp_path, steps=steps, extra=NAN_HOOK)
    text = path.read_text().replace("keep_last = 3", f"keep_last = {keep_last}")
    path.write_text(text.replace("eval_samples = 0\n", "eval_samples = 0\nmax_skipped_steps = 3\n"))
    return path


def test_a_streak_stops_the_run_without_checkpointing_it_and_the_rerun_resumes_before_it(tmp_path, monkeypatch, trial):
    trial.update(fault="NaN streak until the limit", injected="NaN logits from step 6 on (max_skipped_steps = 3)")
    recipe = _recipe(tmp_path)
    monkeypatch.setenv("DITTY_TEST_NAN_FROM", "5")  # 0-based: steps 6, 7, 8 are non-finite
    stopped = ditty("run", str(recipe))
    monkeypatch.delenv("DITTY_TEST_NAN_FROM")
    assert stopped.code == 1 and no_traceback(stopped), stopped.err[-3000:]
    run = tmp_path / "run"
    assert "3 consecutive steps had a non-finite loss" in stopped.err and "last at step 8" in stopped.err
    assert f"the newest checkpoint from before the streak (it began at step 6) is {run / 'checkpoints' / 'step-4'}" in (
        stopped.err
    )
    assert complete_steps(run) == [4]  # step-6 and step-8 fell due inside the streak: not written
    assert not (run / "final").exists()

    rerun = ditty("run", str(recipe))
    trial.update(exit_code=stopped.code, lost_steps=8 - 4)
    assert rerun.code == 0 and "resumed from step 4" in rerun.out, rerun.err[-3000:]
    assert all(math.isfinite(loss) for _, loss in losses(run))  # the streak is gone


def test_a_streak_that_ends_defers_the_save_and_keeps_the_checkpoint_from_before_it(tmp_path, monkeypatch, trial):
    trial.update(fault="NaN streak that recovers", injected="NaN logits at steps 6-7, keep_last = 1")
    recipe = _recipe(tmp_path, steps=10)
    monkeypatch.setenv("DITTY_TEST_NAN_FROM", "5")
    monkeypatch.setenv("DITTY_TEST_NAN_UNTIL", "7")  # 0-based 5, 6: steps 6 and 7 are skipped
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 0, result.err[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("skipped")] == [6, 7]
    # The save due at 6 waited for step 8 (finite); keep_last = 1 pruned, but never step-4, the
    # newest checkpoint from before the streak.
    assert complete_steps(run) == [4, 10]
    assert (run / "final" / "model.safetensors").is_file()


def test_lr_1e30_writes_no_poisoned_checkpoint(tmp_path, trial):
    trial.update(fault="divergence (lr = 1e30)", injected="--optimizer.lr 1e30")
    recipe = _recipe(tmp_path)
    result = ditty("run", str(recipe), "--optimizer.lr", "1e30")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 1 and no_traceback(result), result.err[-3000:]
    assert "non-finite" in result.err and "a rerun starts from step 0" in result.err
    # Step 1's update (at 1e30) is finite but ruins the weights; every later step is skipped, so the
    # save due at step 2 never happens and no poisoned checkpoint exists to resume from.
    assert complete_steps(tmp_path / "run") == []
    assert not (tmp_path / "run" / "final").exists()


def test_non_finite_numbers_in_a_recipe_are_refused_by_the_compiler(tmp_path, trial):
    trial.update(fault="lr = nan / inf in a recipe", injected="--optimizer.lr nan, --optimizer.lr inf")
    recipe = write_recipe(tmp_path)
    for value in ("nan", "inf", "-inf"):
        for command in ("check", "run"):
            result = ditty(command, str(recipe), "--optimizer.lr", value)
            assert result.code == 2 and no_traceback(result), result.err
            assert f"`optimizer.lr` is {float(value)}: a recipe number must be finite" in result.err
    trial.update(exit_code=2, lost_steps=0)
    assert not (tmp_path / "run").exists()


def test_a_run_that_ends_inside_a_streak_fails_and_writes_no_final(tmp_path, monkeypatch, trial):
    trial.update(
        fault="run ends inside a NaN streak",
        injected="NaN logits at steps 5-6 of 6 (max_skipped_steps = 3): the streak is shorter than the limit",
    )
    recipe = _recipe(tmp_path, steps=6)
    monkeypatch.setenv("DITTY_TEST_NAN_FROM", "4")  # 0-based: steps 5 and 6 are non-finite, the last two
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=6 - 4)
    assert result.code == 1 and no_traceback(result), result.err[-3000:]
    run = tmp_path / "run"
    assert "the run ended inside a streak of 2 non-finite steps (steps 5-6)" in result.err, result.err[-3000:]
    assert f"{run / 'checkpoints' / 'step-4'}" in result.err
    assert not (run / "final").exists()
    assert complete_steps(run) == [4]  # the save due at step 6 fell inside the streak


def test_lr_1e30_for_fewer_steps_than_the_limit_writes_no_final(tmp_path, trial):
    # tiny_sft with lr 1e30 ended at exit 0 with val_loss nan and a final/: its steps ran out before
    # train.max_skipped_steps skipped steps in a row.
    trial.update(fault="divergence (lr = 1e30), fewer steps than the limit", injected="--optimizer.lr 1e30, 3 steps")
    recipe = _recipe(tmp_path, steps=3)
    result = ditty("run", str(recipe), "--optimizer.lr", "1e30", "--train.eval_every", "3")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 1 and no_traceback(result), result.err[-3000:]
    assert "non-finite" in result.err and "no final model was written" in result.err
    assert not (tmp_path / "run" / "final").exists()
