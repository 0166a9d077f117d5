"""A run directory that cannot be written: a read-only mount (a finished run included), and a disk
already full when the run starts. Both were tracebacks (EROFS from the run lock; ENOSPC from
write_recipe, which left a truncated recipe.toml); both are now exit 2 naming the directory, with
nothing changed in it.

As root, chmod does not stop writes, so these use real mounts (a read-only bind mount, a tiny
tmpfs) and skip where mounting is not permitted.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from tests.reliability.helpers import ditty, no_traceback, write_recipe


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def mounts():
    made: list = []
    yield made
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _recipe_into(tmp_path, out_dir, steps=4):
    path = write_recipe(tmp_path, steps=steps, name=f"recipe-{uuid.uuid4().hex[:6]}.toml")
    path.write_text(path.read_text().replace(f'output_dir = "{tmp_path / "run"}"', f'output_dir = "{out_dir}"'))
    return path


def test_a_read_only_run_directory_is_a_message(tmp_path, mounts, trial):
    trial.update(
        fault="read-only run directory (finished run)", injected="the run directory bind-mounted read-only; rerun"
    )
    finished = ditty("run", str(write_recipe(tmp_path, steps=4)))
    assert finished.code == 0, finished.err[-3000:]
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    if not (_mount("--bind", str(tmp_path / "run"), str(readonly)) and mounts.append(readonly) is None):
        pytest.skip("cannot bind-mount here (needs root)")
    if not _mount("-o", "remount,bind,ro", str(readonly)):
        pytest.skip("cannot remount read-only here")
    before = _snapshot(readonly)
    for steps in (4, 6):  # the finished run as it was, and one asked to train further
        result = ditty("run", str(_recipe_into(tmp_path, readonly, steps=steps)))
        assert result.code == 2 and no_traceback(result), result.err[-3000:]
        assert f"cannot write to the run directory {readonly}: Read-only file system" in result.err
    trial.update(exit_code=2, lost_steps=0)
    assert _snapshot(readonly) == before


def test_a_full_disk_at_start_is_a_message_and_leaves_no_truncated_recipe(tmp_path, mounts, trial):
    trial.update(fault="disk full at start", injected="run.output_dir on a tmpfs of one 4 KB page")
    small = tmp_path / "small"
    small.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=4k", "tmpfs", str(small)):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    mounts.append(small)
    result = ditty("run", str(_recipe_into(tmp_path, small / "run")))
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "No space left on device" in result.err and str(small / "run") in result.err, result.err[-3000:]
    left = sorted(p.name for p in (small / "run").iterdir()) if (small / "run").exists() else []
    assert "recipe.toml" not in left and not [name for name in left if ".tmp" in name], left
    shutil.rmtree(small / "run", ignore_errors=True)
