"""Reading data files row by row, in bounded memory: `rows_of(path, fields)` reads a
.jsonl/.json/.csv/.txt file itself and yields each row with its problem, if any (the checks are
ditty.data.rows):

- lines are read in pieces of at most `data.max_row_bytes` (a longer line is a bad row, and the
  rest of it is skipped without being held);
- each line must be UTF-8; in JSON lines (and .json files that are not one array) each line must
  be one JSON object, and a blank line is a bad row (blank lines at the very end are fine).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional

from ditty.data.rows import (
    DEFAULT_MAX_ROW_BYTES,
    BadRow,
    Checks,
    _a,
    _json_type,
    as_check,
    row_problem,
)

log = logging.getLogger("ditty.data")

# ---------------------------------------------------------------------------- reading lines

READ_CHUNK = 1 << 20
BOM = b"\xef\xbb\xbf"


def read_lines(handle: io.BufferedReader, max_row_bytes: int) -> Iterator[tuple[int, Optional[bytes], int]]:
    """(line number, the line's bytes without its newline or None when too long, its length).

    Never holds more than `max_row_bytes` + 1 bytes of one line: the rest of a longer line is read
    in 1 MiB pieces and dropped.
    """
    number = 0
    while True:
        line = handle.readline(max_row_bytes + 1)
        if not line:
            return
        number += 1
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        if line.endswith(b"\n"):
            yield number, line[:-1].rstrip(b"\r"), len(line) - 1
            continue
        if len(line) <= max_row_bytes:  # the last line, without a newline
            yield number, line.rstrip(b"\r"), len(line)
            continue
        length = len(line)
        while True:
            rest = handle.readline(READ_CHUNK)
            if not rest:
                break
            length += len(rest)
            if rest.endswith(b"\n"):
                length -= 1
                break
        yield number, None, length


def _decode(raw: bytes) -> tuple[Optional[str], Optional[str]]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as error:
        return None, f"bad encoding: byte 0x{raw[error.start]:02x} at column {error.start + 1} is not UTF-8"


def _too_long(length: int, max_row_bytes: int) -> str:
    return f"the line is {length} bytes, longer than data.max_row_bytes = {max_row_bytes}"


# ---------------------------------------------------------------------------- per format


def _json_rows(
    path: Path, label: str, fields: Checks, max_row_bytes: int
) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    """(row, problem, raw line) for every line of a JSON lines file (blank lines at the end excluded)."""
    seen = _Fields(fields)
    blank_run: list[int] = []
    with open(path, "rb") as handle:
        for number, raw, length in read_lines(handle, max_row_bytes):
            if raw is None:
                yield from _flush_blank(blank_run, label)
                yield None, BadRow(label, number, _too_long(length, max_row_bytes)), b""
                continue
            if not raw.strip():
                blank_run.append(number)  # reported only if a non-blank line follows
                continue
            yield from _flush_blank(blank_run, label)
            text, problem = _decode(raw)
            if problem:
                yield None, BadRow(label, number, problem), raw
                continue
            try:
                row = json.loads(text)
            except ValueError as error:
                yield None, BadRow(label, number, f"malformed JSON: {_json_error(error)}"), raw
                continue
            problem = row_problem(row, fields, partial(seen.problem, row, number))
            yield row, (BadRow(label, number, problem) if problem else None), raw


def _flush_blank(blank_run: list[int], label: str) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    for number in blank_run:
        yield None, BadRow(label, number, "blank line (JSON lines hold one object per line)"), b""
    blank_run.clear()


def _json_error(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} (column {error.colno})"
    return str(error)


class _Fields:
    """What the rows of one JSON file have shown so far: each field's first JSON type and, where the
    format hands every column on (`RowCheck.every_column`), the first row's fields."""

    def __init__(self, fields: Checks) -> None:
        self.types: dict[str, tuple[str, int]] = {}
        self.every_column = as_check(fields).every_column
        self.first: Optional[tuple[set, int]] = None

    def problem(self, row: Any, number: int) -> Optional[str]:
        if not isinstance(row, dict):
            return None
        if self.every_column:
            if self.first is None:
                self.first = (set(row), number)
            missing = sorted(self.first[0] - set(row))
            if missing:
                return f"{missing[0]!r} is missing (line {self.first[1]} has it, and every column reaches the rewards)"
            null = next((name for name, value in row.items() if value is None), None)
            if null is not None:
                return f"{null!r} is null (every column reaches the reward functions)"
        return _type_change(row, self.types, number)


def _type_change(row: dict, types: dict[str, tuple[str, int]], number: int) -> Optional[str]:
    """A field whose JSON type differs from the one it had first (null fits any)."""
    for name, value in row.items():
        kind = _json_type(value)
        if kind == "null":
            continue
        first = types.get(name)
        if first is None:
            types[name] = (kind, number)
        elif first[0] != kind:
            return f"{name!r} is {_a(kind)} here but {_a(first[0])} on line {first[1]} (a column keeps one type)"
    return None


def _json_array_rows(
    path: Path, label: str, fields: Checks, max_row_bytes: int
) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    """Rows of a .json file holding one array of objects; the line of each is where it starts.

    The file is parsed whole (a JSON array cannot be split safely), so its size is what it costs."""
    raw = path.read_bytes()
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    text, problem = _decode(raw)
    if problem:
        line = raw[: _bad_byte(raw)].count(b"\n") + 1
        yield None, BadRow(label, line, problem.split(" at column")[0] + " (a .json file must be UTF-8)"), b""
        return
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    seen = _Fields(fields)
    while True:
        position = _skip_space(text, position)
        if position >= len(text):
            yield None, BadRow(label, text.count("\n") + 1, "malformed JSON: the array is not closed"), b""
            return
        if text[position] == "]":
            return
        line = text.count("\n", 0, position) + 1
        try:
            row, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            yield None, BadRow(label, error.lineno, f"malformed JSON: {error.msg} (column {error.colno})"), b""
            return  # nothing after a syntax error can be trusted
        element = text[position:end].encode("utf-8")
        problem = (
            _too_long(len(element), max_row_bytes)
            if len(element) > max_row_bytes
            else row_problem(row, fields, partial(seen.problem, row, line))
        )
        yield row, (BadRow(label, line, problem) if problem else None), element
        position = _skip_space(text, end)
        if position < len(text) and text[position] == ",":
            position += 1
        elif position < len(text) and text[position] != "]":
            yield (
                None,
                BadRow(label, text.count("\n", 0, position) + 1, "malformed JSON: expected ',' or ']' between rows"),
                b"",
            )
            return


def _bad_byte(raw: bytes) -> int:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start
    return 0


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _csv_rows(
    path: Path, label: str, fields: Checks, max_row_bytes: int
) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    """Rows of a CSV file with a header. An empty required cell is a bad row: pandas reads it as
    NaN, which would train as the text "nan"."""
    with open(path, "rb") as handle:
        lines = read_lines(handle, max_row_bytes)
        state = {"number": 0, "problem": None}

        def text_lines() -> Iterator[str]:
            for number, raw, length in lines:
                state["number"] = number
                if raw is None:
                    state["problem"] = _too_long(length, max_row_bytes)
                    yield ""
                    continue
                text, problem = _decode(raw)
                if problem:
                    state["problem"] = problem
                    yield ""
                    continue
                yield text + "\n"

        reader = csv.reader(text_lines())
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            yield None, BadRow(label, 1, f"malformed CSV header: {error}"), b""
            return
        while True:
            start = state["number"] + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                yield None, BadRow(label, start, f"malformed CSV: {error}"), b""
                continue
            if state["problem"]:
                problem, state["problem"] = state["problem"], None
                yield None, BadRow(label, state["number"], problem), b""
                continue
            if not record:
                continue  # an empty line: csv readers skip it too
            if len(record) != len(header):
                yield None, BadRow(label, start, f"has {len(record)} fields, the header has {len(header)}"), b""
                continue
            row = dict(zip(header, record))
            problem = row_problem(row, fields)
            if problem is None:
                empty = [name for name in as_check(fields).fields if row.get(name) == ""]
                problem = f"{empty[0]!r} is empty" if empty else None
            yield row, (BadRow(label, start, problem) if problem else None), b""


def _text_rows(
    path: Path, label: str, fields: Checks, max_row_bytes: int
) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    """Lines of a plain text file: each is a row. The encoding and the length can be bad, and a blank
    line, which would train a sample of no text (blank lines at the end of the file are not rows)."""
    blank_run: list[int] = []
    with open(path, "rb") as handle:
        for number, raw, length in read_lines(handle, max_row_bytes):
            if raw is None:
                yield from _flush_blank_text(blank_run, label)
                yield None, BadRow(label, number, _too_long(length, max_row_bytes)), b""
                continue
            if not raw.removeprefix(BOM).strip():
                blank_run.append(number)  # reported only if a non-blank line follows
                continue
            yield from _flush_blank_text(blank_run, label)
            _, problem = _decode(raw)
            yield None, (BadRow(label, number, problem) if problem else None), raw


def _flush_blank_text(blank_run: list[int], label: str) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    for number in blank_run:
        yield (
            None,
            BadRow(label, number, "blank line (each line of a text file is a sample: this one has no text)"),
            b"",
        )
    blank_run.clear()


def rows_of(
    path: str | os.PathLike,
    fields: Checks,
    *,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    label: Optional[str] = None,
) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    """(row, problem or None, raw bytes of the row) for each row of a .jsonl/.json/.csv/.txt file.

    The row is the parsed object (None for text files and for rows that do not parse). For
    streaming readers: keep the rows whose problem is None.
    """
    path = Path(path)
    label = label or str(path)
    suffix = path.suffix.lower()
    if suffix in (".txt", ".text"):
        return _text_rows(path, label, fields, max_row_bytes)
    if suffix == ".csv":
        return _csv_rows(path, label, fields, max_row_bytes)
    if suffix == ".json" and _starts_with_array(path):
        return _json_array_rows(path, label, fields, max_row_bytes)
    return _json_rows(path, label, fields, max_row_bytes)


def is_json_lines(path: str | os.PathLike) -> bool:
    """A .jsonl file, or a .json file that holds one object per line rather than one array."""
    path = Path(path)
    suffix = path.suffix.lower()
    return suffix == ".jsonl" or (suffix == ".json" and not _starts_with_array(path))


SKIPPED_BEFORE = "__ditty_lines_skipped_before__"
"""The column `good_json_rows` adds to each row: the lines left out since the row before it, which
the streaming reader counts (skipped_rows) and drops."""


def good_json_rows(paths: list[str], max_row_bytes: int) -> Iterator[dict]:
    """The rows of JSON lines files that parse as objects, in order; each line left out is logged
    with its file and line (a streamed source, read with data.on_bad_rows = "skip") and counted in
    the next row's SKIPPED_BEFORE (lines after a file's last row are not counted)."""
    for path in paths:
        skipped = 0
        for row, problem, _ in _json_rows(Path(path), str(path), {}, max_row_bytes):
            if problem is None and isinstance(row, dict):
                yield {**row, SKIPPED_BEFORE: skipped}
                skipped = 0
            elif problem is not None:
                skipped += 1
                log.warning(
                    'skipping a bad row while streaming (data.on_bad_rows = "skip"): %s: %s',
                    problem.where(),
                    problem.reason,
                )


def _starts_with_array(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip(BOM + b" \t\r\n")
    return head.startswith(b"[")
