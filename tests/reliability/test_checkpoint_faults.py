"""Damaged checkpoints: overwritten, truncated or deleted files, a sidecar missing a key.

Each case starts from a copy of one run that crashed during step 8 (checkpoints at steps 2, 4, 6),
damages its newest checkpoint, and reruns the same command. The rerun must skip the damaged
checkpoint, say which and why, resume from step 4, and end with exactly the losses and weights
of a run that was never interrupted: nothing wrong is loaded, and only the steps since the last
intact checkpoint are lost.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.reliability.helpers import (
    complete_steps,
    ditty,
    final_weights,
    losses,
    no_traceback,
    overwrite,
    same_weights,
    shard,
    truncate,
    write_recipe,
)

CRASH_HOOK = '\n[[pipeline.preprocessors]]\nuse = "tests.train.dist_hooks:FailAt"\n'
STEPS_DONE = 7  # the crash comes during step 8 (0-based step 7)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run: its losses and final weights."""
    tmp = tmp_path_factory.mktemp("reference")
    result = ditty("run", str(write_recipe(tmp, extra=CRASH_HOOK)))
    assert result.code == 0, result.err[-3000:]
    return losses(tmp / "run"), final_weights(tmp / "run")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, reference):
    """The same recipe, crashed (an exception on rank 0) during step 8."""
    tmp = tmp_path_factory.mktemp("crashed")
    recipe = write_recipe(tmp, extra=CRASH_HOOK)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DITTY_TEST_FAIL_AT", "0:7")
        result = ditty("run", str(recipe))
    assert result.code == 1 and "injected failure on rank 0 at step 7" in result.err, result.err[-2000:]
    assert complete_steps(tmp / "run") == [2, 4, 6]
    return tmp


def _copy(crashed: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(crashed / "run", tmp_path / "run")
    return write_recipe(tmp_path, extra=CRASH_HOOK), tmp_path / "run"


def _resumes_from_step_4_exactly(result, run: Path, reference, damaged_file: str) -> None:
    ref_losses, ref_weights = reference
    assert result.code == 0, result.err[-3000:]
    assert no_traceback(result)
    assert "step-6 is damaged" in result.err and damaged_file in result.err  # which, and why
    assert "resumed from step 4" in result.out
    assert losses(run) == ref_losses  # bitwise: the damaged checkpoint never reached the model
    assert same_weights(final_weights(run), ref_weights)


DAMAGES = {
    "overwritten": (
        "4 KB of 0xff written into the middle of a shard",
        lambda run: overwrite(shard(run, 6), 20_000),
        "__0_0.distcp",
    ),
    "truncated": ("a shard cut to 5,000 bytes", lambda run: truncate(shard(run, 6), 5_000), "__0_0.distcp"),
    "deleted": ("a shard deleted", lambda run: shard(run, 6).unlink(), "__0_0.distcp"),
    "metadata": (
        "4 KB of 0xff written over DCP's .metadata",
        lambda run: overwrite(run / "checkpoints/step-6/.metadata", 100),
        ".metadata",
    ),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(kind, crashed, reference, tmp_path, trial):
    how, damage, damaged_file = DAMAGES[kind]
    trial.update(fault=f"newest checkpoint: file {kind}", injected=how)
    recipe, run = _copy(crashed, tmp_path)
    damage(run)
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=STEPS_DONE - 4)
    _resumes_from_step_4_exactly(result, run, reference, damaged_file)


def _drop_train_state(run: Path, *, with_manifest: bool) -> None:
    side = run / "checkpoints/step-6/ditty_state.json"
    doc = json.loads(side.read_text())
    del doc["train_state"]
    side.write_text(json.dumps(doc))
    if not with_manifest:
        (run / "checkpoints/step-6/manifest.json").unlink()


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "no-manifest"])
def test_a_sidecar_missing_a_key_is_skipped_without_a_keyerror(with_manifest, crashed, reference, tmp_path, trial):
    """Without its manifest too (an older checkpoint): the sidecar's required fields are checked."""
    trial.update(
        fault="newest checkpoint: sidecar missing a key" + ("" if with_manifest else ", manifest deleted"),
        injected='"train_state" removed from ditty_state.json',
    )
    recipe, run = _copy(crashed, tmp_path)
    _drop_train_state(run, with_manifest=with_manifest)
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=STEPS_DONE - 4)
    _resumes_from_step_4_exactly(result, run, reference, "ditty_state.json")
    assert "KeyError" not in result.err


def test_fallback_false_stops_naming_the_file_and_touches_nothing(crashed, tmp_path, trial):
    trial.update(fault="damaged checkpoint, checkpoint.fallback = false", injected="4 KB overwritten in a shard")
    recipe, run = _copy(crashed, tmp_path)
    overwrite(shard(run, 6), 20_000)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    result = ditty("run", str(recipe), "--checkpoint.fallback", "false")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result)
    assert "step-6 is damaged: __0_0.distcp: its content changed" in result.err
    assert "checkpoint.fallback = true" in result.err  # the fix
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


def test_no_intact_checkpoint_left_is_exit_2(crashed, tmp_path, trial):
    trial.update(fault="every checkpoint damaged", injected="a shard of each checkpoint truncated")
    recipe, run = _copy(crashed, tmp_path)
    for step in (2, 4, 6):
        truncate(shard(run, step), 1_000)
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result)
    assert "no intact checkpoint is left" in result.err
    assert all(f"step-{s}: __0_0.distcp" in result.err for s in (2, 4, 6))
    assert not (run / "final").exists()


def test_export_verifies_and_takes_the_newest_intact_checkpoint(crashed, reference, tmp_path, trial):
    trial.update(fault="export of a damaged checkpoint", injected="4 KB overwritten in a shard")
    _, run = _copy(crashed, tmp_path)
    overwrite(shard(run, 6), 20_000)
    named = ditty("export", str(run / "checkpoints" / "step-6"), "-o", str(tmp_path / "named"))
    assert named.code == 2 and no_traceback(named)
    assert "step-6 is damaged: __0_0.distcp" in named.err and not (tmp_path / "named").exists()
    whole = ditty("export", str(run), "-o", str(tmp_path / "whole"))
    trial.update(exit_code=whole.code, lost_steps=STEPS_DONE - 4)
    assert whole.code == 0, whole.err[-2000:]
    assert "step-6 is damaged" in whole.err and "exported" in whole.out and "step-4" in whole.out


def test_final_model_is_verified_before_it_is_used(reference, tmp_path, trial):
    trial.update(fault="final/ damaged", injected="4 KB overwritten in final/model.safetensors")
    recipe = write_recipe(tmp_path, steps=4)
    assert ditty("run", str(recipe)).code == 0
    final = tmp_path / "run" / "final"
    manifest = json.loads((final / "manifest.json").read_text())
    assert set(manifest["ranks"]["0"]) >= {"model.safetensors", "config.json", "tokenizer_config.json"}
    assert ditty("generate", str(tmp_path / "run"), "1+1=", "--max-new-tokens", "2").code == 0
    overwrite(final / "model.safetensors", 5_000)
    result = ditty("generate", str(tmp_path / "run"), "1+1=", "--max-new-tokens", "2")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result)
    assert "final is damaged: model.safetensors: its content changed" in result.err
    assert "ditty export" in result.err  # how to write it again


def _damage_manifest_entry(run: Path, kind: str) -> None:
    path = run / "checkpoints/step-6/manifest.json"
    doc = json.loads(path.read_text())
    files = doc["ranks"]["0"]
    if kind == "no-hash":
        del files["__0_0.distcp"]["xxh3_64"]
    else:
        files["__0_0.distcp"] = "deadbeef"
    path.write_text(json.dumps(doc))


MANIFEST_DAMAGES = {
    "no-hash": 'the "xxh3_64" of a shard\'s entry removed from manifest.json',
    "not-an-object": "a shard's manifest.json entry replaced by a string",
}


@pytest.mark.parametrize("kind", sorted(MANIFEST_DAMAGES))
def test_a_damaged_manifest_entry_is_a_damaged_checkpoint(kind, crashed, reference, tmp_path, trial):
    """Not a KeyError: the checkpoint is passed over like one with a damaged shard."""
    trial.update(fault=f"run dir: a checkpoint's manifest entry {kind}", injected=MANIFEST_DAMAGES[kind])
    recipe, run = _copy(crashed, tmp_path)
    _damage_manifest_entry(run, kind)
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=STEPS_DONE - 4)
    _resumes_from_step_4_exactly(result, run, reference, "__0_0.distcp")
    assert "KeyError" not in result.err and "manifest.json entry" in result.err
