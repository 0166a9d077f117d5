"""`manifest.json`: the size and a fast hash of every file of a checkpoint (or of `final/`).

```
{"format": "ditty-manifest", "version": 1, "hash": "xxh3_64",
 "ranks": {"0": {".metadata": {"size": 44028, "xxh3_64": "9f0c..."}, "__0_0.distcp": {...},
                 "ditty_state.json": {...}},
           "1": {"__1_0.distcp": {...}}}}
```
Each rank describes the files it wrote (DCP names a rank's shards `__RANK_N.distcp`; rank 0 also
owns `.metadata`, the sidecar and any other file), right after writing them, while they are likely
still in the page cache; rank 0 writes the manifest after every other file and before the
`COMPLETE` marker. Loading checks sizes and hashes, so a truncated, deleted or overwritten file is
found before any byte of it reaches a model.

The hash is xxHash's XXH3 (64 bit), through the `xxhash` package (already a dependency of
`datasets`): it runs at memory speed (several GB/s per core), so hashing costs about one extra
read of the checkpoint. It detects accidental damage (disk, network filesystem, a stray write), not
deliberate tampering: a forger can rewrite the manifest too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Mapping, Optional

MANIFEST = "manifest.json"
FORMAT = "ditty-manifest"
VERSION = 1
HASH = "xxh3_64"
CHUNK_BYTES = 4 << 20

# Files a manifest never lists: itself, and the completion marker written after it.
UNLISTED = frozenset({MANIFEST, "COMPLETE"})
_RANK_FILE = re.compile(r"^__(\d+)_\d+")

FileEntry = dict  # {"size": int, "xxh3_64": str}


def hash_file(path: Path) -> FileEntry:
    """Size and XXH3-64 of one file, read in 4 MiB pieces (bounded memory)."""
    import xxhash

    digest = xxhash.xxh3_64()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, HASH: digest.hexdigest()}


def owner_of(name: str) -> int:
    """The rank that writes (and so describes) a file of a checkpoint directory."""
    match = _RANK_FILE.match(name)
    return int(match.group(1)) if match else 0


def files_of_rank(directory: Path, rank: int) -> list[str]:
    """Names (relative, '/'-separated) of the files under `directory` that `rank` describes."""
    names = []
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            name = path.relative_to(directory).as_posix()
            if name not in UNLISTED and not _is_temporary(path.name) and owner_of(path.name) == rank:
                names.append(name)
    return names


def _is_temporary(name: str) -> bool:
    # An atomic writer's temp file (".x.tmp-PID-ID", DCP's ".metadata.tmp") is never part of a save.
    return ".tmp-" in name or name.endswith(".tmp")


def describe(directory: Path, names: Iterable[str]) -> dict[str, FileEntry]:
    return {name: hash_file(directory / name) for name in names}


def write(directory: Path, by_rank: Mapping[int | str, Mapping[str, FileEntry]]) -> None:
    """Write `directory/manifest.json` atomically (temp file, fsync, rename)."""
    from .layout import write_text_atomic

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "hash": HASH,
        "ranks": {
            str(rank): dict(sorted(files.items())) for rank, files in sorted(by_rank.items(), key=lambda x: int(x[0]))
        },
    }
    write_text_atomic(directory / MANIFEST, json.dumps(doc, indent=1) + "\n")


def describe_all(directory: Path) -> None:
    """Write a one-process manifest for every file under `directory` (used for `final/`)."""
    write(directory, {0: describe(directory, _all_files(directory))})


def refresh(directory: Path, names: Iterable[str]) -> None:
    """Re-record `names` in a one-process manifest after ditty itself rewrote them (the model card
    that `ditty eval` updates in final/): the other entries stay as they were verified."""
    entries = read(directory)
    if entries is None:
        return
    write(directory, {0: {**entries, **describe(directory, names)}})


def _all_files(directory: Path) -> list[str]:
    return [
        p.relative_to(directory).as_posix()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).as_posix() not in UNLISTED
    ]


class ManifestError(ValueError):
    """The manifest itself is unreadable (damaged JSON, wrong format)."""


def read(directory: Path) -> Optional[dict[str, FileEntry]]:
    """{file name: entry} over every rank, or None when the directory has no manifest."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ManifestError(f"{MANIFEST} cannot be read ({error})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("ranks"), dict):
        raise ManifestError(f"{MANIFEST} is not a ditty manifest")
    if doc.get("version") != VERSION or doc.get("hash") != HASH:
        raise ManifestError(
            f"{MANIFEST} has version {doc.get('version')} / hash {doc.get('hash')}; this ditty reads {VERSION} / {HASH}"
        )
    entries: dict[str, FileEntry] = {}
    for files in doc["ranks"].values():
        if not isinstance(files, dict):
            raise ManifestError(f"{MANIFEST} is not a ditty manifest")
        entries.update(files)
    return entries


def entry_problem(name: str, entry: object) -> Optional[str]:
    """Why one manifest entry cannot be checked (None when it can): a file name that leaves the
    directory, an entry that is not an object, or one without a whole-number size and a hash."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        return f"{MANIFEST} lists {name!r}, which is not a file of this directory"
    if not isinstance(entry, dict):
        return f"{name}: its {MANIFEST} entry is not an object ({type(entry).__name__})"
    size, digest = entry.get("size"), entry.get(HASH)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{name}: its {MANIFEST} entry has no size"
    if not isinstance(digest, str) or not digest:
        return f"{name}: its {MANIFEST} entry has no {HASH} hash"
    return None


def check_files(directory: Path, entries: Mapping[str, FileEntry], names: Iterable[str]) -> list[str]:
    """What is wrong with `names` (a subset of `entries`) under `directory`: one line per bad file.

    Sizes are compared first (a stat), so a truncated or deleted file costs no read.
    """
    problems = []
    for name in names:
        expected = entries[name]
        damage = entry_problem(name, expected)
        if damage:  # a damaged manifest damages the checkpoint it describes: the caller falls back
            problems.append(damage)
            continue
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: missing (the manifest lists {expected['size']} bytes)")
            continue
        except OSError as error:
            problems.append(f"{name}: cannot be read ({error.strerror})")
            continue
        if size != expected["size"]:
            what = "truncated" if size < expected["size"] else "longer than written"
            problems.append(f"{name}: {size} bytes, the manifest says {expected['size']} ({what})")
            continue
        try:
            actual = hash_file(path)
        except OSError as error:
            problems.append(f"{name}: cannot be read ({error.strerror})")
            continue
        if actual[HASH] != expected[HASH]:
            problems.append(
                f"{name}: its content changed after it was saved (hash {actual[HASH]}, written as {expected[HASH]})"
            )
    return problems


def verify(directory: Path, *, rank: int = 0, world_size: int = 1) -> Optional[list[str]]:
    """Check this rank's share of the files a manifest lists (every file when alone).

    Returns None when there is no manifest, else the problems found (empty when intact). Ranks take
    every `world_size`-th file of the sorted list, so together they read each file once.
    """
    entries = read(directory)
    if entries is None:
        return None
    names = sorted(entries)[rank::world_size]
    return check_files(directory, entries, names)
