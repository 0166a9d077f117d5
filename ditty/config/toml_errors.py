"""A TOML syntax error in the user's words.

tomllib says where it stopped ("Cannot overwrite a value (at line 9, column 6)", "Expected '='
after a key in a key/value pair (at line 2, column 10)") but not what the user wrote or which rule
it breaks. For the two mistakes people make most, this module says it: a key set twice names the
key and the line where it was first set; a key that is not a valid bare key is quoted as written,
with the rule (ASCII letters, digits, `-` and `_`) and the character that breaks it. Every other
syntax error keeps tomllib's message, with its line.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Optional

import tomllib

from ditty.config.errors import Problem
from ditty.config.lines import index_lines

_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
_BARE_KEY_CHAR = re.compile(r"[A-Za-z0-9_-]")
BARE_KEY_RULE = "bare keys are ASCII letters, digits, `-` and `_`"
_DUPLICATE = ("Cannot overwrite a value", "Cannot declare", "Cannot mutate", "Duplicate inline table key")
_BAD_KEY = (
    "Expected '=' after a key",
    "Invalid initial character for a key part",
    "Invalid statement",
    "Expected ']' at the end of a table declaration",
    "Expected ']]' at the end of an array declaration",
)


def explain(error: tomllib.TOMLDecodeError, text: str) -> Problem:
    """The Problem to show for a TOML syntax error in `text`."""
    match = _POSITION.search(str(error))
    line = int(match.group(1)) if match else getattr(error, "lineno", None)
    column = int(match.group(2)) if match else getattr(error, "colno", None)
    message = str(error)
    if line is not None:
        if message.startswith(_DUPLICATE):
            found = _duplicate(message, text, line)
            if found:
                return found
        if message.startswith(_BAD_KEY):
            found = _bad_key(text, line, column)
            if found:
                return found
    return Problem("", f"is not valid TOML: {message}", fix="check the syntax near that line", line=line)


def _duplicate(message: str, text: str, line: int) -> Optional[Problem]:
    index = index_lines("\n".join(text.splitlines()[:line]))
    kind, path = index.defined_at.get(line, ("", ""))
    if not path:
        return None
    inline = re.match(r"Duplicate inline table key '(.+)'", message)
    if inline:
        key = f"{path}.{inline.group(1)}"
        return Problem(key, f"is set twice in one inline table (line {line})", fix="keep one of them", line=line)
    first = index.first.get(path)
    earlier = f"first on line {first}, again on line {line}" if first and first != line else f"again on line {line}"
    if kind == "table":
        return Problem(
            "",
            f"table [{path}] is declared twice: {earlier}",
            fix=f"merge the two [{path}] tables into one (TOML allows each table once)",
            line=line,
        )
    return Problem(path, f"is set twice: {earlier}", fix="keep one of them (TOML allows each key once)", line=line)


def _bad_key(text: str, line: int, column: Optional[int]) -> Optional[Problem]:
    lines = text.splitlines()
    if line > len(lines):
        return None
    raw = lines[line - 1]
    stripped = raw.strip()
    header = stripped.startswith("[")
    if header:
        written = stripped.strip("[]").strip()
    elif "=" in stripped:
        written = stripped.split("=", 1)[0].strip()
    else:
        return Problem(
            "",
            f"`{stripped}` is not a `key = value` line: there is no `=` after the key",
            fix="write it as key = value (strings in quotes)",
            line=line,
        )
    culprit = _first_invalid(written)
    if culprit is None:
        return None
    what = "table name" if header else "key"
    example = f'["{written}"]' if header else f'"{written}" = ...'
    return Problem(
        "",
        f"`{written}` is not a valid {what}: {BARE_KEY_RULE} (it has {culprit})",
        fix=f"use the name the recipe documents (`ditty run --help` lists every field), or quote it: {example}",
        line=line,
    )


def _first_invalid(written: str) -> Optional[str]:
    """The first character of a (possibly dotted) bare key that breaks the rule, described."""
    quote = None
    for position, char in enumerate(written, start=1):
        if quote:
            quote = None if char == quote else quote
            continue
        if char in "\"'":
            quote = char
        elif char == "." or _BARE_KEY_CHAR.match(char):
            continue
        elif char.isspace():
            before, after = written[: position - 1].rstrip(), written[position:].lstrip()
            if before.endswith(".") or after.startswith(".") or not after:
                continue  # spaces around a dot are allowed
            return f"a space at column {position}"
        else:
            return _describe(char, position)
    return None


def _describe(char: str, position: int) -> str:
    if ord(char) < 128:
        return f"{char!r} at column {position}"
    name = unicodedata.name(char, "unnamed")
    return f"the non-ASCII character {char!r} (U+{ord(char):04X} {name}) at column {position}"
