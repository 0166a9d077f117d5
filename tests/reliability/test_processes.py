"""Multi-process runs (2 gloo workers through `ditty run --nproc-per-node 2`): signals and kills.

The issue's cases: SIGTERM or Ctrl-C to a 2-process run saved a checkpoint but exited 1 with
torchrun's SignalException traceback; killing rank 0 reported rank 1 as the failure; `kill -9` of
the launcher left both workers training with no parent.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from ditty.checkpoint.integrity import checkpoint_problems
from tests.reliability.helpers import complete_steps, ditty_process, losses, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

PACE_HOOK = '\n[[pipeline.preprocessors]]\nuse = "tests.reliability.hooks:Pace"\n'
LIMIT_S = 60


def _start(tmp_path):
    recipe = write_recipe(tmp_path, steps=400, extra=PACE_HOOK)
    text = (
        recipe.read_text()
        .replace("every = 2\n", "every = 5\n")
        .replace("[logging]", '[parallel]\nkind = "ddp"\n\n[logging]')
    )
    recipe.write_text(text)
    launcher = ditty_process(
        "run", str(recipe), "--nproc-per-node", "2", env={"DITTY_TEST_STEP_SLEEP": "0.05"}, wait=False
    )
    run = tmp_path / "run"
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "step-5").is_dir():  # training, and a checkpoint on disk
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "the 2-process run did not reach step 5"
        time.sleep(0.3)
    workers = psutil.Process(launcher.pid).children()
    assert len(workers) == 2
    return launcher, workers, run


def _gone(processes, timeout: float) -> float:
    """Seconds until every process in `processes` has exited (fails after `timeout`)."""
    start = time.monotonic()
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"still running after {timeout} s: {[p.pid for p in alive]}"
    return time.monotonic() - start


def _finish(launcher) -> tuple[int, str, str]:
    try:
        out, err = launcher.communicate(timeout=LIMIT_S * 3)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return launcher.returncode, out, err


def _steps_done(run) -> int:
    return max(step for step, _ in losses(run))


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_saves_and_exits_like_one_process(name, tmp_path, trial):
    if name == "SIGINT" and os.environ.get("DITTY_RELIABILITY_FULL") != "1":
        pytest.skip("the same path as SIGTERM; DITTY_RELIABILITY_FULL=1 runs it")
    trial.update(fault=f"{name} to a 2-process run", injected=f"{name} to the launcher's pid")
    sig = getattr(signal, name)
    launcher, workers, run = _start(tmp_path)
    launcher.send_signal(sig)
    code, out, err = _finish(launcher)
    trial.update(exit_code=code, lost_steps=_steps_done(run) - complete_steps(run)[-1])
    assert code == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err
    assert f"stopped by {name} after step" in out and "checkpoint saved in" in out
    newest = complete_steps(run)[-1]
    assert newest == _steps_done(run)  # the step in flight finished and was saved: nothing lost
    assert not checkpoint_problems(run / "checkpoints" / f"step-{newest}")
    _gone(workers, LIMIT_S)


def test_workers_stop_within_seconds_when_the_launcher_is_killed(tmp_path, trial):
    trial.update(fault="kill -9 of the launcher of a 2-process run", injected="SIGKILL to the launcher's pid")
    launcher, workers, run = _start(tmp_path)
    launcher.send_signal(signal.SIGKILL)
    seconds = _gone(workers, LIMIT_S)
    _finish(launcher)
    newest = complete_steps(run)[-1]
    trial.update(exit_code=-9, lost_steps=_steps_done(run) - newest, seconds=round(seconds, 1))
    # Their parent-death signal is SIGTERM: they finish the step, save it, and exit.
    assert newest == _steps_done(run) and not checkpoint_problems(run / "checkpoints" / f"step-{newest}")
    assert seconds < LIMIT_S


def test_a_killed_rank_0_is_named_as_the_failure(tmp_path, trial):
    trial.update(fault="kill -9 of rank 0 of a 2-process run", injected="SIGKILL to rank 0's pid")
    launcher, workers, run = _start(tmp_path)
    rank0 = next(w for w in workers if w.environ().get("RANK") == "0")
    rank0.send_signal(signal.SIGKILL)
    code, out, err = _finish(launcher)
    newest = complete_steps(run)[-1]
    trial.update(exit_code=code, lost_steps=_steps_done(run) - newest)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank 0 failed first: it was killed by SIGKILL"), last
    assert "the other ranks (1) stopped because they lost it" in last
    assert not checkpoint_problems(run / "checkpoints" / f"step-{newest}")
