"""Where raw rows come from: local files or a hub dataset, loaded through Hugging Face `datasets`.

`datasets` writes each source to Arrow files once and memory-maps them, so files larger than memory
are read in pieces and never held whole; everything downstream indexes the mapped table. Before
that, every row is checked (`ditty.data.rows`, `ditty.data.bad_rows`): a bad row is an error naming
its file and line, or, with `data.on_bad_rows = "skip"`, left out and counted.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ditty._utils.errors import condensed
from ditty.config.errors import Problem, RecipeError
from ditty.data.bad_rows import RowReport, check_table, raise_for_bad_rows, scan_file, write_clean_copy
from ditty.data.fingerprint import files_fingerprint
from ditty.data.row_files import good_json_rows, is_json_lines
from ditty.data.rows import DEFAULT_MAX_ROW_BYTES, Checks

log = logging.getLogger(__name__)

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


def load_file_dataset(pattern: Optional[str], **options: Any) -> "Dataset":
    """All rows of the files matching `pattern` (a path or a glob), in sorted file order; the
    options and checks are `load_checked_files`'s."""
    return load_checked_files(pattern, **options)[0]


def load_checked_files(
    pattern: Optional[str],
    *,
    key: str,
    cache_dir: Optional[str],
    fields: Optional[Checks] = None,
    on_bad_rows: str = "error",
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    streaming: bool = False,
    reader_options: Optional[dict[str, dict]] = None,
) -> tuple["Dataset", int]:
    """All rows of the files matching `pattern` (a path or a glob), in sorted file order, and the
    number of bad rows left out.

    `key` is the recipe key that named the files ("data.path" or "data.val_path"). `fields`
    (the format's `RowCheck`, ditty.data.formats) are checked in every row;
    bad rows are an error, or left out with `on_bad_rows = "skip"`. `streaming`: an
    `IterableDataset` that reads the files lazily (one shard per file) instead; its rows are not
    scanned ahead (that would read the whole corpus first). `reader_options`: {builder ("json",
    "text", ...): its extra `load_dataset` options}.
    """
    problems = file_set_problems(pattern, key)
    if problems:
        raise RecipeError(problems[:1])
    files = sorted(glob.glob(os.path.expanduser(pattern)))
    builders = {FILE_BUILDERS[_suffix(file)] for file in files}
    suffixes = {_suffix(file) for file in files}
    fields = fields or {}
    skipped = 0
    if not streaming:
        files, skipped = _checked_files(files, pattern, key, fields, on_bad_rows, max_row_bytes, cache_dir)
    elif on_bad_rows == "skip" and all(is_json_lines(file) for file in files):
        return _streamed_good_json_rows(files, max_row_bytes), 0

    from datasets import load_dataset

    try:
        builder = builders.pop()
        options = dict((reader_options or {}).get(builder, {}))
        if builder == "csv":  # pandas would read the cells "None", "NA", "null", "nan" as missing: empty text
            options.setdefault("keep_default_na", False)
        if builder == "text":  # a byte-order mark would start the first sample as U+FEFF
            options.setdefault("encoding", "utf-8-sig")
        if not streaming:
            # `datasets` keys its cache on each file's path and modification time only; the content's
            # fingerprint in the config name makes a file rewritten with other rows a cache miss.
            options.setdefault("name", f"ditty-{files_fingerprint(files)}")
        dataset = load_dataset(
            builder, data_files=files, split="train", cache_dir=cache_dir, streaming=streaming, **options
        )
    except Exception as error:  # noqa: BLE001 - any failure to parse a user's file is the user's to fix
        raise RecipeError.single(
            f"cannot read {pattern!r}: {condensed(error)}",
            key=key,
            fix="check that the file is valid and not empty",
        ) from error
    if suffixes == {".parquet"} and not streaming:
        dataset, skipped = checked_table(dataset, fields, pattern, key, on_bad_rows)
    return dataset, skipped


def file_set_problems(pattern: Optional[str], key: str) -> list[Problem]:
    """What makes the files `pattern` names unreadable before a row is read: no file, a suffix no
    reader takes, one that cannot be opened, an empty one (the readers fail on it with a bare
    StopIteration), or formats mixed. Cheap (a glob and a stat a file): `ditty check` asks too."""
    if not pattern:
        return [Problem(key, "no data file given", fix="set it to a .jsonl/.json/.csv/.parquet/.txt file or glob")]
    files = sorted(glob.glob(os.path.expanduser(pattern)))
    if not files:
        return [Problem(key, f"no file matches {pattern!r}", fix="check the path (globs like data/*.jsonl work)")]
    suffixes = {_suffix(file) for file in files}
    unknown = suffixes - FILE_BUILDERS.keys()
    if unknown:
        return [
            Problem(
                key,
                f"cannot read files ending in {', '.join(sorted(unknown))}",
                fix=f"use one of {', '.join(FILE_BUILDERS)}",
            )
        ]
    for file in files:
        try:
            os.stat(file)  # a symlink loop (ELOOP), a dangling link, a file without read permission
            with open(file, "rb"):
                pass
        except OSError as error:
            fix = "point it at a readable file (`ls -lL` shows where a link leads)"
            return [Problem(key, f"cannot read the data file {file!r}: {error.strerror}", fix=fix)]
    empty = [file for file in files if os.path.getsize(file) == 0]
    if empty:
        return [Problem(key, f"the data file {empty[0]!r} is empty", fix="point it at data with at least one sample")]
    if len({FILE_BUILDERS[suffix] for suffix in suffixes}) > 1:
        return [
            Problem(
                key,
                f"the files matching {pattern!r} mix formats ({', '.join(sorted(suffixes))})",
                fix="point it at files of one format",
            )
        ]
    return []


def _checked_files(
    files: list[str],
    pattern: str,
    key: str,
    fields: Checks,
    on_bad_rows: str,
    max_row_bytes: int,
    cache_dir: Optional[str],
) -> tuple[list[str], int]:
    """Scan each line-based file; error on bad rows, or swap in a copy without them ("skip")."""
    reports = {
        file: scan_file(file, fields, max_row_bytes=max_row_bytes) for file in files if _suffix(file) != ".parquet"
    }
    total = RowReport()
    for report in reports.values():
        total.merge(report)
    if not total.bad_count:
        return files, 0
    _skip_or_refuse(total, left=total.rows, label=pattern, key=key, on_bad_rows=on_bad_rows)
    cleaned = [
        write_clean_copy(file, fields, max_row_bytes=max_row_bytes, cache_dir=cache_dir)
        if file in reports and reports[file].bad_count
        else file
        for file in files
    ]
    return cleaned, total.bad_count


def checked_table(dataset: "Dataset", fields: Checks, label: str, key: str, on_bad_rows: str) -> tuple["Dataset", int]:
    """Rows of data that arrives parsed (parquet, hub), checked by row index."""
    report, good = check_table(dataset, fields, label=label)
    if not report.bad_count:
        return dataset, 0
    _skip_or_refuse(report, left=len(good), label=label, key=key, on_bad_rows=on_bad_rows)
    return dataset.select(good), report.bad_count


def _skip_or_refuse(report: RowReport, *, left: int, label: str, key: str, on_bad_rows: str) -> None:
    """Bad rows are an error naming them, unless `data.on_bad_rows = "skip"`: then they are left out
    (logged), unless no row is `left`."""
    if on_bad_rows != "skip":
        raise_for_bad_rows(report, key=key, what=label)
    first = report.bad[0]
    if left == 0:
        raise RecipeError.single(
            f"every row of {label} is bad ({report.bad_count}; the first, {first.where()}: {first.reason})",
            key=key,
            fix="check that the data.format and its column settings match the data",
        )
    log.warning(
        'skipping %d bad rows of %s (data.on_bad_rows = "skip"); the first: %s: %s',
        report.bad_count,
        label,
        first.where(),
        first.reason,
    )


def load_hub_dataset(name: str, *, split: str, cache_dir: Optional[str], streaming: bool = False) -> "Dataset":
    """A split of a Hugging Face hub dataset (from the local cache when offline, if it is there);
    `streaming`: an `IterableDataset` read lazily from the hub (its rows are not checked ahead)."""
    if streaming:
        return _load_hub(name, split=split, cache_dir=cache_dir, streaming=True)
    return load_checked_hub_dataset(name, split=split, cache_dir=cache_dir)[0]


def load_checked_hub_dataset(
    name: str,
    *,
    split: str,
    cache_dir: Optional[str],
    fields: Optional[Checks] = None,
    on_bad_rows: str = "error",
) -> tuple["Dataset", int]:
    """`load_hub_dataset` with its rows checked (`fields`), and the number of bad rows left out."""
    dataset = _load_hub(name, split=split, cache_dir=cache_dir)
    return checked_table(dataset, fields or {}, name, "data.name", on_bad_rows)


def _load_hub(name: str, *, split: str, cache_dir: Optional[str], streaming: bool = False) -> "Dataset":
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
            f"cannot load hub dataset {name!r} (split {split!r}): {condensed(error)}", key="data.name", fix=fix
        ) from error


def _streamed_good_json_rows(files: list[str], max_row_bytes: int) -> Any:
    """JSON lines read by ditty's own line reader, lazily (one shard per file), leaving out lines
    that do not parse. `datasets`' JSON reader parses a whole chunk at once and stops at a
    malformed line, which `data.on_bad_rows = "skip"` asks to leave out, as the up-front check of
    the whole-file path does. The readers check the rows' fields and skip those as well."""
    from datasets import IterableDataset

    return IterableDataset.from_generator(good_json_rows, gen_kwargs={"paths": files, "max_row_bytes": max_row_bytes})


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()
