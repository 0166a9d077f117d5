"""Is a checkpoint intact? And which is the newest intact checkpoint of a run?

A checkpoint is intact when it is complete (`layout.is_complete`), every file its `manifest.json`
lists has the size and hash it was written with, DCP's `.metadata` reads through the safe
unpickler, and the sidecar parses and holds the fields the caller needs. A checkpoint written
before manifests existed gets the checks that need no manifest: every file `.metadata` points into
exists and is long enough (that finds deleted and truncated shards, not overwritten bytes).

Cost: verification reads every byte of the checkpoint once. Under a process group each rank reads
its share of the files (every world_size-th), and the ranks then agree on the verdict with one
small all-gather, so every rank makes the same choice. A checkpoint verified once in a process is
not read again when it is loaded.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ditty.config.errors import RecipeError

from . import manifest
from .layout import MARKER, METADATA, SIDECAR, is_complete, step_dirs, tmp_dirs

log = logging.getLogger(__name__)

_verified: set[tuple[str, int, int]] = set()
"""(resolved path, manifest mtime_ns, manifest size) of checkpoints this process found intact."""


def _verified_key(path: Path) -> Optional[tuple[str, int, int]]:
    try:
        stat = (path / manifest.MANIFEST).stat()
    except OSError:
        return None
    return (str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def is_verified(path: Path) -> bool:
    """Whether `path` was just found intact by this process; a one-time pass (the next call is
    False again), so a checkpoint damaged after its check is caught at its next load."""
    key = _verified_key(path)
    if key is None or key not in _verified:
        return False
    _verified.discard(key)
    return True


def _group_info(group) -> tuple[int, int, object]:
    """(rank, world size, group) of `group`, or of the default process group when there is one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1, None
    return dist.get_rank(group), dist.get_world_size(group), group if group is not None else dist.group.WORLD


def _agree(problems: list[str], group) -> list[str]:
    """Every rank's problems, merged in rank order (a collective when there is a group)."""
    from . import comm

    if group is None:
        return problems
    merged: list[str] = []
    for part in comm.all_gather_json(problems, group):
        merged += [p for p in part if p not in merged]
    return merged


def structural_problems(path: Path) -> list[str]:
    """Checks that need no manifest: each file `.metadata` points into exists and reaches the last
    byte it is read at."""
    from .safe_reader import read_tensor_metadata

    needed: dict[str, int] = {}
    for info in read_tensor_metadata(path / METADATA).storage_data.values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    problems = []
    for name, end in sorted(needed.items()):
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: missing (.metadata reads {end} bytes from it)")
            continue
        if size < end:
            problems.append(f"{name}: {size} bytes, but .metadata reads up to byte {end} (truncated)")
    return problems


def checkpoint_problems(path: Path, *, required_fields: Iterable[str] = (), group=None) -> list[str]:
    """What is wrong with the complete checkpoint at `path` (empty when intact). Collective under a
    process group (`group`, else the default one when initialised)."""
    from . import sidecar as sidecar_file
    from .safe_reader import read_tensor_metadata

    rank, world, group = _group_info(group)
    problems: list[str] = []
    has_manifest = False
    try:
        found = manifest.verify(path, rank=rank, world_size=world)
        has_manifest = found is not None
        problems += found or []
    except manifest.ManifestError as error:
        problems.append(str(error))
    problems = _agree(problems, group)
    if problems:
        return problems
    try:
        read_tensor_metadata(path / METADATA)
        if not has_manifest:
            problems += structural_problems(path)
    except (pickle.UnpicklingError, ValueError, EOFError, OSError) as error:
        problems.append(f"{METADATA}: cannot be read ({type(error).__name__}: {error})")
    try:
        doc = sidecar_file.read(path)
    except RecipeError as error:
        problems.append(f"{SIDECAR}: {error.problems[0].message}")
    else:
        missing = [name for name in required_fields if name not in doc]
        if missing:
            problems.append(f"{SIDECAR}: has no {', '.join(repr(m) for m in missing)}")
    problems = _agree(problems, group)
    if not problems:
        key = _verified_key(path)
        if key is not None:
            _verified.add(key)
        elif rank == 0:
            log.warning(
                "checkpoint %s has no %s (written by an older ditty): its files' sizes were checked, "
                "not their contents",
                path,
                manifest.MANIFEST,
            )
    return problems


@dataclass
class Search:
    """The outcome of `find_intact`: the checkpoint to use, and the ones passed over with why."""

    found: Optional[Path] = None
    damaged: list[tuple[Path, list[str]]] = field(default_factory=list)
    incomplete: list[tuple[Path, list[str]]] = field(default_factory=list)

    def report(self) -> str:
        """One line per checkpoint passed over, for the log."""
        lines = []
        for path, why in self.incomplete:
            lines.append(f"skipped {path.name}: incomplete (missing {', '.join(why)})")
        for path, why in self.damaged:
            lines.append(f"skipped {path.name}: damaged: " + "; ".join(why))
        return "\n".join(lines)


def _missing(path: Path) -> list[str]:
    return [n for n in (METADATA, SIDECAR, MARKER) if not (path / n).is_file()]


def find_intact(
    root: Path,
    *,
    required_fields: Iterable[str] = (),
    fallback: bool = True,
    in_flight: Optional[int] = None,
    key: str = "checkpoint.resume",
    group=None,
) -> Search:
    """The newest intact `step-N` under `root` (a `checkpoints/` directory).

    Incomplete directories (a save that died before its commit) are passed over as before. A
    complete one that fails verification is passed over when `fallback`, else it is a RecipeError
    naming the file. When checkpoints exist but none is intact, that is a RecipeError as well: the
    run would otherwise silently start again from step 0. Collective under a process group.
    """
    required_fields = tuple(required_fields)
    rank = _group_info(group)[0]
    search = Search()
    for _, path in step_dirs(root):
        if not is_complete(path):
            search.incomplete.append((path, _missing(path)))
            continue
        problems = checkpoint_problems(path, required_fields=required_fields, group=group)
        if not problems:
            search.found = path
            break
        if not fallback:
            raise RecipeError.single(
                f"checkpoint {path} is damaged: " + "; ".join(problems),
                key="checkpoint.fallback",
                fix="set checkpoint.fallback = true to resume from the newest intact checkpoint instead, or move "
                f"{path.name} out of {root} (keep it if you want to inspect it)",
            )
        search.damaged.append((path, problems))
        if rank == 0:
            log.warning("checkpoint %s is damaged, falling back to an older one: %s", path, "; ".join(problems))
    if search.found is not None and rank == 0:
        for t_step, t_path in tmp_dirs(root):
            if t_step > step_of_found(search.found) and t_step != in_flight:
                log.warning("ignoring %s: the save of step %d did not finish", t_path.name, t_step)
        for path, missing in search.incomplete:
            log.warning("skipping incomplete checkpoint %s (missing %s)", path, ", ".join(missing))
    if search.found is None and search.damaged:
        listed = "\n    ".join(f"{p.name}: " + "; ".join(why) for p, why in search.damaged)
        raise RecipeError.single(
            f"no intact checkpoint is left in {root}:\n    {listed}",
            key=key,
            fix=f"move the damaged checkpoints out of {root} to start again from step 0 (or restore them from a "
            "copy), or choose a new run.output_dir",
        )
    return search


def step_of_found(path: Path) -> int:
    from .layout import step_of

    return step_of(path) or 0


def check_model_dir(path: str | Path) -> None:
    """RecipeError when a saved model directory (`final/`, written with a manifest) is damaged.

    A directory without a manifest (written by an older ditty, or by hand) is not checked."""
    path = Path(path)
    try:
        problems = manifest.verify(path)
    except manifest.ManifestError as error:
        problems = [str(error)]
    unreadable = [p for p in problems or [] if "(Permission denied)" in p]  # None: no manifest to verify
    if unreadable:  # another user's files: intact, but not theirs to read
        raise RecipeError.single(
            f"{path} cannot be read by this user: " + "; ".join(unreadable),
            fix=f"ask the owner of {path} to make its files readable (chmod a+r {path}/*), or work from a copy",
        )
    if problems:
        run_dir = path.parent if path.name == "final" else path
        raise RecipeError.single(
            f"{path} is damaged: " + "; ".join(problems),
            fix=f"write it again from the run's last checkpoint: ditty export {run_dir} -o NEW_DIR "
            "(or rerun the recipe: it resumes at the last step and writes final/ again once this one is moved away)",
        )
