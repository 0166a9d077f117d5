"""curves.png plots the learning rate at its step and keeps fractions and perplexity apart; elapsed_s
keeps counting across a resume."""

from __future__ import annotations

import json

import pytest

from ditty.cli import main
from ditty.metrics import plot as plot_module
from ditty.train.state import IntervalMeter
from ditty.train.step import StepOutput


def test_logged_lr_is_the_rate_of_the_logged_step_not_a_window_mean():
    meter = IntervalMeter()
    for lr in (1e-3, 2e-3, 3e-3):  # warmup: the peak is reached at the logged step
        meter.add(StepOutput(loss=1.0, grad_norm=1.0, tokens=4, supervised_tokens=4, metrics={"lr": lr}), 4)
    assert "lr" not in meter.flush()  # the trainer logs the step's own rate (out.metrics["lr"])


def test_exact_match_and_perplexity_get_separate_axes(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr("matplotlib.pyplot.close", lambda fig=None: figures.append(fig))
    records = [{"step": s, "loss": 2.0 / s, "lr": 1e-3 * min(1, s / 50)} for s in (50, 100, 150, 200)] + [
        {"step": 200, "val_loss": 0.1, "val_exact_match": 0.95, "val_perplexity": 60.0}
    ]
    plot_module.plot_run(str(tmp_path), records=records)
    (fig,) = figures
    axes = fig.get_axes()
    assert len(axes) == 4
    labels = [[line.get_label() for line in ax.get_lines()] for ax in axes]
    assert labels[2] == ["val_exact_match"] and labels[3] == ["val_perplexity"]
    assert list(axes[1].get_lines()[0].get_xdata()) == [50, 100, 150, 200]
    assert axes[1].get_lines()[0].get_ydata()[0] == pytest.approx(1e-3)  # the peak, at step 50


@pytest.mark.slow  # two short runs of the demo recipe: ~30 s
def test_elapsed_s_continues_across_a_resume(tmp_path, capsys):
    out = str(tmp_path / "run")
    common = ["run", "tiny_sft", "--run.output_dir", out, "--data.num_samples", "500", "--train.eval_samples", "4"]
    common += ["--scheduler.warmup_steps", "1", "--logging.progress", "false", "--train.log_every", "1"]
    assert main([*common, "--train.steps", "2"]) == 0
    # Extending a finished run is asked for in so many words (tests/reliability/test_finished_runs.py).
    assert main([*common, "--train.steps", "4", "--checkpoint.overwrite_finished", "true"]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in open(f"{out}/metrics.jsonl", encoding="utf-8")]
    elapsed = {r["step"]: r["elapsed_s"] for r in records if "elapsed_s" in r}
    assert elapsed[3] > elapsed[2] and elapsed[4] > elapsed[3]
