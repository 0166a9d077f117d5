"""Nothing in a checkpoint is unpickled: JSON sidecar, allow-listed DCP metadata, tensors only."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ditty.checkpoint import CheckpointManager
from ditty.checkpoint.layout import MARKER, SIDECAR
from ditty.checkpoint.safe_reader import read_metadata_file
from ditty.config.errors import RecipeError

from .helpers import app_state, assert_same_state, build, train_step

# DCP warns on every save/load without a process group; single-process is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_loading_never_calls_pickle_or_unsafe_torch_load(tmp_path, forbid_unpickling):
    model, opt, sched = build()
    train_step(model, opt, sched)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    path = mgr.save(1, app_state(model, opt), {"note": "json only"})
    forbid_unpickling()
    model2, opt2, _ = build(seed=1)
    mgr.load(path, app_state(model2, opt2))
    assert_same_state(model, opt, model2, opt2)


class _Exploit:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_metadata_with_a_foreign_global_is_refused_without_running_it(tmp_path):
    model, opt, _ = build()
    path = CheckpointManager(tmp_path, keep_last=1).save(1, app_state(model, opt), {})
    target = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Exploit(target)))
    with pytest.raises(pickle.UnpicklingError, match="os.system|posix.system"):
        read_metadata_file(path / ".metadata")
    with pytest.raises(RecipeError, match="refusing to load it"):
        CheckpointManager(tmp_path, keep_last=1).load(path, app_state(*build()[:2]))
    assert not target.exists()


def test_checkpoint_with_non_tensor_dcp_entries_is_refused(tmp_path):
    path = tmp_path / "checkpoints" / "step-1"
    dcp.save({"w": torch.ones(2), "blob": {"any": object.__name__}}, checkpoint_id=path)  # bytes entry
    (path / SIDECAR).write_text('{"format": "ditty-checkpoint", "version": 1, "non_tensor_state": {}}')
    (path / MARKER).write_text("step-1\n")
    with pytest.raises(RecipeError, match="non-tensor entries"):
        CheckpointManager(tmp_path, keep_last=1).load(path, {"x": {"w": torch.zeros(2)}})
