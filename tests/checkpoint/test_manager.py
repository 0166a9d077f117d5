"""Round trip, exact resume, atomicity, pruning and the injected writer failure (synchronous saves)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ditty.checkpoint import CheckpointManager, ModelOptimizerState, find_checkpoint, read_sidecar
from ditty.checkpoint.disk import CheckpointSaveError
from ditty.checkpoint.layout import MARKER
from ditty.checkpoint.safe_reader import read_tensor_metadata
from ditty.config.errors import RecipeError

from .helpers import app_state, assert_same_state, build, train_step

# DCP warns on every save/load without a process group; single-process is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _trained(steps: int, seed: int = 0):
    model, opt, sched = build(seed)
    for _ in range(steps):
        train_step(model, opt, sched)
    return model, opt, sched


def test_round_trip_model_and_adamw(tmp_path):
    model, opt, sched = _trained(3)
    extra = {"ema": torch.arange(4.0)}
    mgr = CheckpointManager(tmp_path, keep_last=2)
    path = mgr.save(3, {**app_state(model, opt), "extra": extra}, {"data_cursor": 24, "tokens_seen": 192})
    assert path == tmp_path / "checkpoints" / "step-3" and mgr.latest_complete() == path
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-3"

    model2, opt2, _ = build(seed=123)  # different initial weights
    extra2 = {"ema": torch.zeros(4)}
    sidecar = mgr.load(path, {**app_state(model2, opt2), "extra": extra2})
    assert_same_state(model, opt, model2, opt2)
    assert torch.equal(extra2["ema"], extra["ema"])
    assert isinstance(opt2.param_groups[0]["betas"], tuple)  # containers come back as their types
    assert sidecar["step"] == 3 and sidecar["data_cursor"] == 24 and sidecar["tokens_seen"] == 192
    assert sidecar["world_size"] == 1 and set(sidecar["rng"]) == {"0"}


def test_resume_gives_bitwise_equal_losses(tmp_path):
    total, cut = 7, 3
    model, opt, sched = build()
    reference = [train_step(model, opt, sched) for _ in range(total)]

    model, opt, sched = build()
    losses = [train_step(model, opt, sched) for _ in range(cut)]
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save(cut, app_state(model, opt), {"scheduler": sched.state_dict()})
    del model, opt, sched

    # A new "process": built from another seed, which the restored RNG must override.
    model, opt, sched = build(seed=99)
    sidecar = mgr.load(mgr.latest_complete(), app_state(model, opt))
    sched.load_state_dict(sidecar["scheduler"])
    mgr.restore_rng(sidecar)  # last: building above drew random numbers
    losses += [train_step(model, opt, sched) for _ in range(total - cut)]
    assert losses == reference  # float equality: bitwise

    # Control: the same resume without the RNG diverges, so the equality above is not vacuous.
    model, opt, sched = build(seed=99)
    sidecar = mgr.load(mgr.latest_complete(), app_state(model, opt))
    sched.load_state_dict(sidecar["scheduler"])
    assert [train_step(model, opt, sched) for _ in range(total - cut)] != reference[cut:]


def test_incomplete_checkpoints_are_skipped_with_a_warning(tmp_path, caplog):
    model, opt, _ = _trained(1)
    mgr = CheckpointManager(tmp_path, keep_last=0)
    good = mgr.save(2, app_state(model, opt), {})
    root = tmp_path / "checkpoints"
    shutil.copytree(good, root / "step-4")
    (root / "step-4" / MARKER).unlink()  # DCP finished, ditty's marker never written
    shutil.copytree(good, root / ".tmp-step-6")  # a save that died before its rename
    with caplog.at_level(logging.WARNING):
        assert mgr.latest_complete() == good
    assert "step-4" in caplog.text and "missing COMPLETE" in caplog.text and ".tmp-step-6" in caplog.text
    with pytest.raises(RecipeError, match="not a complete ditty checkpoint"):
        mgr.load(root / "step-4", app_state(*build()[:2]))
    assert CheckpointManager(tmp_path / "empty", keep_last=1).latest_complete() is None


def _fail_after_data(original):
    def write_data(self, plan, planner):
        original(self, plan, planner).wait()  # the shard files are on disk...
        raise OSError("injected: disk full")  # ...and then the writer dies

    return write_data


def _fail_after_metadata(original):
    def finish(self, metadata, results):
        original(self, metadata, results)  # .metadata is written...
        raise OSError("injected: crash after .metadata")  # ...but ditty's commit never happens

    return finish


@pytest.mark.parametrize("name, inject", [("write_data", _fail_after_data), ("finish", _fail_after_metadata)])
def test_writer_failure_leaves_the_previous_checkpoint_as_latest(tmp_path, monkeypatch, name, inject):
    model, opt, sched = _trained(2)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    previous = mgr.save(2, app_state(model, opt), {"data_cursor": 16})
    train_step(model, opt, sched)

    monkeypatch.setattr(dcp.FileSystemWriter, name, inject(getattr(dcp.FileSystemWriter, name)))
    # The writer's error, said as what failed and what is kept; the partial directory is removed.
    with pytest.raises(CheckpointSaveError, match="could not write checkpoint step-3: injected") as failure:
        mgr.save(3, app_state(model, opt), {"data_cursor": 24})
    assert f"the previous checkpoint {previous} is intact" in str(failure.value)
    monkeypatch.undo()

    root = tmp_path / "checkpoints"
    assert not (root / "step-3").exists() and not (root / ".tmp-step-3").exists()
    assert mgr.latest_complete() == previous
    assert (root / "latest").read_text().strip() == "step-2"
    assert read_sidecar(previous)["data_cursor"] == 16

    # The next save succeeds, becomes latest, and clears the dead save's leftovers (keep_last=1).
    assert mgr.save(4, app_state(model, opt), {}) == mgr.latest_complete()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-4"]


def test_keep_last_prunes_oldest_and_zero_keeps_all(tmp_path):
    model, opt, _ = _trained(1)
    mgr = CheckpointManager(tmp_path / "a", keep_last=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, app_state(model, opt), {})
    assert sorted(p.name for p in (tmp_path / "a/checkpoints").iterdir()) == ["latest", "step-3", "step-4"]

    mgr = CheckpointManager(tmp_path / "b", keep_last=0)
    for step in (1, 2, 3):
        mgr.save(step, app_state(model, opt), {})
    assert sorted(p.name for p in (tmp_path / "b/checkpoints").iterdir()) == ["latest", "step-1", "step-2", "step-3"]

    with pytest.raises(RecipeError, match="checkpoint.keep_last"):
        CheckpointManager(tmp_path / "c", keep_last=-1)


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, opt, sched = _trained(1)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save(5, app_state(model, opt), {"v": 1})
    mgr.save(5, app_state(model, opt), {"v": 2})
    assert read_sidecar(mgr.latest_complete())["v"] == 2


def test_sidecar_is_plain_json_and_bad_fields_are_refused(tmp_path):
    model, opt, _ = _trained(1)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    with pytest.raises(TypeError, match="'scaler'"):
        mgr.save(1, app_state(model, opt), {"scaler": object()})
    with pytest.raises(ValueError, match="reserved"):
        mgr.save(1, app_state(model, opt), {"rng": {}})
    path = mgr.save(1, app_state(model, opt), {"recipe": "[train]\nsteps = 3\n"})
    doc = json.loads((path / "ditty_state.json").read_text())
    assert doc["recipe"].startswith("[train]")
    assert doc["non_tensor_state"]['["train", "optim", "param_groups", 0, "lr"]'] == 1e-2 / 2
    assert sorted(p.name for p in path.iterdir()) == [
        ".metadata",
        "COMPLETE",
        "__0_0.distcp",
        "ditty_state.json",
        "manifest.json",
    ]


def test_find_checkpoint_accepts_run_dir_checkpoints_dir_and_step_dir(tmp_path):
    model, opt, _ = _trained(1)
    mgr = CheckpointManager(tmp_path, keep_last=0)
    mgr.save(1, app_state(model, opt), {})
    newest = mgr.save(2, app_state(model, opt), {})
    older = tmp_path / "checkpoints" / "step-1"
    assert find_checkpoint(tmp_path) == newest
    assert find_checkpoint(tmp_path / "checkpoints") == newest
    assert find_checkpoint(older) == older
    with pytest.raises(RecipeError, match="no complete checkpoint"):
        find_checkpoint(tmp_path / "nowhere")


def test_adapter_state_saves_only_trainable_weights(tmp_path):
    def adapter_model(seed):
        model, _, _ = build(seed)
        model[0].requires_grad_(False)  # the frozen base
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, opt

    model, opt = adapter_model(0)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    state = {"train": ModelOptimizerState(model, opt, trainable_only=True)}
    path = CheckpointManager(tmp_path, keep_last=1).save(1, state, {})
    saved = read_tensor_metadata(path / ".metadata").state_dict_metadata
    assert not any(k.startswith("train.model.0.") for k in saved)  # frozen weights stay out

    model2, opt2 = adapter_model(5)
    frozen_before = model2[0].weight.clone()
    CheckpointManager(tmp_path, keep_last=1).load(
        path, {"train": ModelOptimizerState(model2, opt2, trainable_only=True)}
    )
    assert torch.equal(model2[0].weight, frozen_before)  # the base is what it was built as
    assert torch.equal(model2[3].weight, model[3].weight)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
