"""One writer per run directory; metrics.jsonl whole and readable; leftovers of killed saves removed.

The issue's cases: two `ditty run` into one directory at once (one crashed on the other's temporary
files, metrics.jsonl got interleaved lines, a staggered run pruned the other's checkpoint), `ditty
plot` dying on a torn last line, and `.latest.tmp-*` files never cleaned.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from ditty.metrics.logger import JsonlSink, load_metrics
from tests.reliability.helpers import complete_steps, ditty, ditty_process, losses, no_traceback, write_recipe

PACE_HOOK = '\n[[pipeline.preprocessors]]\nuse = "tests.reliability.hooks:Pace"\n'


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow  # a python -m ditty run, then two runs in this process: about 30 s of CPU
def test_a_second_run_is_refused_and_a_kill_9_leaves_no_stale_lock(tmp_path, trial):
    trial.update(
        fault="two runs into one directory, then kill -9 of the first",
        injected="`ditty run` while another runs; SIGKILL to the first",
    )
    recipe = write_recipe(tmp_path, steps=40, extra=PACE_HOOK)
    first = ditty_process("run", str(recipe), env={"DITTY_TEST_STEP_SLEEP": "0.1"}, wait=False)
    run = tmp_path / "run"
    try:
        _wait_for(lambda: (run / "checkpoints" / "step-2").is_dir(), 240, "the first run's first checkpoint")
        second = ditty("run", str(recipe))
        assert second.code == 2 and no_traceback(second), second.err[-2000:]
        assert f"is in use by another ditty run (pid {first.pid} on {os.uname().nodename}" in second.err
        assert "choose another run.output_dir" in second.err
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    saved = complete_steps(run)[-1]
    done = max(step for step, _ in losses(run))

    third = ditty("run", str(recipe))  # the kernel released the lock with the process
    trial.update(exit_code=third.code, lost_steps=done - saved)
    assert third.code == 0, third.err[-3000:]
    assert f"resumed from step {saved}" in third.out
    records, torn = load_metrics(str(run))
    assert [r["step"] for r in records] == list(range(1, 41)) and torn == 0  # one writer: whole lines, in order
    assert not (run / "run.lock").exists()


def test_metrics_records_are_single_appends_that_never_interleave(tmp_path, trial):
    """Two sinks on one file (what the lock prevents), 2 threads x 2,000 records of 2 KB each: every
    line still parses, because each record is one O_APPEND write."""
    trial.update(fault="two writers appending to one metrics.jsonl", injected="2 threads x 2,000 records of 2 KB")
    sinks = [JsonlSink(str(tmp_path), append=True) for _ in range(2)]

    def write(index: int) -> None:
        for step in range(2000):
            sinks[index].write({"step": step, "writer": index, "pad": "x" * 2048})

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sink in sinks:
        sink.close()
    records, torn = load_metrics(str(tmp_path))
    trial.update(exit_code=0, lost_steps=0)
    assert torn == 0 and len(records) == 4000


def test_a_torn_last_line_is_skipped_and_counted_by_every_reader(tmp_path, trial):
    trial.update(fault="metrics.jsonl with a torn last line", injected="the last record cut in half")
    recipe = write_recipe(tmp_path, steps=4)
    assert ditty("run", str(recipe)).code == 0
    path = tmp_path / "run" / "metrics.jsonl"
    text = path.read_text()
    path.write_text(text + text.splitlines()[-1][:25])  # a record cut by a crash
    plot = ditty("plot", str(tmp_path / "run"))
    trial.update(exit_code=plot.code, lost_steps=0)
    assert plot.code == 0 and no_traceback(plot), plot.err
    assert "skipped 1 unreadable line of metrics.jsonl" in plot.out
    records, torn = load_metrics(str(path))
    assert torn == 1 and [r["step"] for r in records] == [1, 2, 3, 4]
    # A resumed run appends after it on lines of its own.
    longer = ditty("run", str(recipe), "--train.steps", "6", "--checkpoint.overwrite_finished", "true")
    assert longer.code == 0, longer.err[-2000:]
    records, torn = load_metrics(str(path))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and torn == 0


@pytest.mark.slow  # a python -m ditty run killed in its second save, then a full rerun
def test_leftovers_of_a_killed_save_are_removed_on_the_next_start(tmp_path, trial):
    """A save killed inside the checkpoint writer (DITTY_TEST_KILL_IN_SAVE) leaves .tmp-step-N; a kill
    at the other points leaves a half-written `latest`, a `final.partial/` or a `.trash-*` dir."""
    trial.update(fault="leftovers of a killed save", injected="SIGKILL inside the 2nd save; temp files planted")
    recipe = write_recipe(
        tmp_path, steps=6, extra='\n[[pipeline.preprocessors]]\nuse = "tests.train.resume_hooks:SignalAt"\n'
    )
    killed = ditty_process("run", str(recipe), env={"DITTY_TEST_KILL_IN_SAVE": "2"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    run = tmp_path / "run"
    root = run / "checkpoints"
    assert (root / ".tmp-step-4").is_dir() and complete_steps(run) == [2]
    (root / ".latest.tmp-4242-deadbeef").write_text("step-4\n")
    (root / ".trash-step-0-cafe").mkdir()
    (run / "final.partial").mkdir()
    (run / "final.partial" / "model.safetensors").write_bytes(b"half")
    done = max(step for step, _ in losses(run))

    rerun = ditty("run", str(recipe))
    trial.update(exit_code=rerun.code, lost_steps=done - 2)
    assert rerun.code == 0, rerun.err[-3000:]
    assert "removed leftovers of an interrupted run" in rerun.err
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert not (run / "final.partial").exists() and (run / "final" / "model.safetensors").is_file()
    assert json.loads((root / "step-6" / "manifest.json").read_text())["format"] == "ditty-manifest"


def test_a_forked_child_such_as_a_dataloader_worker_does_not_keep_the_run_lock(tmp_path):
    """The trainer holds run.lock; its forked children (dataloader workers) outlive a kill -9 for a
    few seconds. The lock must go with the trainer, or a resume started at once is refused."""
    from ditty.checkpoint.lock import acquire

    run_dir = tmp_path / "run"
    holder = os.fork()
    if holder == 0:  # the "trainer": takes the lock, forks a long-lived "worker", then waits to be killed
        try:
            acquire(run_dir)
            if os.fork() == 0:
                time.sleep(30)  # a worker that has not noticed its parent died
                os._exit(0)
            (tmp_path / "locked").touch()
            time.sleep(60)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 30
    while not (tmp_path / "locked").exists():
        assert time.monotonic() < deadline, "the trainer never took the lock"
        time.sleep(0.05)
    with pytest.raises(Exception, match="in use by another ditty run"):
        acquire(run_dir)  # held while the trainer lives
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    lock = acquire(run_dir)  # at once: the orphaned worker's inherited descriptor was closed at fork
    assert lock.held
    lock.release()


def test_a_run_directory_removed_under_a_held_lock_is_locked_again(tmp_path):
    """A trainer that was never closed (built in a notebook, or by a test) keeps its lock in this
    process. When its directory is then removed and a new run takes the same path, the new run gets
    a real lock on a directory that exists, not the old lock on a file that is gone."""
    import shutil

    from ditty.checkpoint.lock import LOCK_FILE, acquire

    run_dir = tmp_path / "run"
    first = acquire(run_dir)
    shutil.rmtree(run_dir)
    second = acquire(run_dir)
    assert second is not first and second.held and not first.held
    assert run_dir.is_dir() and (run_dir / LOCK_FILE).is_file()
    assert second.on_disk()
    again = acquire(run_dir)  # the same process taking it again shares the live lock
    assert again is second and second.users == 2
    again.release()
    second.release()
    assert not run_dir.exists()  # created by the run and left empty: removed, as after a failed build
