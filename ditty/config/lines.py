"""Which line of a TOML file defines each key.

tomllib reports no positions, and the TOML libraries that keep them (tomlkit) do not expose line
numbers either, so this is a small scanner of its own. It runs only on text tomllib has already
accepted, so it can stay simple: it follows table headers, arrays of tables and `key =` lines, and
skips the inside of multi-line strings and arrays. A key it cannot place falls back to its table's
line (see `LineIndex.line_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_BARE_OR_QUOTED = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?")
_KEY = re.compile(rf"^\s*({_DOTTED})\s*=")
_PART = re.compile(_BARE_OR_QUOTED)


def _split_dotted(text: str) -> list[str]:
    parts = []
    for match in _PART.finditer(text):
        token = match.group(0)
        parts.append(token[1:-1] if token[0] in "\"'" else token)
    return parts


@dataclass
class LineIndex:
    lines: dict[str, int] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    """Where each path was first defined (a key, a table header, or the table a dotted key opens):
    for "set twice" messages, which name the earlier line."""
    defined_at: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Line -> ("table" or "key", the dotted path it defines)."""

    def line_of(self, path: str) -> int | None:
        """The line of `path`, else of its nearest ancestor (a table header or inline table)."""
        parts = path.split(".")
        while parts:
            line = self.lines.get(".".join(parts))
            if line is not None:
                return line
            parts.pop()
        return None


def index_lines(text: str) -> LineIndex:
    index = LineIndex()
    table: list[str] = []
    array_counts: dict[str, int] = {}
    open_brackets = 0  # depth of a multi-line array or inline table still open
    in_multiline: str | None = None  # the delimiter of an open multi-line string
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if open_brackets > 0:
            open_brackets += _bracket_balance(line)
            continue
        header = _HEADER.match(line)
        if header and not _KEY.match(line):
            table = _split_dotted(header.group(2))
            name = ".".join(table)
            if header.group(1) == "[[":
                # Arrays of tables are addressed as name.0, name.1, ... like the dotted paths
                # that the coercer reports.
                position = array_counts.get(name, 0)
                array_counts[name] = position + 1
                index.lines.setdefault(name, number)
                table = table + [str(position)]
            index.lines[".".join(table)] = number
            index.defined_at[number] = ("table", name)
            if header.group(1) == "[":
                index.first.setdefault(name, number)
            continue
        key = _KEY.match(line)
        if not key:
            continue
        parts = table + _split_dotted(key.group(1))
        path = ".".join(parts)
        index.lines[path] = number
        index.defined_at[number] = ("key", path)
        for end in range(len(table) + 1, len(parts) + 1):  # a dotted key also opens its tables
            index.first.setdefault(".".join(parts[:end]), number)
        value = line[key.end() :]
        for delimiter in ('"""', "'''"):
            if value.count(delimiter) == 1:
                in_multiline = delimiter
        if not in_multiline:
            open_brackets = _bracket_balance(value)
    return index


def _bracket_balance(text: str) -> int:
    """Opened minus closed brackets and braces outside strings and comments."""
    balance = 0
    quote: str | None = None
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            break
        elif char in "[{":
            balance += 1
        elif char in "]}":
            balance -= 1
    return balance
