"""Resume for every optimizer kind and backend, with and without an adapter; and a resume whose
recipe changed the learning rate or its schedule does what recipe.toml says.

Each optimizer case: a run that crashes during step 5 (checkpoints at 2 and 4) is rerun and must
give exactly the losses of an uninterrupted run (bitwise: weights, optimizer state, schedule, data
order and dropout all come back); the finished run is then extended by 2 steps. Under make test the
four implementations run once each, alternating full and adapter runs; DITTY_RELIABILITY_FULL=1
runs all eight combinations (tools/reliability_table.py sets it).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.reliability.helpers import complete_steps, ditty, losses, no_traceback, write_recipe

CRASH_HOOK = '\n[[pipeline.preprocessors]]\nuse = "tests.train.dist_hooks:FailAt"\n'
LORA = '\n[peft]\nkind = "lora"\nr = 4\nalpha = 8\ndropout = 0.1\ntarget_modules = ["q_proj", "v_proj"]\n'
FULL = os.environ.get("DITTY_RELIABILITY_FULL") == "1"

OPTIMIZERS = [("adamw", "torch"), ("sgd", "torch"), ("adamw8bit", "torchao"), ("adamw8bit", "bnb")]
CASES = [
    pytest.param(kind, backend, adapter, id=f"{kind}-{backend}-{'lora' if adapter else 'full'}")
    for index, (kind, backend) in enumerate(OPTIMIZERS)
    for adapter in (False, True)
    if FULL or adapter == bool(index % 2)
]


def _optimizer(kind: str, backend: str) -> str:
    momentum = "\nmomentum = 0.9" if kind == "sgd" else ""
    lr = 3e-2 if kind == "sgd" else 3e-3
    return f'\n[optimizer]\nkind = "{kind}"\nbackend = "{backend}"\nlr = {lr}{momentum}\n'


def _recipe(tmp_path, kind, backend, adapter, *, out="run", name="recipe.toml", steps=6):
    extra = CRASH_HOOK + (LORA if adapter else "")
    path = write_recipe(tmp_path, steps=steps, out=out, name=name, extra=extra)
    # The recipe's own [optimizer] table is replaced (a table may appear once).
    text = path.read_text().replace('[optimizer]\nkind = "adamw"\nlr = 3e-3\n', _optimizer(kind, backend))
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind, backend, adapter", CASES)
def test_resume_after_a_crash_and_extend(kind, backend, adapter, tmp_path, monkeypatch, trial):
    trial.update(
        fault=f"crash mid-run, resume: {kind} ({backend}){' + LoRA' if adapter else ''}",
        injected="an exception during step 5; rerun; then train.steps raised by 2",
    )
    reference = ditty("run", str(_recipe(tmp_path, kind, backend, adapter, out="ref", name="ref.toml")))
    assert reference.code == 0, reference.err[-3000:]
    ref = losses(tmp_path / "ref")
    assert [s for s, _ in ref] == list(range(1, 7))

    recipe = _recipe(tmp_path, kind, backend, adapter)
    monkeypatch.setenv("DITTY_TEST_FAIL_AT", "0:4")
    crashed = ditty("run", str(recipe))
    monkeypatch.delenv("DITTY_TEST_FAIL_AT")
    assert crashed.code == 1 and complete_steps(tmp_path / "run") == [2, 4]

    resumed = ditty("run", str(recipe))
    trial.update(exit_code=resumed.code, lost_steps=4 - 4)
    assert resumed.code == 0 and no_traceback(resumed), resumed.err[-3000:]
    assert "resumed from step 4" in resumed.out
    assert losses(tmp_path / "run") == ref  # bitwise, through the 8-bit state too

    extended = ditty("run", str(recipe), "--train.steps", "8", "--checkpoint.overwrite_finished", "true")
    assert extended.code == 0 and no_traceback(extended), extended.err[-3000:]
    assert "resumed from step 6" in extended.out
    got = losses(tmp_path / "run")
    assert got[:6] == ref and [s for s, _ in got] == list(range(1, 9))
    assert complete_steps(tmp_path / "run")[-1] == 8


def test_a_changed_learning_rate_and_schedule_take_effect_at_the_resumed_step(tmp_path, trial):
    """The issue's case: force_resume with a new optimizer.lr trained on at the old rate."""
    from ditty.config.sections import SchedulerConfig
    from ditty.optim.scheduler import lr_shape

    trial.update(
        fault="resume with a changed lr and warmup", injected="--optimizer.lr, --scheduler.warmup_steps changed"
    )
    recipe = write_recipe(tmp_path, steps=4)
    assert ditty("run", str(recipe)).code == 0
    refused = ditty("run", str(recipe), "--train.steps", "8", "--optimizer.lr", "1e-2", "--scheduler.warmup_steps", "6")
    assert refused.code == 2 and "optimizer.lr: 0.003 -> 0.01 (the learning-rate schedule is rebuilt" in refused.err
    forced = ditty(
        "run",
        str(recipe),
        "--train.steps",
        "8",
        "--optimizer.lr",
        "1e-2",
        "--scheduler.warmup_steps",
        "6",
        "--checkpoint.force_resume",
        "true",
        "--checkpoint.overwrite_finished",
        "true",
    )
    trial.update(exit_code=forced.code, lost_steps=0)
    assert forced.code == 0, forced.err[-3000:]
    assert "optimizer.lr: 0.003 -> 0.01 (the learning-rate schedule is rebuilt from the recipe at step 4" in forced.err
    assert "scheduler.warmup_steps: 2 -> 6 (the learning-rate schedule is rebuilt" in forced.err
    records = {r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
    shape = lr_shape(SchedulerConfig(kind="cosine", warmup_steps=6), 8)
    for step in range(5, 9):  # the rate of 1-based step s is the schedule at 0-based s - 1
        assert records[step]["lr"] == pytest.approx(1e-2 * shape(step - 1), rel=1e-12), step
    saved = (tmp_path / "run" / "recipe.toml").read_text()
    assert "lr = 0.01" in saved and "warmup_steps = 6" in saved


def test_the_8bit_adamw_resume_of_the_issue(tmp_path, trial):
    """`ditty run tiny_sft --optimizer.kind adamw8bit --train.steps 4 --checkpoint.every 2`, then 6:
    it crashed in ClosedFormLR.load_state_dict (torchao keeps its rate as a tensor)."""
    trial.update(fault="8-bit AdamW (torchao) resume with more steps", injected="train.steps 4, then 6")
    recipe = _recipe(tmp_path, "adamw8bit", "torchao", False, steps=4)
    assert ditty("run", str(recipe)).code == 0
    more = ditty("run", str(recipe), "--train.steps", "6", "--checkpoint.overwrite_finished", "true")
    trial.update(exit_code=more.code, lost_steps=0)
    assert more.code == 0 and no_traceback(more), more.err[-3000:]
    assert "resumed from step 4" in more.out and complete_steps(tmp_path / "run")[-1] == 6
    shutil.rmtree(tmp_path / "run")
