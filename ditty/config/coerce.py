"""Strict conversion of parsed TOML (plain dicts and lists) into the frozen config tree.

Every problem is collected, not raised at the first one, so a recipe with ten mistakes lists ten.
Only lossless coercions happen (an integer where a float is expected); a string is never turned
into a number and a number never into a boolean.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from ditty.config.aliases import foreign_key_fix
from ditty.config.errors import Problem
from ditty.config.schema import field_types, fields_of, is_config_class, type_name, walk_leaves

_MISSING = object()
NOT_TOML = "has a type ditty cannot read from TOML"
_FLOAT_EXACT_INT = 2**53  # integers beyond this lose precision as floats


class _Invalid(Exception):
    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def build(cls: type, data: Any, problems: list[Problem], path: str = "", root: type | None = None) -> Any:
    """Turn `data` into an instance of the dataclass `cls`; append a Problem per mistake.

    Returns the instance, or None when a problem made it impossible to build.
    """
    root = root or cls
    if not isinstance(data, dict):
        problems.append(Problem(path, f"expected a table, got {_describe(data)}", fix=f"write it as [{path}]"))
        return None
    known = {f.name: f for f in fields_of(cls, f"{path}." if path else "")}
    values: dict[str, Any] = {}
    ok = True
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else key
        info = known.get(key)
        if info is None:
            problems.append(_unknown_key(key, key_path, cls, root))
            ok = False
            continue
        try:
            if info.is_section:
                built = build(info.type, value, problems, key_path, root)
                if built is None:
                    ok = False
                    continue
                values[key] = built
            else:
                values[key] = convert(value, info.type, key_path, problems, root)
        except _Invalid as invalid:
            problems.append(Problem(key_path, invalid.message, fix=invalid.fix))
            ok = False
        except _Skip:
            ok = False
    for name, info in known.items():
        if name not in values and info.default is dataclasses.MISSING and name not in data:
            problems.append(Problem(info.path, "is required", fix=f"add `{name} = ...` to [{path}]" if path else ""))
            ok = False
    return cls(**values) if ok else None


def convert(value: Any, tp: Any, path: str, problems: list[Problem], root: type | None = None) -> Any:
    """Check `value` against the type annotation `tp` and return it in that type's form."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if is_config_class(tp):
        built = build(tp, value, problems, path, root)
        if built is None:
            raise _Skip()
        return built
    if origin is typing.Literal:
        for allowed in args:
            if type(value) is type(allowed) and value == allowed:
                return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f'did you mean "{close[0]}"?' if close else f"choose {type_name(tp)}"
        raise _Invalid(f"{_describe(value)} is not a valid choice: expected {type_name(tp)}", hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        # Booleans first: in Python True is an int, in TOML it is not.
        options.sort(key=lambda a: 0 if a is bool else 1)
        for option in options:
            try:
                return convert(value, option, path, [], root)
            except (_Invalid, _Skip):
                continue
        raise _Invalid(f"expected {_article(type_name(tp))}, got {_describe(value)}", _number_fix(value))
    if origin is list:
        if not isinstance(value, list):
            raise _Invalid(f"expected {type_name(tp)}, got {_describe(value)}", _list_fix(value))
        return _convert_items(value, args[0] if args else Any, path, problems, root)
    if origin is tuple:
        if not isinstance(value, list):
            raise _Invalid(f"expected {type_name(tp)}, got {_describe(value)}")
        item_types = list(args)
        if len(item_types) == 2 and item_types[1] is Ellipsis:
            return tuple(_convert_items(value, item_types[0], path, problems, root))
        if len(value) != len(item_types):
            raise _Invalid(f"expected a list of {len(item_types)} values, got a list of {len(value)}")
        return tuple(convert(v, t, f"{path}.{i}", problems, root) for i, (v, t) in enumerate(zip(value, item_types)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _Invalid(f"expected a table, got {_describe(value)}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Invalid(f"expected a boolean, got {_describe(value)}", "write true or false (no quotes)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Invalid(f"expected an integer, got {_describe(value)}", _number_fix(value))
    if tp is float:
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _FLOAT_EXACT_INT:
            return float(value)
        raise _Invalid(f"expected a float, got {_describe(value)}", _number_fix(value))
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Invalid(f"expected a string, got {_describe(value)}", "put the value in double quotes")
    raise _Invalid(f"{NOT_TOML}: {tp!r}")


class _Skip(Exception):
    """A nested table already reported its own problems."""


def _convert_items(items: list, item_type: Any, path: str, problems: list[Problem], root: type | None) -> list:
    out = []
    failed = False
    for position, item in enumerate(items):
        item_path = f"{path}.{position}"
        try:
            out.append(convert(item, item_type, item_path, problems, root))
        except _Invalid as invalid:
            problems.append(Problem(item_path, invalid.message, fix=invalid.fix))
            failed = True
        except _Skip:
            failed = True
    if failed:
        raise _Skip()
    return out


def _unknown_key(key: str, key_path: str, cls: type, root: type) -> Problem:
    names = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    section = key_path.rsplit(".", 1)[0] if "." in key_path else ""
    foreign = foreign_key_fix(key, section)
    if foreign:
        fix = foreign
    elif close:
        fix = f"did you mean `{close[0]}`?"
    else:
        elsewhere = [leaf.path for leaf in walk_leaves(root) if leaf.name == key]
        if elsewhere:
            fix = f"`{key}` belongs in `{elsewhere[0]}`"
        elif section:
            fix = f"[{section}] accepts: " + ", ".join(names)
        else:
            fix = "sections are: " + ", ".join(f"[{n}]" for n in names)
    return Problem(key_path, "unknown section" if not section else "unknown key", fix=fix)


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__
    )
    if isinstance(value, (dict, list)):
        return f"a {kind}"
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def _number_fix(value: Any) -> str:
    if isinstance(value, str) and _looks_numeric(value):
        return "remove the quotes around the number"
    if isinstance(value, float) and value.is_integer():
        return f"write {int(value)} without a decimal point"
    return ""


def _article(text: str) -> str:
    if text.startswith(("one of", "list")):
        return text if text.startswith("one of") else f"a {text}"
    return ("an " if text[0] in "aeiou" else "a ") + text


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _list_fix(value: Any) -> str:
    if isinstance(value, str):
        return f'write it as a list: ["{value}"]'
    return ""


# `convert` raises _Skip for nested problems; callers at the top level treat it like _Invalid
# whose message was already recorded.
def convert_or_report(value: Any, tp: Any, path: str, problems: list[Problem], root: type | None = None) -> Any:
    try:
        return convert(value, tp, path, problems, root)
    except _Invalid as invalid:
        problems.append(Problem(path, invalid.message, fix=invalid.fix))
    except _Skip:
        pass
    return _MISSING


def type_problems(config: Any) -> list[Problem]:
    """The problems `build` finds in a config tree built in code (the Python API, a Python recipe, a
    `Trainer(config)`): each value against its annotation, as a TOML recipe is held to them (a string
    where a number goes, a choice outside a Literal's, a numpy number or a Path object where the run
    and its recipe.toml want a plain one). A value of an annotation TOML cannot write passes as it is."""
    problems: list[Problem] = []
    build(type(config), _as_table(config), problems)
    return [p for p in problems if not p.message.startswith(NOT_TOML)]


def _may_be_unset(tp: Any) -> bool:
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    return tp in (Any, int, float) or optional


def _as_table(value: Any) -> Any:
    """A built config value back in TOML's form: sections as tables, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = field_types(type(value))
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        # TOML has no None: an optional value, or a number a config built in Python leaves "not set"
        # (train.max_grad_norm = None: no clipping; ditty.recipe.value_rules), is a key left out
        return {name: _as_table(item) for name, item in items if not (item is None and _may_be_unset(hints[name]))}
    if isinstance(value, (list, tuple)):
        return [_as_table(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_table(item) for key, item in value.items()}
    return value


MISSING = _MISSING
__all__ = ["build", "convert_or_report", "MISSING", "field_types", "type_problems"]
