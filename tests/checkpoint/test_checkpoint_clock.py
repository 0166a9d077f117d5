"""A crash loses at most `checkpoint.every_minutes` of training, with no `checkpoint.every` set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ditty.checkpoint.clock import SaveClock
from ditty.config.sections import CheckpointConfig


def test_the_default_saves_every_ten_minutes():
    assert CheckpointConfig().every == 0 and CheckpointConfig().every_minutes == 10.0


def test_clock_is_due_after_its_interval_and_restarts_on_a_save():
    now = [0.0]
    clock = SaveClock(10, now=lambda: now[0])
    now[0] = 599.0
    assert not clock.due()
    now[0] = 600.0
    assert clock.due()
    clock.saved()
    assert not clock.due()
    assert clock.due(agree=lambda late: True)  # another rank is due: so is this one
    assert not SaveClock(0).due()


@pytest.mark.slow  # trains in a subprocess until two timed checkpoints exist (~30 s), then resumes
def test_kill_9_under_the_clock_loses_at_most_the_interval(tmp_path):
    out = tmp_path / "run"
    interval_s = 3.0
    args = ["tiny_sft", "--run.output_dir", str(out), "--data.num_samples", "2000", "--train.eval_every", "0"]
    args += ["--train.eval_samples", "8", "--logging.progress", "false", "--train.log_every", "5"]
    args += ["--scheduler.warmup_steps", "1"]
    args += ["--checkpoint.every_minutes", str(interval_s / 60)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(
        [sys.executable, "-m", "ditty", "run", *args, "--train.steps", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while len(list((out / "checkpoints").glob("step-*"))) < 2 and time.monotonic() < deadline:
            assert run.poll() is None, "the run ended before it was killed"
            time.sleep(0.5)
        assert len(list((out / "checkpoints").glob("step-*"))) >= 2, "no timed checkpoint within 240 s"
        time.sleep(interval_s / 2)
    finally:
        run.send_signal(signal.SIGKILL)  # no handler runs: only what the clock saved survives
        run.wait()
    killed_at = time.time()
    latest = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    saved_step = int(latest.name.split("-")[1])
    assert saved_step > 0
    # At most the interval, one logging interval (5 steps) and the save itself, on a busy machine.
    assert killed_at - latest.stat().st_mtime <= interval_s + 15

    resumed = subprocess.run(
        [sys.executable, "-m", "ditty", "run", *args, "--train.steps", str(saved_step + 2)]
        + ["--checkpoint.force_resume", "true"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {saved_step}" in resumed.stdout + resumed.stderr
    assert (Path(out) / "final").is_dir()
