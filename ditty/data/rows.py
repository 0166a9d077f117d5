"""Which rows of data cannot be used, and why: the checks a data format asks for.

`datasets` parses files with pyarrow (pandas for CSV), which stops at the first problem with a
message that seldom names the line and accepts rows that miss a field or hold null (they then
train as empty text). So ditty checks each row itself (the file readers are ditty.data.row_files):

- the fields the format reads (its `RowCheck`, ditty.data.formats) must be present, not null, and of the right type
  (`check_row`: text is a string or a number; chat messages a non-empty list of objects with a
  text "role" and a "content");
- a top-level field keeps one JSON type across rows (pyarrow refuses a column that is a number in
  one row and a string in another).

What happens to bad rows (an error, or training without them) is `ditty.data.bad_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

DEFAULT_MAX_ROW_BYTES = 16_000_000

TEXT = "text"
MESSAGES = "messages"
ANY = "any"
"""Field kinds: text (a string or a number), chat messages, or any value (present and not null)."""
CHAT_ROLES = ("user", "assistant", "system")
"""The roles of a chat message a chat template is written for."""
TOOL_ROLE = "tool"
"""A tool's answer to the assistant's call: accepted right after an assistant turn or another tool message."""


def role_problem(roles: list, index: int) -> Optional[str]:
    """Why message `index` of a conversation whose roles are `roles` has a role no template is written
    for (a typo would render as no one's turn), or None. A tool message answers a call, so it follows
    an assistant turn (or another tool message answering the same turn)."""
    role = roles[index]
    if role in CHAT_ROLES:
        return None
    if role == TOOL_ROLE:
        if index > 0 and roles[index - 1] in ("assistant", TOOL_ROLE):
            return None
        return f"message {index} has the role 'tool' but follows no assistant turn (a tool message answers a call)"
    return f"message {index} has the role {role!r}, not user, assistant, system or (after an assistant turn) tool"


@dataclass(frozen=True)
class RowCheck:
    """What the row loader checks in every row of a format: `fields` ({column: "text" | "messages" |
    "any"}: present, not null, of that JSON type), then `row`, the format's own rule (or None)."""

    fields: Mapping[str, str]
    row: Optional[Callable[[dict], Optional[str]]] = None
    optional: tuple[str, ...] = ()
    """Columns `row` also reads where the data has them (the preference prompt, which TRL's
    implicit-prompt pairs leave out)."""
    every_column: bool = False
    """Every column counts (the prompt format hands each to the reward functions): a row of a JSON
    file may not lack a field the file's first row has, nor hold null."""


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
        return f"{self.file} row {self.row + 1}"  # counted from 1, as lines and the label checks count


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
                fix=(
                    f"set {column_key} to one of the columns found, or pick the data.format that matches the data"
                    if column_key.endswith("_column")
                    else f"give the rows the column {column!r}, or change {column_key} (it reads that column)"
                ),
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
        problem = role_problem([m.get("role") if isinstance(m, dict) else None for m in value], index)
        if problem:  # a chat template renders any role: a typo trains as no one's turn
            return problem
        if not isinstance(message["content"], str):
            content = message["content"]
            return f"message {index} has 'content' {'null' if content is None else _a(_json_type(content))}, not text"
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
