"""kill -9 at a random moment (mid-step, mid-save, between the commit's renames): the rerun resumes
from the newest intact checkpoint and ends with exactly the losses of an uninterrupted run.

One kill under make test; DITTY_RELIABILITY_KILLS=N runs N kills at different moments (seeded by
DITTY_RELIABILITY_SEED, so a sweep's repetitions differ).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from tests.reliability.helpers import complete_steps, ditty, ditty_process, losses, write_recipe

PACE_HOOK = '\n[[pipeline.preprocessors]]\nuse = "tests.reliability.hooks:Pace"\n'
KILLS = int(os.environ.get("DITTY_RELIABILITY_KILLS", "1"))
SEED = int(os.environ.get("DITTY_RELIABILITY_SEED", "0"))
STEPS = 16


@pytest.fixture(scope="module")
def one_thread():
    """The killed run is a subprocess on one thread (OMP_NUM_THREADS=1); the reference and the rerun,
    in this process, run on one thread too (ditty leaves the count alone when the variable is set)."""
    before, variable = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    if variable is None:
        os.environ.pop("OMP_NUM_THREADS")
    else:
        os.environ["OMP_NUM_THREADS"] = variable


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("reference")
    result = ditty("run", str(write_recipe(tmp, steps=STEPS, extra=PACE_HOOK)))
    assert result.code == 0, result.err[-3000:]
    return losses(tmp / "run")


@pytest.mark.parametrize("index", range(KILLS))
def test_kill_9_at_a_random_moment_resumes_exactly(index, tmp_path, reference, trial):
    delay = random.Random(SEED * 1000 + index).uniform(0.0, 4.0)
    trial.update(fault="kill -9 at a random moment", injected=f"SIGKILL {delay:.2f} s after the first checkpoint")
    recipe = write_recipe(tmp_path, steps=STEPS, extra=PACE_HOOK)
    run = tmp_path / "run"
    process = ditty_process("run", str(recipe), env={"DITTY_TEST_STEP_SLEEP": "0.03"}, wait=False)
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step-2").is_dir():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    saved = complete_steps(run)[-1] if complete_steps(run) else 0
    done = max((step for step, _ in losses(run)), default=0)

    rerun = ditty("run", str(recipe))
    trial.update(exit_code=rerun.code, lost_steps=max(0, done - saved), killed_at_step=done)
    assert rerun.code == 0, rerun.err[-3000:]
    if done < STEPS:
        assert f"resumed from step {saved}" in rerun.out
    assert losses(run) == reference  # bitwise: nothing wrong was loaded
