"""`CheckpointManager`: atomic, optionally asynchronous DCP checkpoints under `RUN_DIR/checkpoints/`.

One save, in order (the layout and the rule for "complete" are in `layout.py`):
1. every rank: turn the app state into a tree of tensors (to DCP) and its other leaves (JSON), and
   capture its RNG; the RNG states are gathered to rank 0 (a small collective);
2. rank 0 clears `.tmp-step-N`; a tiny all-reduce makes sure no rank writes before that;
3. every rank writes its shards with DCP into `.tmp-step-N` (async: after a CPU copy is taken,
   in a background thread); DCP's coordinator writes `.metadata` once every rank's shards are in;
4. a barrier, then rank 0 alone writes the sidecar, then `COMPLETE`, renames the directory to
   `step-N`, rewrites `checkpoints/latest`, and prunes; a last barrier, so no rank returns (or
   exits) before the checkpoint is visible. A single renaming rank is what keeps this correct on
   several nodes sharing one filesystem; every-rank renames race.

Sharing assumption: all ranks see the same filesystem under RUN_DIR (as DCP's FileSystemWriter
does). A failure at any point leaves at most a `.tmp-step-N` dir, never a `step-N` that looks
complete; the next successful save deletes such leftovers.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.stateful import Stateful

from ditty.config.errors import RecipeError

from . import comm, rng
from . import sidecar as sidecar_file
from . import tree as state_tree
from .layout import (
    CHECKPOINTS,
    LATEST,
    MARKER,
    METADATA,
    SIDECAR,
    fsync_dir,
    is_complete,
    remove_dir,
    remove_stale,
    step_dirs,
    step_name,
    tmp_dirs,
    tmp_name,
    write_text_atomic,
)
from .safe_reader import SafeFileSystemReader, read_tensor_metadata

log = logging.getLogger(__name__)

# DCP warns on every save and load without a process group that it "assumes a single process";
# that is exactly ditty's single-process case, so the warning only adds noise to every checkpoint.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

AppState = Mapping[str, Any]
"""Name -> a `Stateful` (`ModelOptimizerState`, a module) or a dict of tensors."""


def _state_dicts(app_state: AppState) -> dict[str, Any]:
    out = {}
    for key, value in app_state.items():
        if isinstance(value, Stateful):
            out[key] = value.state_dict()
        elif isinstance(value, Mapping):
            out[key] = value
        else:
            raise TypeError(
                f"app_state[{key!r}] is a {type(value).__name__}; give a Stateful "
                f"(state_dict/load_state_dict) or a dict of tensors"
            )
    return out


def load_checkpoint(
    path: str | os.PathLike, app_state: AppState, *, process_group: torch.distributed.ProcessGroup | None = None
) -> dict[str, Any]:
    """Load a complete checkpoint into `app_state` in place; return its parsed sidecar.

    Collective when a process group is up. Entries of the checkpoint that `app_state` does not name
    are not read (so an export can load the model alone). DCP reshards on the way in: the shards
    were cut for the saving world size, the reads are cut for this one.
    """
    path = Path(path)
    if not is_complete(path):
        missing = [n for n in (METADATA, SIDECAR, MARKER) if not (path / n).is_file()]
        raise RecipeError.single(
            f"{path} is not a complete ditty checkpoint (missing {', '.join(missing)})",
            key="checkpoint.resume",
            fix='point at a checkpoints/step-N directory that holds COMPLETE, or use resume = "auto" '
            "to take the newest complete checkpoint of the run",
        )
    try:
        # Checked here as well as in the reader, so the user sees this message rather than DCP's
        # wrapped traceback; a foreign or tampered checkpoint is a user error, not a crash.
        read_tensor_metadata(path / METADATA)
        doc = sidecar_file.read(path)
    except (pickle.UnpicklingError, ValueError) as e:
        raise RecipeError.single(
            f"cannot use checkpoint {path}: {e}",
            key="checkpoint.resume",
            fix="resume from a checkpoint written by ditty",
        ) from None
    templates = _state_dicts(app_state)
    tensors, _ = state_tree.split(templates)
    dcp.load(tensors, storage_reader=SafeFileSystemReader(path), process_group=process_group)

    extras = doc.get("non_tensor_state", {})
    used: set[str] = set()
    for key, value in app_state.items():
        merged = state_tree.merge(templates[key], extras, (key,), used)
        if isinstance(value, Stateful):
            value.load_state_dict(merged)
        elif isinstance(value, MutableMapping):
            value.update(merged)
    unused = [k for k in extras if k not in used and any(k.startswith(f'["{name}"') for name in app_state)]
    if unused:
        log.warning(
            "checkpoint %s holds values the current state has no place for (ignored): %s",
            path,
            ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else ""),
        )
    return doc


def latest_complete(root: Path, *, in_flight: int | None = None) -> Path | None:
    """The newest complete `step-N` under `root` (a `checkpoints/` dir), or None.

    Scans the directories rather than trusting `latest`: that file is for people and tools, and a
    crash between the rename and its rewrite would leave it one checkpoint behind.
    """
    for step, path in step_dirs(root):
        if is_complete(path):
            for t_step, t_path in tmp_dirs(root):
                if t_step > step and t_step != in_flight:
                    log.warning("ignoring %s: the save of step %d did not finish", t_path.name, t_step)
            return path
        missing = [n for n in (METADATA, SIDECAR, MARKER) if not (path / n).is_file()]
        log.warning("skipping incomplete checkpoint %s (missing %s)", path, ", ".join(missing))
    return None


def find_checkpoint(path: str | os.PathLike, *, key: str = "checkpoint.resume") -> Path:
    """Resolve what a user may name (`checkpoint.resume = PATH`, `ditty export RUN_OR_CHECKPOINT`):
    a `step-N` directory, a run's `checkpoints/` directory, or a run directory. `key`: the recipe key
    the path came from, for the error ("" for a command-line argument)."""
    path = Path(path)
    if is_complete(path):
        return path
    for root in (path / CHECKPOINTS, path):
        if root.is_dir() and step_dirs(root):
            found = latest_complete(root)
            if found is not None:
                return found
    raise RecipeError.single(
        f"no complete checkpoint at {path}",
        key=key,
        fix="name a run directory, its checkpoints/ directory, or a checkpoints/step-N directory "
        "that holds COMPLETE (an interrupted save leaves none)",
    )


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run directory.

    Collective: with a process group, construct it, `save` and `load` on every rank at the same
    point. The constructor then creates a gloo group of its own (see `comm.py`).
    """

    def __init__(self, run_dir: str | os.PathLike, *, keep_last: int, async_save: bool = False) -> None:
        if keep_last < 0:
            raise RecipeError.single(
                f"keep_last is {keep_last}",
                key="checkpoint.keep_last",
                fix="use 0 to keep every checkpoint, or a positive count",
            )
        self.root = Path(run_dir) / CHECKPOINTS
        self.keep_last = keep_last
        self.async_save = async_save
        self._group = comm.new_checkpoint_group()
        self._rank = comm.rank(self._group)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ditty-checkpoint") if async_save else None
        self._pending: Future | None = None
        self._pending_step: int | None = None
        self._closed = False
        # A pending background save also finishes at interpreter exit without this (the worker
        # thread is joined), but errors would go unreported; this hook logs them.
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- saving ----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        app_state: AppState,
        sidecar: Mapping[str, Any],
        *,
        write_extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Checkpoint `app_state` (tensors, to DCP) and `sidecar` (JSON) as `checkpoints/step-N`.

        Synchronous: returns once the checkpoint is complete. Asynchronous: returns once a CPU copy
        of every tensor is taken (that copy costs host memory the size of this rank's shards, and
        the time of one memory copy), so the caller may step the optimizer right away; the write
        finishes in the background. Either way the RNG and the sidecar are captured before return.
        Raises the error of an earlier background save, if it failed. Returns the final path.
        `write_extra(tmp_dir)`: collective, on every rank, after the DCP shards and before the commit:
        files of an engine that checkpoints itself (DeepSpeed). Synchronous managers only.
        """
        if self._closed:
            raise RuntimeError("CheckpointManager.save after close()")
        if write_extra is not None and self._executor is not None:
            raise ValueError("write_extra needs a synchronous CheckpointManager (async_save=False)")
        self.wait()
        step = int(step)
        tensors, non_tensor = state_tree.split(_state_dicts(app_state))
        rng_by_rank = comm.all_gather_json(rng.capture(), self._group)
        # Every rank builds (and so validates) the sidecar: a bad field raises on all ranks alike
        # instead of leaving the others waiting in the next collective.
        text = sidecar_file.build(
            step, sidecar, world_size=comm.world_size(self._group), rng_by_rank=rng_by_rank, non_tensor_state=non_tensor
        )
        tmp = self.root / tmp_name(step)
        error = None
        if self._rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    remove_dir(tmp)  # a save of this step that died earlier
                tmp.mkdir()
            except OSError as e:
                error = e
        if not comm.all_ok(error is None, self._group):
            raise error or RuntimeError(f"rank 0 could not create {tmp}; see its log")

        if self._executor is None:
            self._write(step, tensors, text, stager=None, write_extra=write_extra)
        else:
            stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=torch.cuda.is_available(),
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
            staged = stager.stage(tensors)  # the copy that makes the next optimizer step safe
            self._pending = self._executor.submit(self._write, step, staged, text, stager)
            self._pending_step = step
        return self.root / step_name(step)

    def _write(
        self,
        step: int,
        tensors: dict,
        text: str,
        stager: DefaultStager | None,
        write_extra: Callable[[Path], None] | None = None,
    ) -> None:
        tmp = self.root / tmp_name(step)
        try:
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(tmp), process_group=self._group)
            if write_extra is not None:
                write_extra(tmp)
            # DCP already waits for every rank's shards before writing .metadata; this barrier
            # makes the "all shards are in" point explicit before rank 0 commits (one all-reduce).
            comm.all_ok(True, self._group)
            error = None
            if self._rank == 0:
                try:
                    self._commit(step, text)
                except Exception as e:  # noqa: BLE001 - reported on every rank just below
                    error = e
            if not comm.all_ok(error is None, self._group):
                raise error or RuntimeError(f"rank 0 failed to commit checkpoint {step_name(step)}; see its log")
        finally:
            if stager is not None:
                stager.close()

    def _commit(self, step: int, text: str) -> None:
        tmp, final = self.root / tmp_name(step), self.root / step_name(step)
        if not (tmp / METADATA).is_file():
            raise RuntimeError(f"DCP returned without writing {tmp / METADATA}")
        write_text_atomic(tmp / SIDECAR, text)
        write_text_atomic(tmp / MARKER, step_name(step) + "\n")  # only after .metadata and the sidecar
        newer = [p.name for s, p in step_dirs(self.root) if s > step and is_complete(p)]
        if newer:
            log.warning(
                "saved %s while newer checkpoints exist (%s): they belong to a run that was "
                "resumed from an older point, and resume='auto' would still pick them",
                step_name(step),
                ", ".join(newer),
            )
        if final.exists():
            remove_dir(final)  # the same step saved twice (e.g. the end of a run that was resumed there)
        os.rename(tmp, final)
        fsync_dir(self.root)
        write_text_atomic(self.root / LATEST, step_name(step) + "\n")  # moves last
        self._prune(keep=final)
        log.info("checkpoint %s complete", final)

    def _prune(self, keep: Path) -> None:
        if self.keep_last > 0:
            complete = [p for _, p in step_dirs(self.root) if is_complete(p)]
            # Newest first, and `keep` (just written) is complete: the newest complete one survives.
            for old in complete[self.keep_last :]:
                if old != keep:
                    remove_dir(old)
        remove_stale(self.root, keep=keep)

    # ---- waiting ---------------------------------------------------------------------------

    def wait(self) -> None:
        """Block until a pending background save is complete; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for a pending save, then release the writer thread. Call before the process group
        is destroyed and before exit; idempotent."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    # ---- finding and loading ---------------------------------------------------------------

    def latest_complete(self) -> Path | None:
        """The newest complete `step-N`, or None. Skips (with a warning) newer incomplete ones."""
        in_flight = self._pending_step if self._pending is not None and not self._pending.done() else None
        return latest_complete(self.root, in_flight=in_flight)

    def load(self, path: str | os.PathLike, app_state: AppState) -> dict[str, Any]:
        """`load_checkpoint` on this manager's process group, after any pending save."""
        self.wait()
        return load_checkpoint(path, app_state, process_group=self._group)

    def restore_rng(self, sidecar: Mapping[str, Any]) -> bool:
        """Restore this rank's RNG from a loaded sidecar. Call last, after everything is built."""
        return rng.restore_for_rank(sidecar["rng"], self._rank)


def _close_at_exit(ref: "weakref.ref[CheckpointManager]") -> None:
    manager = ref()
    if manager is None:
        return
    try:
        manager.close()
    except Exception:  # noqa: BLE001 - at exit, a report is all that is left to do
        log.exception("a background checkpoint save failed")
