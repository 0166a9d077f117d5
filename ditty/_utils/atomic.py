"""Writing a directory all at once: into `NAME.partial` beside it, then one rename.

A crash mid-write leaves the partial directory (removed on the next attempt), never a half-written
directory under the final name, and an earlier complete directory stays where it was until the new
one is whole. Used for `final/` and `ditty export`'s output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


def partial_path(target: str | os.PathLike) -> Path:
    """Where `target` is written before the rename (ditty.checkpoint.lock removes a killed write's)."""
    return Path(f"{target}.partial")


def old_path(target: str | os.PathLike) -> Path:
    """Where a replaced `target` waits between the two renames (put back if a kill came between them)."""
    return Path(f"{target}.old")


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike, *, replace: bool) -> Iterator[Path]:
    """Yield the partial directory to write into; on success it becomes `target`.

    `replace`: an existing `target` is swapped out (renamed aside, then removed after the rename).
    Without it, `target` must be absent or an empty directory (the caller checked: nothing a user
    has is ever overwritten). On an error the partial directory is removed and `target` untouched.
    """
    target = Path(target)
    partial = partial_path(target)
    shutil.rmtree(partial, ignore_errors=True)  # a write that died earlier
    partial.mkdir(parents=True)
    try:
        yield partial
        widen_safetensors_modes(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    old = old_path(target)
    if target.exists():
        if replace:
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        else:
            target.rmdir()  # empty by the caller's check; a file added since makes this fail loudly
    os.replace(partial, target)
    shutil.rmtree(old, ignore_errors=True)


def new_file_mode(directory: str | os.PathLike) -> int:
    """The permission bits a file created in `directory` gets (the umask, and a default ACL where
    there is one), found by creating one: reading the umask would set it, process-wide, meanwhile."""
    probe = os.path.join(directory, f".mode-probe-{os.getpid()}")
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        return os.stat(probe).st_mode & 0o777
    finally:
        os.unlink(probe)


def widen_safetensors_modes(directory: str | os.PathLike) -> None:
    """Give the `.safetensors` files under `directory` the mode every other file there has.

    safetensors 0.8 writes through a temporary file that is created 0600 whatever the umask
    (safetensors#782), so `save_pretrained`'s weights were the one file of final/ that another user
    of a shared directory could not read."""
    found = [path for path in Path(directory).rglob("*.safetensors") if path.is_file()]
    if found:
        mode = new_file_mode(directory)
        for path in found:
            os.chmod(path, mode)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a small text file beside `path`, then rename it into place: a full disk or a kill
    leaves the previous file (or none), never a truncated one. OSError as the write raised it."""
    staged = f"{path}.tmp-{os.getpid()}"
    try:
        with open(staged, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(staged, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(staged)
        raise
