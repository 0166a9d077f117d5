"""A full disk: said in those words, the previous checkpoint intact, and a rerun resumes from it.

The issue's cases, on a real small filesystem (tmpfs mounted with size=, when the tests run as
root): saving onto a full filesystem ended with torch's "unexpected pos 704 vs 598" and no word
of space; and `final/` was written while the last checkpoint was not, so a rerun retrained from
step 0. Where mounting is not allowed, the ENOSPC cases below still run through injected errors.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid

import pytest

from tests.reliability.helpers import complete_steps, ditty, losses, no_traceback, write_recipe


def _mount(path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a given size under tmp_path (grown with .resize(size)); skips when mounting is refused."""
    where = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"

    class SmallFs:
        path = where

        def __init__(self) -> None:
            self.mounted = False

        def mount(self, size: str) -> "SmallFs":
            if not _mount(where, size):
                pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC tests cover the messages")
            self.mounted = True
            return self

        def resize(self, size: str) -> None:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)

    fs = SmallFs()
    yield fs
    if fs.mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    result = ditty("run", str(write_recipe(tmp, steps=6)))
    assert result.code == 0, result.err[-3000:]
    return losses(tmp / "run")


def _recipe_on(fs_path, tmp_path, steps=6):
    path = write_recipe(tmp_path, steps=steps)
    path.write_text(path.read_text().replace(f'output_dir = "{tmp_path / "run"}"', f'output_dir = "{fs_path / "run"}"'))
    return path


def test_a_save_that_cannot_fit_stops_before_writing_and_the_rerun_resumes(small_fs, tmp_path, reference, trial):
    trial.update(fault="disk full at a later save", injected="tmpfs of 1 MB: room for one checkpoint (~0.63 MB)")
    small_fs.mount("1m")
    recipe = _recipe_on(small_fs.path, tmp_path)
    full = ditty("run", str(recipe))
    run = small_fs.path / "run"
    assert full.code == 1 and no_traceback(full), full.err[-3000:]
    assert f"error: no space left on {small_fs.path} (tmpfs) for checkpoint step-4 (needed ~0.7 MB" in full.err
    assert f"the previous checkpoint {run / 'checkpoints' / 'step-2'} is intact" in full.err
    assert complete_steps(run) == [2] and not list((run / "checkpoints").glob(".tmp-*"))
    assert not (run / "final").exists()
    done = max(step for step, _ in losses(run))

    small_fs.resize("16m")
    rerun = ditty("run", str(recipe))
    trial.update(exit_code=full.code, lost_steps=done - 2)
    assert rerun.code == 0 and "resumed from step 2" in rerun.out, rerun.err[-3000:]
    assert losses(run) == reference


def test_a_disk_that_fills_during_the_first_save_is_reported_as_such(small_fs, tmp_path, reference, trial):
    """The first save has no earlier size to compare with; its write hits the real ENOSPC (torch's
    zip writer then reports only "unexpected pos"), and the partial files are removed."""
    trial.update(
        fault="disk full during a save", injected="tmpfs of 540 KB: the first checkpoint (~0.63 MB) runs out mid-write"
    )
    small_fs.mount("540k")
    recipe = _recipe_on(small_fs.path, tmp_path)
    full = ditty("run", str(recipe))
    run = small_fs.path / "run"
    assert full.code == 1 and no_traceback(full), full.err[-3000:]
    assert f"error: no space left on {small_fs.path} (tmpfs) while writing checkpoint step-2" in full.err
    assert "No earlier checkpoint exists" in full.err and "unexpected pos" not in full.err
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    small_fs.resize("16m")
    rerun = ditty("run", str(recipe))
    trial.update(exit_code=full.code, lost_steps=2)
    assert rerun.code == 0, rerun.err[-3000:]
    assert losses(run) == reference


def test_injected_enospc_inside_the_checkpoint_writer(tmp_path, monkeypatch, trial):
    trial.update(
        fault="ENOSPC inside the checkpoint writer", injected="OSError(ENOSPC) from DCP's write_data at the 2nd save"
    )
    from torch.distributed.checkpoint import FileSystemWriter

    original = FileSystemWriter.write_data
    calls = {"n": 0}

    def write_data(self, plan, planner):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", write_data)
    recipe = write_recipe(tmp_path, steps=6)
    result = ditty("run", str(recipe))
    run = tmp_path / "run"
    trial.update(exit_code=result.code, lost_steps=4 - 2)
    assert result.code == 1 and no_traceback(result), result.err[-3000:]
    assert "no space left on" in result.err and "while writing checkpoint step-4" in result.err
    assert complete_steps(run) == [2] and not list((run / "checkpoints").glob(".tmp-*"))
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-2"


def test_final_is_written_only_after_the_last_checkpoint_is_safe(tmp_path, monkeypatch, reference, trial):
    trial.update(fault="disk full while writing final/", injected="OSError(ENOSPC) from the final/ writer")
    import ditty.train.final as trainer_module  # write_final calls save_final on rank 0

    real = trainer_module.save_final

    def full_disk(model, tokenizer, run_dir, **kwargs):
        os.makedirs(os.path.join(run_dir, "final.partial"), exist_ok=True)
        raise OSError(
            errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(run_dir, "final.partial", "model.safetensors")
        )

    monkeypatch.setattr(trainer_module, "save_final", full_disk)
    recipe = write_recipe(tmp_path, steps=6)
    result = ditty("run", str(recipe))
    run = tmp_path / "run"
    assert result.code == 1 and no_traceback(result), result.err[-3000:]
    assert "while writing final/" in result.err and f"{run / 'checkpoints' / 'step-6'} is intact" in result.err
    assert complete_steps(run)[-1] == 6 and not (run / "final").exists() and not (run / "final.partial").exists()

    monkeypatch.setattr(trainer_module, "save_final", real)
    rerun = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=0)
    assert rerun.code == 0 and "resumed from step 6" in rerun.out, rerun.err[-3000:]
    assert (run / "final" / "model.safetensors").is_file()
    assert losses(run) == reference
