"""`train.stop_when`: a run ends at the first evaluation that meets its condition, as at its last
step (checkpoint, final/, the report); a rerun finds it finished and touches nothing, or writes the
final/ a kill interrupted without training on; another condition continues it; a condition the
compiler cannot read, or that no evaluation can check, is refused with exit code 2. Through the real
command line, in this process (tests/train/test_resume.py)."""

from __future__ import annotations

import pytest

from ditty.config.stopping import parse_stop_condition
from tests.train.test_resume import complete_steps, ditty, losses, write_recipe

EVALUATE = ("--train.eval_every", "4", "--train.eval_samples", "8")


def test_conditions_parse_and_are_met_or_not():
    condition = parse_stop_condition("val_exact_match >= 0.4")
    assert (condition.metric, condition.at_least, condition.threshold) == ("val_exact_match", True, 0.4)
    assert condition.met({"val_exact_match": 0.45}) == "val_exact_match 0.45 >= 0.4"
    assert condition.met({"val_exact_match": 0.4}) is not None and condition.met({"val_exact_match": 0.39}) is None
    low = parse_stop_condition("  val_loss<=1e-2 ")
    assert low.met({"val_loss": 0.02}) is None and low.met({"val_loss": 0.005}) == "val_loss 0.005 <= 0.01"
    assert parse_stop_condition("") is None
    for bad in (
        "val_loss < 0.2",
        "loss <= 0.2",
        "val_loss >= high",
        "val_loss >= 0.2 and val_x >= 1",
        "val_loss >= 1e999",
    ):
        with pytest.raises(ValueError):
            parse_stop_condition(bad)


def test_the_compiler_refuses_an_unreadable_condition_and_one_no_evaluation_checks(tmp_path):
    recipe = write_recipe(tmp_path)
    bad = ditty("check", str(recipe), "--train.stop_when", "val_loss < 0.2", *EVALUATE)
    assert bad.returncode == 2 and "train.stop_when" in bad.stderr and "Traceback" not in bad.stderr
    assert '"val_exact_match >= 0.4"' in bad.stderr  # the fix shows the form
    unchecked = ditty("check", str(recipe), "--train.stop_when", "val_loss <= 0.2")  # eval_every = 0
    assert unchecked.returncode == 2 and "train.eval_every" in unchecked.stderr
    assert ditty("check", str(recipe), "--train.stop_when", "val_loss <= 0.2", *EVALUATE).returncode == 0


def test_a_met_condition_ends_the_run_a_rerun_is_finished_and_another_condition_continues_it(tmp_path):
    recipe = write_recipe(tmp_path)
    run = tmp_path / "run"
    met = ("--train.stop_when", "val_loss <= 100", *EVALUATE)  # met at the first evaluation, step 4
    first = ditty("run", str(recipe), *met)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopped before train.steps (12): val_loss" in first.stdout and "<= 100 (train.stop_when)" in first.stdout
    assert [step for step, _ in losses(run)] == [1, 2, 3, 4]
    assert (run / "final" / "model.safetensors").is_file() and complete_steps(run) == ["step-4"]

    import shutil

    shutil.rmtree(run / "final")  # as if a kill interrupted final/'s write: the rerun writes it, no more steps
    rewritten = ditty("run", str(recipe), *met)
    assert rewritten.returncode == 0 and "resumed from step 4" in rewritten.stdout, rewritten.stderr[-3000:]
    assert [step for step, _ in losses(run)] == [1, 2, 3, 4] and (run / "final" / "model.safetensors").is_file()

    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    again = ditty("run", str(recipe), *met)
    assert again.returncode == 0 and "is a finished run (step 4" in again.stdout, again.stderr[-2000:]
    assert "change train.stop_when" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing touched

    never_met = ("--train.stop_when", "val_loss <= 1e-9", *EVALUATE)
    refused = ditty("run", str(recipe), *never_met)  # a changed condition changes training: asked for in words
    assert refused.returncode == 2 and "train.stop_when" in refused.stderr
    further = ditty(
        "run", str(recipe), *never_met, "--checkpoint.force_resume", "true", "--checkpoint.overwrite_finished", "true"
    )
    assert further.returncode == 0 and "resumed from step 4" in further.stdout, further.stderr[-3000:]
    assert [step for step, _ in losses(run)] == list(range(1, 13)) and "stopped before" not in further.stdout


def test_a_condition_met_by_the_start_trains_no_step(tmp_path):
    recipe = write_recipe(tmp_path)
    proc = ditty("run", str(recipe), "--train.stop_when", "val_loss <= 100", "--train.eval_at_start", "true", *EVALUATE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 0 steps" in proc.stdout and (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_a_metric_the_evaluation_does_not_report_is_a_recipe_error(tmp_path):
    recipe = write_recipe(tmp_path)
    proc = ditty("run", str(recipe), "--train.stop_when", "val_accuracy >= 0.9", *EVALUATE)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "val_accuracy" in proc.stderr and "it reports: " in proc.stderr and "val_loss" in proc.stderr
