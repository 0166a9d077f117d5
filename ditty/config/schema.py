"""Reading the config classes: their fields, resolved types and attribute docstrings.

Python keeps no attribute docstrings at run time, so they are read from the source with `ast`
(tyro does the same for `--help`); `ditty init` turns them into comments.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class FieldInfo:
    name: str
    path: str
    type: Any
    default: Any
    doc: str
    is_section: bool


def is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass and its bases (a subclass's own win)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        class_node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
        if class_node is None:
            continue
        body = class_node.body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def fields_of(cls: type, prefix: str = "") -> list[FieldInfo]:
    types = field_types(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = types[f.name]
        out.append(
            FieldInfo(
                name=f.name,
                path=f"{prefix}{f.name}",
                type=tp,
                default=default_of(f),
                doc=docs.get(f.name, ""),
                is_section=is_config_class(tp),
            )
        )
    return out


def walk_leaves(cls: type, prefix: str = "") -> Iterator[FieldInfo]:
    """Every non-section field of the tree, depth first, with its dotted path."""
    for info in fields_of(cls, prefix):
        if info.is_section:
            yield from walk_leaves(info.type, f"{info.path}.")
        else:
            yield info


def section_class(root: type, path: str) -> type | None:
    cls: Any = root
    for part in path.split(".") if path else []:
        types = field_types(cls) if is_config_class(cls) else {}
        cls = types.get(part)
        if not is_config_class(cls):
            return None
    return cls


def type_name(tp: Any) -> str:
    """How a type reads in an error message: `int`, `one of "a", "b"`, `list of str`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is type(None):
        return "nothing"
    if origin is typing.Literal:
        return "one of " + ", ".join(_literal_repr(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"list of {len(args)} values"
        return "list of " + type_name(args[0]) if args else "list"
    if origin is dict:
        return "table"
    if is_config_class(tp):
        return "table"
    return {str: "string", int: "integer", float: "float", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def _literal_repr(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)
