"""Finding and loading checkpoints: `load_checkpoint`, `find_checkpoint`, `latest_complete`.

Loading verifies the checkpoint first (`integrity.py`: manifest sizes and hashes, or the structural
checks for a checkpoint without one) and reads through the pickle-free reader (`safe_reader.py`),
so neither damaged bytes nor code from a file ever reach the process.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import Any, Mapping, MutableMapping

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from ditty.config.errors import RecipeError

from . import integrity
from . import sidecar as sidecar_file
from . import tree as state_tree
from .layout import CHECKPOINTS, MARKER, METADATA, SIDECAR, is_complete, step_dirs, tmp_dirs
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
    if not integrity.is_verified(path):
        problems = integrity.checkpoint_problems(path, group=process_group)
        if problems:
            raise RecipeError.single(
                f"checkpoint {path} is damaged: " + "; ".join(problems),
                key="checkpoint.resume",
                fix="use another checkpoint of the run (checkpoints/step-N), or restore this one from a copy",
            )
    templates = _state_dicts(app_state)
    tensors, _ = state_tree.split(templates)
    try:
        dcp.load(tensors, storage_reader=SafeFileSystemReader(path), process_group=process_group)
    except (Exception, CheckpointException) as error:  # noqa: BLE001 - DCP wraps every rank's failure; say it in a line
        if any(f"{name}.optim." in _condensed(error) for name in app_state):
            raise _optimizer_misfit(path, doc, _condensed(error)) from error
        raise RecipeError.single(
            f"checkpoint {path} could not be loaded into the model the recipe builds: {_condensed(error)}",
            key="checkpoint.resume",
            fix="resume with the recipe the checkpoint was saved with (its recipe.toml), or start a new run.output_dir",
        ) from error

    extras = doc.get("non_tensor_state", {})
    used: set[str] = set()
    for key, value in app_state.items():
        merged = state_tree.merge(templates[key], extras, (key,), used)
        if isinstance(value, Stateful):
            value.load_state_dict(merged)
        elif isinstance(value, MutableMapping):
            value.update(merged)
    # A part the state leaves out on purpose (export loads the model without its optimizer) is no
    # loss; a value missing inside a part that is loaded (a field an optimizer no longer has) is.
    loaded_parts = {
        (name, part) for name, template in templates.items() if isinstance(template, Mapping) for part in template
    }
    unused = [k for k in extras if k not in used and tuple(json.loads(k)[:2]) in loaded_parts]
    if unused:
        log.warning(
            "checkpoint %s holds values the current state has no place for (ignored): %s",
            path,
            ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else ""),
        )
    return doc


def _optimizer_misfit(path: Path, doc: dict, what: str) -> RecipeError:
    """The optimizer's saved state does not fit the optimizer being built (another optimizer.kind
    under checkpoint.force_resume): the model is not the one to blame."""
    import tomllib

    try:
        saved = tomllib.loads(doc.get("recipe_toml") or "").get("optimizer", {}).get("kind", "adamw")
    except tomllib.TOMLDecodeError:
        saved = None
    with_kind = f" (saved with optimizer.kind = {saved!r})" if saved else ""
    return RecipeError.single(
        f"the optimizer state in checkpoint {path}{with_kind} does not fit the optimizer the recipe builds: {what}",
        key="optimizer.kind",
        fix="one optimizer's state cannot be loaded into another kind: resume with the optimizer.kind the "
        "checkpoint was saved with, or start a new run.output_dir from its weights (ditty export, then model.path)",
    )


def _condensed(error: BaseException, limit: int = 400) -> str:
    """One line for a failed load. DCP wraps each rank's exception, traceback text included, in a
    CheckpointException: the line says the exception it wrapped, and names a changed tensor shape."""
    from ditty._utils.errors import causes, one_line

    inner = [c for c in causes(error) if type(c).__name__ != "CheckpointException"] or [error]
    for cause in inner:
        if "size mismatch" in str(cause).lower():
            return one_line(f"shape mismatch: {cause}", limit)
    return one_line(f"{type(inner[0]).__name__}: {inner[0]}", limit)


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
        problems = integrity.checkpoint_problems(path)
        if problems:
            raise RecipeError.single(
                f"checkpoint {path} is damaged: " + "; ".join(problems),
                key=key,
                fix="name another checkpoint of the run, or the run directory to take its newest intact one",
            )
        return path
    for root in (path / CHECKPOINTS, path):
        if root.is_dir() and step_dirs(root):
            found = integrity.find_intact(root, key=key).found
            if found is not None:
                return found
    raise RecipeError.single(
        f"no complete checkpoint at {path}",
        key=key,
        fix="name a run directory, its checkpoints/ directory, or a checkpoints/step-N directory "
        "that holds COMPLETE (an interrupted save leaves none)",
    )


def newest_complete(root: Path) -> Path | None:
    """The newest complete `step-N` under `root`, without verifying it or logging anything."""
    return next((path for _, path in step_dirs(root) if is_complete(path)), None)
