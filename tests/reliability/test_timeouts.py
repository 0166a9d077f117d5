"""Hangs: a peer that stops answering during a save, and a Hub that accepts and never answers.

The issue's cases: with rank 1 stopped (SIGSTOP) during a save, rank 0 waited more than 265 s (the
checkpoint group had torch's 30-minute default, not DITTY_DIST_TIMEOUT_S), and the message then
blamed the out-of-memory killer for the SIGKILL torchrun itself sent; `ditty push` against an
endpoint that never answers hung with no output and rewrote final/README.md.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.reliability.helpers import ditty_process, write_recipe

TIMEOUT_S = 20


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_a_rank_stopped_during_a_save_ends_the_run_within_the_timeout(tmp_path, trial):
    trial.update(
        fault="rank 1 stopped (SIGSTOP) during a save of a 2-process run",
        injected=f"SIGSTOP to rank 1 as the step-4 save begins; DITTY_DIST_TIMEOUT_S = {TIMEOUT_S}",
    )
    recipe = write_recipe(tmp_path, steps=8)
    text = 'trainer = "tests.reliability.hooks:StopInSave"\n' + recipe.read_text()
    recipe.write_text(text.replace("[logging]", '[parallel]\nkind = "ddp"\n\n[logging]'))
    env = {
        "DITTY_DIST_TIMEOUT_S": str(TIMEOUT_S),
        "DITTY_TEST_STOP_AT_STEP": "4",
        "DITTY_TEST_STOP_RANK": "1",
        "DITTY_SHUTDOWN_TIMEOUT_S": "5",
    }
    launcher = ditty_process("run", str(recipe), "--nproc-per-node", "2", env=env, wait=False)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        stopped_at = None
        while stopped_at is None:  # wait for rank 1 to stop itself
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "rank 1 never reached the save"
            workers = psutil.Process(launcher.pid).children()
            if any(w.status() == psutil.STATUS_STOPPED for w in workers):
                stopped_at = time.monotonic()
            time.sleep(0.2)
        rank0 = next(w for w in workers if w.environ().get("RANK") == "0")
        _, alive = psutil.wait_procs([rank0], timeout=TIMEOUT_S + 30)
        gave_up_after = time.monotonic() - stopped_at
        assert not alive, f"rank 0 still waiting {TIMEOUT_S + 30} s after rank 1 stopped"
        out, err = launcher.communicate(timeout=120)
    finally:
        for process in [*workers, launcher]:
            try:
                process.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
    trial.update(exit_code=launcher.returncode, lost_steps=2, seconds=round(gave_up_after, 1))
    assert launcher.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank"), last
    assert "out-of-memory" not in err and "Traceback" not in err, err[-3000:]
    assert "timed out" in last or "did not answer" in last, last
