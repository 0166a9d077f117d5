"""Where raw rows come from: local files or a hub dataset, loaded through Hugging Face `datasets`.

`datasets` writes each source to Arrow files once and memory-maps them, so files larger than memory
are read in pieces and never held whole; everything downstream indexes the mapped table.
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import TYPE_CHECKING, Iterator, Optional

from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    from datasets import Dataset


@contextlib.contextmanager
def progress_bars_on_main_rank() -> Iterator[None]:
    """`datasets`' progress bars (loading, "tokenizing", map and filter) on rank 0 only.

    Every rank loads and tokenizes the same data; N copies of each bar interleave into noise. On
    the other ranks the bars are off for the duration and back on after (unless already off).
    """
    import datasets

    from ditty._utils.dist import is_main_process

    if is_main_process() or datasets.are_progress_bars_disabled():
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()


# File suffix -> the `datasets` packaged builder that reads it.
FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
}


def load_file_dataset(
    pattern: Optional[str],
    *,
    key: str,
    cache_dir: Optional[str],
    streaming: bool = False,
    reader_options: Optional[dict[str, dict]] = None,
) -> "Dataset":
    """All rows of the files matching `pattern` (a path or a glob), in sorted file order.

    `key` is the recipe key that named the files ("data.path" or "data.val_path"). `streaming`:
    an `IterableDataset` that reads the files lazily (one shard per file) instead.
    `reader_options`: {builder ("json", "text", ...): its extra `load_dataset` options}.
    """
    if not pattern:
        raise RecipeError.single(
            "no data file given", key=key, fix="set it to a .jsonl/.json/.csv/.parquet/.txt file or glob"
        )
    files = sorted(glob.glob(os.path.expanduser(pattern)))
    if not files:
        raise RecipeError.single(
            f"no file matches {pattern!r}", key=key, fix="check the path (globs like data/*.jsonl work)"
        )
    suffixes = {_suffix(file) for file in files}
    unknown = suffixes - FILE_BUILDERS.keys()
    if unknown:
        raise RecipeError.single(
            f"cannot read files ending in {', '.join(sorted(unknown))}",
            key=key,
            fix=f"use one of {', '.join(FILE_BUILDERS)}",
        )
    empty = [file for file in files if os.path.getsize(file) == 0]
    if empty:
        # Caught here because the readers fail on an empty file with a bare StopIteration.
        raise RecipeError.single(
            f"the data file {empty[0]!r} is empty", key=key, fix="point it at data with at least one sample"
        )
    builders = {FILE_BUILDERS[suffix] for suffix in suffixes}
    if len(builders) > 1:
        raise RecipeError.single(
            f"the files matching {pattern!r} mix formats ({', '.join(sorted(suffixes))})",
            key=key,
            fix="point it at files of one format",
        )

    from datasets import load_dataset

    try:
        builder = builders.pop()
        options = (reader_options or {}).get(builder, {})
        return load_dataset(
            builder, data_files=files, split="train", cache_dir=cache_dir, streaming=streaming, **options
        )
    except Exception as error:  # noqa: BLE001 - any failure to parse a user's file is the user's to fix
        raise RecipeError.single(
            f"cannot read {pattern!r}: {_condensed(error)}",
            key=key,
            fix="check that the file is valid and not empty",
        ) from error


def load_hub_dataset(name: str, *, split: str, cache_dir: Optional[str], streaming: bool = False) -> "Dataset":
    """A split of a Hugging Face hub dataset (from the local cache when offline, if it is there);
    `streaming`: an `IterableDataset` read lazily from the hub."""
    from datasets import load_dataset

    try:
        return load_dataset(name, split=split, cache_dir=cache_dir, streaming=streaming)
    except Exception as error:  # noqa: BLE001 - unknown id, missing split and no network all end here
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        fix = (
            "offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE): download the dataset first "
            'or export it to a file and use data.source = "file"'
            if offline
            else "check the dataset id, data.split, and the network"
        )
        raise RecipeError.single(
            f"cannot load hub dataset {name!r} (split {split!r}): {_condensed(error)}", key="data.name", fix=fix
        ) from error


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _condensed(error: Exception, limit: int = 300) -> str:
    """An exception's message on one line, cut to `limit` characters (library messages run long)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
