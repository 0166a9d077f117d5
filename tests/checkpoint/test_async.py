"""Async saves: the checkpoint holds the values of its own step, failures surface, exit waits."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ditty.checkpoint import CheckpointManager, read_sidecar
from ditty.checkpoint.disk import CheckpointSaveError
from ditty.checkpoint.layout import is_complete

from .helpers import app_state, assert_same_state, build, train_step

# DCP warns on every save/load without a process group; single-process is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

REPO = Path(__file__).resolve().parents[2]


def _gate_writer(monkeypatch):
    """Hold DCP's writer at its entry until the test opens the gate: no timing involved."""
    entered, gate = threading.Event(), threading.Event()
    original = dcp.FileSystemWriter.write_data

    def write_data(self, plan, planner):
        entered.set()
        assert gate.wait(30), "test never opened the gate"
        return original(self, plan, planner)

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", write_data)
    return entered, gate


def test_async_save_holds_its_step_while_training_goes_on(tmp_path, monkeypatch):
    model, opt, sched = build()
    for _ in range(2):
        train_step(model, opt, sched)
    at_save = copy.deepcopy((model, opt))
    entered, gate = _gate_writer(monkeypatch)
    mgr = CheckpointManager(tmp_path, keep_last=2, async_save=True)
    fields = {"data_cursor": 16}
    path = mgr.save(2, app_state(model, opt), fields)

    assert entered.wait(30)  # the write is in flight...
    assert not path.exists()
    for _ in range(2):  # ...while the next optimizer steps change weights, moments and the LR in place
        train_step(model, opt, sched)
    fields["data_cursor"] = 999
    gate.set()
    mgr.wait()
    assert is_complete(path) and mgr.latest_complete() == path

    model2, opt2, _ = build(seed=7)
    sidecar = mgr.load(path, app_state(model2, opt2))
    assert_same_state(*at_save, model2, opt2)
    assert not torch.equal(model2[0].weight, model[0].weight)
    assert sidecar["data_cursor"] == 16
    mgr.close()


def test_a_failed_background_save_surfaces_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = build()
    train_step(model, opt, sched)
    mgr = CheckpointManager(tmp_path, keep_last=1, async_save=True)
    previous = mgr.save(1, app_state(model, opt), {})
    mgr.wait()

    def broken(self, plan, planner):
        raise OSError("injected: writer died")

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", broken)
    mgr.save(2, app_state(model, opt), {})
    with pytest.raises(
        CheckpointSaveError, match="could not write checkpoint step-2: injected: writer died"
    ) as failure:
        mgr.wait()
    assert f"the previous checkpoint {previous} is intact" in str(failure.value)
    assert mgr.latest_complete() == previous
    assert not (tmp_path / "checkpoints" / ".tmp-step-2").exists()  # the partial files were removed
    monkeypatch.undo()
    assert mgr.save(3, app_state(model, opt), {}).name == "step-3"
    mgr.close()  # waits for step 3
    assert mgr.latest_complete().name == "step-3"


SCRIPT = """
import sys, threading, time
sys.path.insert(0, {repo!r})
import torch.distributed.checkpoint as dcp
from ditty.checkpoint import CheckpointManager
from tests.checkpoint.helpers import app_state, build, train_step

gate = threading.Event()
original = dcp.FileSystemWriter.write_data
def write_data(self, plan, planner):
    gate.wait(30)
    time.sleep(0.5)  # still writing while the interpreter shuts down
    return original(self, plan, planner)
dcp.FileSystemWriter.write_data = write_data

model, opt, sched = build()
train_step(model, opt, sched)
mgr = CheckpointManager({run!r}, keep_last=1, async_save=True)
path = mgr.save(1, app_state(model, opt), {{"data_cursor": 8}})
print("pending at exit:", not path.exists(), flush=True)
gate.set()
{ending}
"""


@pytest.mark.parametrize("ending", ["pass", "raise RuntimeError('training crashed after the save')"])
def test_exit_waits_for_a_pending_save(tmp_path, ending):
    script = SCRIPT.format(repo=str(REPO), run=str(tmp_path), ending=ending)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert "pending at exit: True" in proc.stdout, proc.stderr
    assert proc.returncode == (0 if ending == "pass" else 1), proc.stderr
    path = tmp_path / "checkpoints" / "step-1"
    assert is_complete(path)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-1"
    assert read_sidecar(path)["data_cursor"] == 8
    model, opt, _ = build(seed=3)
    CheckpointManager(tmp_path, keep_last=1).load(path, app_state(model, opt))
