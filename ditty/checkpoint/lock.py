"""`run.lock`: one writer per run directory.

The first `ditty run` into a directory takes an exclusive `flock` on `RUN_DIR/run.lock` and holds
it for the run's lifetime; a second run into the same directory fails at once (a RecipeError, exit
code 2) naming the holder's pid and host. The kernel releases the lock when the holding process
dies, however it dies, so a `kill -9` never leaves a stale lock behind: the file may stay, the
lock does not. Only the main process (rank 0) of a multi-process run takes it.

Right after taking the lock, the leftovers of a save that was killed are removed (temporary
checkpoint directories, half-written `latest` and `final/` files): with the lock held, nobody
else can be in the middle of writing them.

`flock` locks are per open file, and this module keeps one per directory per process, so the
Python API may build several trainers on one directory in turn within one process. On network
filesystems Linux implements `flock` with the server's byte-range locks (NFS since 2.6.12).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import weakref
from pathlib import Path
from typing import Iterator, Optional

from ditty._utils.atomic import old_path, partial_path
from ditty._utils.dist import is_main_process
from ditty.config.errors import RecipeError

from .layout import CHECKPOINTS, LATEST, tmp_dirs

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"

_held: dict[str, "RunLock"] = {}
"""Resolved run directory -> the lock this process holds on it."""


class RunLock:
    """An exclusive lock on one run directory, held until `release()` (or the process ends)."""

    def __init__(self, run_dir: Path, fd: Optional[int], created_dir: bool) -> None:
        self.run_dir = run_dir
        self.fd = fd
        self.created_dir = created_dir
        self.users = 1
        # Garbage collection or interpreter exit releases a lock nobody released (a trainer whose
        # construction failed): the file goes too, so the directory looks untouched.
        self._finalizer = weakref.finalize(self, _close, fd, run_dir / LOCK_FILE)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self, *, all_users: bool = False) -> None:
        """Give the lock up (once per `acquire`, or at once with `all_users`). The file is removed
        while still locked, so a waiting process can never lock a file that is about to go."""
        if self.fd is None:
            return
        self.users = 0 if all_users else self.users - 1
        if self.users > 0:
            return
        _held.pop(str(self.run_dir), None)
        self._finalizer()
        self.fd = None
        try:
            if self.created_dir and not any(self.run_dir.iterdir()):
                self.run_dir.rmdir()  # a run that failed before writing anything leaves no empty directory
        except OSError:
            pass

    def on_disk(self) -> bool:
        """Whether the file this lock holds is still `run_dir/run.lock`: a process that removed the
        directory (a notebook's `rm -rf`, a test's cleanup) left it a lock nobody else can see."""
        if self.fd is None:
            return False
        try:
            held, there = os.fstat(self.fd), os.stat(self.run_dir / LOCK_FILE)
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)

    def forget(self) -> None:
        """Close this process's descriptor and touch nothing on disk: for a lock whose file is gone
        (the path may be another's now), and in a forked child (the parent's lock stays held)."""
        self._finalizer.detach()
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None
        self.users = 0


def _close(fd: Optional[int], path: Path) -> None:
    if fd is None:
        return
    try:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            path.unlink()
    except OSError:
        pass
    try:
        os.close(fd)  # closing the last descriptor of the open file releases the flock
    except OSError:
        pass


def _forget_inherited_locks() -> None:
    """In a forked child (a dataloader worker): close the inherited descriptors of the parent's run
    locks. A flock belongs to the open file, which a fork shares, so a child keeping its copy would
    hold the lock after the trainer is killed, until the child noticed and exited, and a resume
    started at once would be refused. Closing a copy (not LOCK_UN) leaves the parent's lock held."""
    for lock in list(_held.values()):
        lock.forget()  # the child never removes the file or releases the parent's lock
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_locks)


@contextlib.contextmanager
def run_lock_scope() -> Iterator[None]:
    """Release, when the block ends however it ends, every run lock taken inside it (a trainer that
    failed while it was being built never reaches the `close` that would release it)."""
    before = set(_held)
    try:
        yield
    finally:
        for key in set(_held) - before:
            lock = _held.get(key)
            if lock is not None:
                lock.release(all_users=True)


def holder(run_dir: Path) -> str:
    """Who holds the lock, in words ("pid 4242 on node7, since 2026-11-23 01:02:03"), as it recorded."""
    try:
        info = json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet recorded its pid"


def acquire(run_dir: str | os.PathLike) -> RunLock:
    """Lock `run_dir` for this process (creating the directory if needed); RecipeError if another
    process holds it. Not re-checked here: whether the directory may be used at all (the caller
    refuses a directory of someone else's files before calling)."""
    run_dir = Path(os.path.abspath(run_dir))
    key = str(run_dir)
    if key in _held:
        if _held[key].on_disk():
            _held[key].users += 1
            return _held[key]
        _held.pop(key).forget()  # its directory was removed (and made again): that lock guards nothing now
    created_dir = not run_dir.exists()
    path = run_dir / LOCK_FILE
    while True:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:  # a read-only filesystem or directory, no permission, a full disk
            raise _unwritable(run_dir, error) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RecipeError.single(
                f"{run_dir} is in use by another ditty run ({holder(run_dir)}); two runs writing one "
                "directory would overwrite each other's checkpoints and metrics",
                key="run.output_dir",
                fix="wait for that run to finish (or stop it), or choose another run.output_dir",
            ) from None
        # The holder before us may have removed the file between our open and our lock: then we
        # locked a file nobody else can see. Lock the file that is there now instead.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now().isoformat(sep=" ", timespec="seconds"),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
    except OSError as error:
        os.close(fd)
        raise _unwritable(run_dir, error) from None
    lock = RunLock(run_dir, fd, created_dir)
    _held[key] = lock
    return lock


def _unwritable(run_dir: Path, error: OSError) -> RecipeError:
    return RecipeError.single(
        f"cannot write to the run directory {run_dir}: {error.strerror or error} ({error.filename or run_dir}); "
        "nothing in it was changed",
        key="run.output_dir",
        fix="choose a run.output_dir on a writable filesystem with free space (a finished run on a read-only "
        "medium is read by `ditty generate`, `export` and `push`, which do not write into it)",
    )


def remove_leftovers(run_dir: str | os.PathLike) -> list[str]:
    """Remove what killed saves leave behind; return the names removed. Call with the lock held.

    - `checkpoints/.tmp-step-N/` (a checkpoint save that never committed), `checkpoints/.trash-*`
      (an interrupted prune), `checkpoints/.latest.tmp-*` (a half-written `latest`);
    - `final.partial/` (a `final/` write that never finished) and `metrics.jsonl.tmp`;
    - `final.old/`: removed when `final/` exists; when it does not, the kill came between the two
      renames that replace `final/`, and `final.old/` is the last complete model: it is put back.
    """
    run_dir = Path(run_dir)
    removed = []
    root = run_dir / CHECKPOINTS
    if root.is_dir():
        stale = [p for _, p in tmp_dirs(root)] + [p for p in root.iterdir() if p.name.startswith(".trash-")]
        stale += [p for p in root.iterdir() if p.name.startswith(f".{LATEST}.tmp-")]
        for path in stale:
            _remove(path)
            removed.append(f"{CHECKPOINTS}/{path.name}")
    final = run_dir / "final"
    old = old_path(final)  # the names ditty._utils.atomic writes final/ through
    if old.is_dir() and not final.exists():
        os.replace(old, final)
        log.warning("%s: put back the last complete final/ (a replacement of it was interrupted)", run_dir)
    for name in (partial_path(final).name, old.name, "metrics.jsonl.tmp"):
        if (run_dir / name).exists():
            _remove(run_dir / name)
            removed.append(name)
    if removed:
        log.warning("%s: removed leftovers of an interrupted run: %s", run_dir, ", ".join(removed))
    return removed


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class _NotHeld:
    """What ranks other than 0 hold: nothing, with the same interface."""

    held = False

    def release(self) -> None:
        pass


def hold_run_dir(run_dir: str | os.PathLike) -> RunLock | _NotHeld:
    """On the main process: lock `run_dir`, then remove leftovers of killed saves. Elsewhere: nothing."""
    if not is_main_process():
        return _NotHeld()
    lock = acquire(run_dir)
    if lock.users == 1:
        remove_leftovers(run_dir)
    return lock
