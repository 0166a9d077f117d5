"""What to do with bad rows (`data.on_bad_rows`): find them all, report them, or train without them.

`scan_file` runs a file through `ditty.data.rows` and counts its good rows and bad ones (the first
few kept for the message). "error" (the default) makes the bad rows a RecipeError that lists them
by file:line with their reasons (exit code 2). "skip" writes a copy of the file without them into
the datasets cache (`write_clean_copy`, once per version of the file) and loads that instead; their
count reaches metrics.jsonl and the run summary as `skipped_rows`. `check_table` does the same for
data that arrives already parsed (parquet, hub datasets), by row index.

Cost: one pass of `json.loads` (or the csv module) over each file per run, on top of the load;
the clean copy, only when there are bad rows to skip, costs one more pass and the file's size on disk.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ditty.config.errors import RecipeError
from ditty.data.row_files import rows_of
from ditty.data.rows import DEFAULT_MAX_ROW_BYTES, BadRow, Checks, RowCheck, as_check, row_problem

MAX_LISTED = 10
"""Bad rows listed in an error message; the rest are counted."""


@dataclass
class RowReport:
    """What a scan found: the good rows' count, the first bad rows, the bad rows' count."""

    rows: int = 0
    bad_count: int = 0
    bad: list[BadRow] = field(default_factory=list)

    def add_bad(self, bad: BadRow) -> None:
        self.bad_count += 1
        if len(self.bad) < MAX_LISTED:
            self.bad.append(bad)

    def merge(self, other: "RowReport") -> None:
        self.rows += other.rows
        self.bad += other.bad[: MAX_LISTED - len(self.bad)]
        self.bad_count += other.bad_count


def scan_file(path: str | os.PathLike, fields: Checks, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> RowReport:
    """Count the good rows of one file and collect its bad ones (bounded memory)."""
    report = RowReport()
    missing_by_field: dict[str, int] = {}
    check = as_check(fields)
    # A format's own rule may say "no column" in its words (chat: neither layout's column).
    missing = {f"{name!r} is missing": name for name in check.fields}
    if getattr(check.row, "missing_reason", None):
        missing[check.row.missing_reason] = "the format's column"
    for _, bad, _ in rows_of(path, fields, max_row_bytes=max_row_bytes):
        if bad is None:
            report.rows += 1
            continue
        if bad.reason in missing:
            name = missing[bad.reason]
            missing_by_field[name] = missing_by_field.get(name, 0) + 1
        report.add_bad(bad)
    # A field missing from every row is a wrong column name, not bad rows: the loader's column
    # check says that better (it lists the columns found).
    if report.rows == 0 and missing_by_field and sum(missing_by_field.values()) == report.bad_count:
        return RowReport(rows=report.bad_count)
    return report


SKIP_FIX = (
    'correct or remove those rows, or set data.on_bad_rows = "skip" to train without them '
    "(they are counted as skipped_rows in metrics.jsonl)"
)


def raise_for_bad_rows(report: RowReport, *, key: str, what: str, fix: str = SKIP_FIX) -> None:
    """RecipeError listing the bad rows of `what` (a file or pattern), or nothing when there are none."""
    if not report.bad_count:
        return
    listed = "\n      ".join(f"{bad.where()}: {bad.reason}" for bad in report.bad)
    more = f"\n      ... and {report.bad_count - len(report.bad)} more" if report.bad_count > len(report.bad) else ""
    raise RecipeError.single(
        f"{report.bad_count} bad row{'s' if report.bad_count != 1 else ''} in {what} "
        f'(data.on_bad_rows = "error"):\n      {listed}{more}',
        key=key,
        fix=fix,
    )


def write_clean_copy(path: str | os.PathLike, fields: Checks, *, max_row_bytes: int, cache_dir: Optional[str]) -> str:
    """A copy of `path` without its bad rows, under the datasets cache; returns its path.

    Named by the source's path, size and modification time and by the settings, so an unchanged
    file is cleaned once and `datasets` caches the copy's Arrow files like any other file.
    """
    path = Path(path)
    stat = path.stat()
    key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, _check_key(fields), max_row_bytes])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = Path(cache_dir) if cache_dir else Path(_datasets_cache())
    out_dir = base / "ditty-clean-rows" / digest
    suffix = (
        ".csv" if path.suffix.lower() == ".csv" else ".txt" if path.suffix.lower() in (".txt", ".text") else ".jsonl"
    )
    out = out_dir / (path.stem + suffix)
    if out.is_file():
        return str(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    if suffix == ".csv":
        with open(partial, "w", encoding="utf-8", newline="") as handle:
            writer: Any = None
            for row, bad, _ in rows_of(path, fields, max_row_bytes=max_row_bytes):
                if bad is None:
                    if writer is None:
                        writer = csv.DictWriter(handle, fieldnames=list(row))
                        writer.writeheader()
                    writer.writerow(row)
    else:
        with open(partial, "wb") as handle:
            for row, bad, raw in rows_of(path, fields, max_row_bytes=max_row_bytes):
                if bad is None:
                    handle.write(
                        (json.dumps(row, ensure_ascii=False).encode("utf-8") if suffix == ".jsonl" else raw) + b"\n"
                    )
    os.replace(partial, out)
    return str(out)


def _check_key(fields: Checks) -> list:
    """What the clean copy depends on: the checked fields and the format's own rule."""
    check = as_check(fields)
    rule = check.row
    # A rule object (the chat layouts) stands for itself by its repr; a function, by its name.
    return [dict(check.fields), getattr(rule, "__qualname__", None) or (repr(rule) if rule is not None else None)]


def _datasets_cache() -> str:
    import datasets

    return str(datasets.config.HF_DATASETS_CACHE)


# ---------------------------------------------------------------------------- loaded tables


def check_table(dataset: Any, fields: Checks, *, label: str) -> tuple[RowReport, list[int]]:
    """Bad rows of an already loaded dataset (parquet, a hub dataset): null, missing or wrongly
    typed required fields, by row index. Returns the report and the indices of the good rows.
    Columns the data lacks altogether are left to the loader's column check."""
    check = as_check(fields)
    present = [name for name in check.fields if name in dataset.column_names]
    report = RowReport()
    good = []
    everything = RowReport(rows=len(dataset)), list(range(len(dataset)))
    if not present and (check.fields or check.row is None):
        return everything
    whole = check.row if len(present) == len(check.fields) else None  # the format's rule reads every field
    # A rule without named fields (chat: its layout is told from the row's keys) reads the whole row.
    read = present + [name for name in check.optional if name in dataset.column_names and name not in present]
    columns = dataset.select_columns(read) if check.fields else dataset
    missing, without_column = getattr(check.row, "missing_reason", None), 0
    for index, row in enumerate(_rows(columns)):
        problem = row_problem(row, RowCheck({name: check.fields[name] for name in present}, whole))
        if problem:
            report.add_bad(BadRow(label, None, problem, row=index))
            without_column += problem == missing
        else:
            good.append(index)
    if without_column == len(dataset):
        return everything  # no row has the format's column: the loader's column check names it better
    report.rows = len(good)
    return report, good


def _rows(dataset: Any) -> Iterator[dict]:
    for batch in dataset.iter(batch_size=1000):
        names = list(batch)
        for values in zip(*(batch[name] for name in names)):
            yield dict(zip(names, values))
