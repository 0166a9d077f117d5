"""What a data file holds, in a few bytes: the key of the tokenisation cache and the check a resume makes.

`datasets` keys its cache of a local file on the file's path and modification time, so a file
rewritten with other rows but the same size and time (a copy with `cp -p`, `rsync -t`, a restore)
reused the old rows and tokens. ditty adds a fingerprint of the content to that key, and a
checkpoint records each data file's fingerprint so a resume on changed data is refused.

The fingerprint (`file_fingerprint`):
- a file up to `WHOLE_FILE_LIMIT` (1 GiB): XXH3-64 of its whole content, "xxh3:HEX" (it is read
  anyway: every row is checked before it is loaded; XXH3 hashes several GB/s);
- a larger file: "sampled-xxh3:SIZE:MTIME_NS:HEX", XXH3-64 of `SAMPLES` blocks of `BLOCK` bytes at
  evenly spaced offsets (the first and last included) with the size and modification time. An
  edit that keeps size and time and falls between the blocks goes unseen; reading a terabyte
  corpus whole at every start is the cost this avoids.
A fingerprint is computed once per process for a file of the same inode, size and times (its
change time included, which every write moves and `touch` cannot set back).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Iterable

import xxhash

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig

WHOLE_FILE_LIMIT = 1 << 30
SAMPLES = 64
BLOCK = 1 << 16
_CHUNK = 1 << 22

_known: dict[tuple, str] = {}


def file_fingerprint(path: str) -> str:
    """The fingerprint of one file (see the module docstring for which kind)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _known:
        digest = xxhash.xxh3_64()
        with open(path, "rb") as handle:
            if stat.st_size <= WHOLE_FILE_LIMIT:
                for chunk in iter(lambda: handle.read(_CHUNK), b""):
                    digest.update(chunk)
                _known[key] = f"xxh3:{digest.hexdigest()}"
            else:
                last = stat.st_size - BLOCK
                for index in range(SAMPLES):
                    handle.seek(last * index // (SAMPLES - 1))
                    digest.update(handle.read(BLOCK))
                _known[key] = f"sampled-xxh3:{stat.st_size}:{stat.st_mtime_ns}:{digest.hexdigest()}"
    return _known[key]


def files_fingerprint(files: Iterable[str]) -> str:
    """One fingerprint for a list of files, their order included (16 hex digits)."""
    digest = xxhash.xxh3_64()
    for path in files:
        digest.update(f"{path}\0{file_fingerprint(path)}\0".encode())
    return digest.hexdigest()


def recipe_data_files(data: "DataConfig") -> list[str]:
    """The local files a [data] section trains and validates on (its paths and globs, expanded)."""
    patterns: list[str] = []
    if data.source == "file":
        patterns += [data.path or "", data.val_path or ""]
    for source in data.sources:
        if source.source == "file":
            patterns += [source.path or "", source.val_path or ""]
    files: list[str] = []
    for pattern in patterns:
        if pattern:
            files += sorted(glob.glob(os.path.expanduser(pattern)))
    return [f for f in dict.fromkeys(files) if os.path.isfile(f)]


def data_fingerprints(data: "DataConfig") -> dict[str, str]:
    """{file: fingerprint} for every local file of the recipe's data: what a checkpoint records."""
    return {path: file_fingerprint(path) for path in recipe_data_files(data)}


def changed_files(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """The files recorded in `saved` whose fingerprint differs now, or that are gone, as
    "PATH (why)" lines. A file the recipe no longer names is a recipe change, reported elsewhere."""
    lines = []
    for path, before in sorted(saved.items()):
        if path not in current:
            if not os.path.exists(path):
                lines.append(f"{path} (no longer there)")
            continue
        if current[path] != before:
            lines.append(f"{path} (its content changed: {before} -> {current[path]})")
    return lines
