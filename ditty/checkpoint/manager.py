"""`CheckpointManager`: atomic, optionally asynchronous DCP checkpoints under `RUN_DIR/checkpoints/`.

One save, in order (the layout and the rule for "complete" are in `layout.py`):
1. every rank: turn the app state into a tree of tensors (to DCP) and its other leaves (JSON), and
   capture its RNG; the RNG states are gathered to rank 0 (a small collective);
2. rank 0 clears `.tmp-step-N`; a tiny all-reduce makes sure no rank writes before that;
3. every rank writes its shards with DCP into `.tmp-step-N` (async: after a CPU copy is taken,
   in a background thread); DCP's coordinator writes `.metadata` once every rank's shards are in;
4. a barrier; every rank hashes the files it wrote (`manifest.py`) and the descriptions are
   gathered to rank 0, which alone writes the sidecar, then `manifest.json`, then `COMPLETE`,
   renames the directory to `step-N`, rewrites `checkpoints/latest`, and prunes; a last barrier,
   so no rank returns (or exits) before the checkpoint is visible. A single renaming rank is what
   keeps this correct on several nodes sharing one filesystem; every-rank renames race.

Before step 2, rank 0 checks that the filesystem has room for the save (`disk.py`); a save that
fails while writing removes its partial files and raises a `CheckpointSaveError` that says "no
space left on DEVICE" or the operating system's error. Loading verifies the manifest first
(`integrity.py`), so damaged bytes never reach a model.

Sharing assumption: all ranks see the same filesystem under RUN_DIR (as DCP's FileSystemWriter
does). A failure at any point leaves at most a `.tmp-step-N` dir, never a `step-N` that looks
complete; the next successful save deletes such leftovers.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ditty.config.errors import RecipeError

from . import comm, disk, manifest, rng
from . import sidecar as sidecar_file
from . import tree as state_tree
from .finite import FiniteStepGate
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
    tmp_name,
    write_text_atomic,
)
from .load import AppState, _state_dicts, latest_complete, load_checkpoint, newest_complete

# Re-exported: callers import them from here as well as from the package.
__all__ = ["CheckpointManager", "find_checkpoint", "latest_complete", "load_checkpoint"]
from .load import find_checkpoint  # noqa: E402

log = logging.getLogger(__name__)


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
        self.group = self._group
        """The process group of the checkpoint's collectives (gloo: they carry small CPU tensors)."""
        self._rank = comm.rank(self._group)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ditty-checkpoint") if async_save else None
        self._pending: Future | None = None
        self._pending_step: int | None = None
        self._closed = False
        self._protected: int | None = None
        self.finite = FiniteStepGate(self)
        """Keeps saves away from non-finite steps (the trainer asks it before each save)."""
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
        gathered = comm.all_gather_json(
            {"rng": rng.capture(), "bytes": _bytes_written_by(tensors, self._rank)}, self._group
        )
        rng_by_rank = [g["rng"] for g in gathered]
        needed = max(sum(g["bytes"] for g in gathered), self._last_size())
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
                disk.check_free_space(
                    self.root, needed, what=f"checkpoint {step_name(step)}", kept=self.describe_kept()
                )
                tmp.mkdir()
            except disk.CheckpointSaveError as e:
                error = e
            except OSError as e:
                error = disk.explain_write_error(
                    e, self.root, needed, what=f"checkpoint {step_name(step)}", kept=self.describe_kept()
                )
        if not comm.all_ok(error is None, self._group):
            raise error or disk.CheckpointSaveError(
                f"rank 0 could not start checkpoint {step_name(step)}; its message says why"
            )

        if self._executor is None:
            self._write(step, tensors, text, stager=None, write_extra=write_extra, needed=needed)
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
            self._pending = self._executor.submit(self._write, step, staged, text, stager, None, needed)
            self._pending_step = step
        return self.root / step_name(step)

    def _write(
        self,
        step: int,
        tensors: dict,
        text: str,
        stager: DefaultStager | None,
        write_extra: Callable[[Path], None] | None = None,
        needed: int = 0,
    ) -> None:
        tmp = self.root / tmp_name(step)
        what = f"checkpoint {step_name(step)}"
        try:
            # On failure rank 0 removes the partial directory (after DCP has failed on every rank, so
            # nobody writes into it any more), and the error becomes a CheckpointSaveError.
            with disk.write_errors_reported(
                self.root, needed, what=what, kept=self.describe_kept(), cleanup=tmp if self._rank == 0 else None
            ):
                dcp.save(tensors, storage_writer=dcp.FileSystemWriter(tmp), process_group=self._group)
                if write_extra is not None:
                    write_extra(tmp)
                # DCP already waits for every rank's shards before writing .metadata; this barrier
                # makes the "all files are in" point explicit before the files are hashed.
                comm.all_ok(True, self._group)
                by_rank = comm.all_gather_json(_describe_own_files(tmp, self._rank), self._group)
                failed = [entry["__error__"] for entry in by_rank if "__error__" in entry]
                if failed:
                    raise disk.CheckpointSaveError(f"could not read back {what} to hash it: {failed[0]}")
                error = None
                if self._rank == 0:
                    try:
                        self._commit(step, text, by_rank)
                    except Exception as e:  # noqa: BLE001 - reported on every rank just below
                        error = e
                if not comm.all_ok(error is None, self._group):
                    raise error or disk.CheckpointSaveError(f"rank 0 could not commit {what}; its message says why")
        finally:
            if stager is not None:
                stager.close()

    def _commit(self, step: int, text: str, by_rank: list[dict]) -> None:
        tmp, final = self.root / tmp_name(step), self.root / step_name(step)
        if not (tmp / METADATA).is_file():
            raise RuntimeError(f"DCP returned without writing {tmp / METADATA}")
        write_text_atomic(tmp / SIDECAR, text)
        files = {rank: dict(entries) for rank, entries in enumerate(by_rank)}
        files[0][SIDECAR] = manifest.hash_file(tmp / SIDECAR)
        manifest.write(tmp, files)  # after every file it describes
        write_text_atomic(tmp / MARKER, step_name(step) + "\n")  # only after .metadata, the sidecar and the manifest
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
            complete = [(s, p) for s, p in step_dirs(self.root) if is_complete(p)]
            # Newest first, and `keep` (just written) is complete: the newest complete one survives.
            # The protected one (the last written before a non-finite streak) survives as well.
            for step, old in complete[self.keep_last :]:
                if old != keep and step != self._protected:
                    remove_dir(old)
        remove_stale(self.root, keep=keep)

    def protect(self, step: int) -> None:
        """Never prune `step` in this run (one at a time: a newer call replaces it)."""
        self._protected = int(step)

    def describe_kept(self) -> str | None:
        """The newest complete checkpoint, in words, for messages about a failed save."""
        found = newest_complete(self.root)
        return f"the previous checkpoint {found}" if found is not None else None

    def _last_size(self) -> int:
        """Bytes of the newest complete checkpoint (from its manifest when it has one), or 0."""
        found = newest_complete(self.root) if self._rank == 0 else None
        if found is None:
            return 0
        try:
            entries = manifest.read(found)
        except manifest.ManifestError:
            entries = None
        if not entries or any(manifest.entry_problem(name, e) for name, e in entries.items()):
            return disk.directory_bytes(found)  # no manifest, or a damaged one: measure the files
        return sum(e["size"] for e in entries.values())

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


def _bytes_written_by(tensors: Any, rank: int) -> int:
    """Bytes this rank's part of the save will take: its shards of sharded tensors (DTensor), and on
    rank 0 the replicated ones (DCP writes a replicated tensor once)."""
    from torch.distributed.tensor import DTensor

    total = 0
    stack = [tensors]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            stack += list(node.values())
        elif isinstance(node, (list, tuple)):
            stack += list(node)
        elif isinstance(node, DTensor):
            local = node.to_local()
            total += local.numel() * local.element_size()
        elif isinstance(node, torch.Tensor) and rank == 0:
            total += node.numel() * node.element_size()
    return total


def _describe_own_files(directory: Path, rank: int) -> dict:
    try:
        return manifest.describe(directory, manifest.files_of_rank(directory, rank))
    except OSError as error:  # every rank must reach the gather, so the failure travels in it
        return {"__error__": f"rank {rank}: {error}"}


def _close_at_exit(ref: "weakref.ref[CheckpointManager]") -> None:
    manager = ref()
    if manager is None:
        return
    try:
        manager.close()
    except Exception:  # noqa: BLE001 - at exit, a report is all that is left to do
        log.exception("a background checkpoint save failed")
