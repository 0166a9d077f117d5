"""Reading data files row by row, in bounded memory, and telling which rows cannot be used and why.

`datasets` parses files with pyarrow (pandas for CSV), which stops at the first problem with a
message that seldom names the line, accepts rows that miss a field or hold null (they then train
as empty text), and reads one huge line whole before failing. `rows_of(path, fields)` reads a
.jsonl/.json/.csv/.txt file itself and yields each row with its problem, if any:

- lines are read in pieces of at most `data.max_row_bytes` (a longer line is a bad row, and the
  rest of it is skipped without being held);
- each line must be UTF-8; in JSON lines (and .json files that are not one array) each line must
  be one JSON object, and a blank line is a bad row (blank lines at the very end are fine);
- the fields the format reads (its `RowCheck`, ditty.data.formats) must be present, not null, and of the right type
  (`check_row`: text is a string or a number; chat messages a non-empty list of objects with a
  text "role" and a "content");
- a top-level field keeps one JSON type across rows (pyarrow refuses a column that is a number in
  one row and a string in another).

What happens to bad rows (an error, or training without them) is `ditty.data.bad_rows`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

DEFAULT_MAX_ROW_BYTES = 16_000_000
READ_CHUNK = 1 << 20
BOM = b"\xef\xbb\xbf"

TEXT = "text"
MESSAGES = "messages"
ANY = "any"
"""Field kinds: text (a string or a number), chat messages, or any value (present and not null)."""


@dataclass(frozen=True)
class RowCheck:
    """What the row loader checks in every row of a format: `fields` ({column: "text" | "messages" |
    "any"}: present, not null, of that JSON type), then `row`, the format's own rule (or None)."""

    fields: Mapping[str, str]
    row: Optional[Callable[[dict], Optional[str]]] = None


Checks = Union[RowCheck, Mapping[str, str]]
"""A format's RowCheck, or just its fields."""


def as_check(checks: Optional[Checks]) -> RowCheck:
    return checks if isinstance(checks, RowCheck) else RowCheck(dict(checks or {}))


def row_problem(row: Any, checks: Checks, between: Optional[Callable[[], Optional[str]]] = None) -> Optional[str]:
    """Why `row` cannot be used by the format (`check_row`, then `between`, a reader's own check, then
    the format's rule), or None."""
    check = as_check(checks)
    return check_row(row, check.fields) or (between() if between else None) or (check.row(row) if check.row else None)


@dataclass(frozen=True)
class BadRow:
    file: str
    line: Optional[int]
    """1-based line in the file (line-based formats), else None."""
    reason: str
    row: Optional[int] = None
    """0-based row index, for sources without lines (parquet, hub datasets)."""

    def where(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        return f"{self.file} row {self.row}"


def require_columns(dataset: Any, columns: Mapping[str, str], description: str, key: str) -> None:
    """A RecipeError unless `dataset` (a `datasets.Dataset`) has rows and every column of `columns`
    ({recipe key: column} that the format reads). `description` names the data, `key` the recipe key
    that pointed at it."""
    from ditty.config.errors import RecipeError

    if len(dataset) == 0:
        raise RecipeError.single(
            f"{description} holds no rows", key=key, fix="point it at data with at least one sample"
        )
    found = dataset.column_names
    for column_key, column in columns.items():
        if column not in found:
            raise RecipeError.single(
                f"column {column!r} is missing from {description} (columns found: {', '.join(found) or 'none'})",
                key=column_key,
                fix=f"set {column_key} to one of the columns found, or pick the data.format that matches the data",
            )


def check_row(row: Any, fields: Mapping[str, str]) -> Optional[str]:
    """Why `row` cannot be used (missing, null or wrongly typed field), or None when it can."""
    if not isinstance(row, dict):
        return f"is a JSON {_json_type(row)}, not an object of fields"
    for name, kind in fields.items():
        if name not in row:
            return f"{name!r} is missing"
        value = row[name]
        if value is None:
            return f"{name!r} is null"
        if kind == TEXT and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            return f"{name!r} is {_a(_json_type(value))}, not text"
        if kind == MESSAGES:
            problem = _messages_problem(value)
            if problem:
                return f"{name!r} {problem}"
    return None


def _messages_problem(value: Any) -> Optional[str]:
    if not isinstance(value, list):
        return f"is {_a(_json_type(value))}, not a list of messages"
    if not value:
        return "is an empty list of messages"
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            return f"message {index} is {_a(_json_type(message))}, not an object"
        if not isinstance(message.get("role"), str):
            return f"message {index} has no text 'role'"
        if "content" not in message:
            return f"message {index} has no 'content'"
    return None


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object" if isinstance(value, dict) else type(value).__name__


# ---------------------------------------------------------------------------- reading lines


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
    types: dict[str, tuple[str, int]] = {}
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
            problem = row_problem(row, fields, partial(_type_change, row, types, number))
            yield row, (BadRow(label, number, problem) if problem else None), raw


def _flush_blank(blank_run: list[int], label: str) -> Iterator[tuple[Any, Optional[BadRow], bytes]]:
    for number in blank_run:
        yield None, BadRow(label, number, "blank line (JSON lines hold one object per line)"), b""
    blank_run.clear()


def _json_error(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} (column {error.colno})"
    return str(error)


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
    types: dict[str, tuple[str, int]] = {}
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
            else row_problem(row, fields, partial(_type_change, row, types, line))
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
    """Lines of a plain text file: each is a row; only the encoding and the length can be bad."""
    with open(path, "rb") as handle:
        for number, raw, length in read_lines(handle, max_row_bytes):
            if raw is None:
                yield None, BadRow(label, number, _too_long(length, max_row_bytes)), b""
                continue
            _, problem = _decode(raw)
            yield None, (BadRow(label, number, problem) if problem else None), raw


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


def _starts_with_array(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip(BOM + b" \t\r\n")
    return head.startswith(b"[")
