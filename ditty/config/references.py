"""User code named in a recipe as "package.module:Name": the one place that imports it.

Importing runs the module's top-level code, the trust a user gives `python -m`; nothing the
reference names is called here. Callers decide what they accept (a class, a function, a subclass of
something) and call it themselves. A dotted name after the colon reaches nested attributes
("pkg.mod:Outer.Inner").
"""

from __future__ import annotations

import importlib
from typing import Any

from ditty.config.errors import Problem, RecipeError

_MISSING = object()


def resolve_reference(reference: Any, *, key: str) -> tuple[Any, list[Problem]]:
    """(the object, []) or (None, [the Problem naming `key`]); never raises for a bad reference."""
    module_name, colon, attr = reference.partition(":") if isinstance(reference, str) else ("", "", "")
    if not colon or not module_name or not attr:
        return None, [
            Problem(
                key,
                f'{reference!r} is not of the form "package.module:Name"',
                fix='write the module, a colon, then the name, e.g. "my_pkg.stages:AddNoise"',
            )
        ]
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        return None, [
            Problem(
                key,
                f"cannot import module {module_name!r}: {error}",
                fix="check the module name and that it is importable (installed, or on PYTHONPATH)",
            )
        ]
    for part in attr.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return None, [
                Problem(
                    key,
                    f"module {module_name!r} has no attribute {attr!r}",
                    fix=f"define {attr} in {module_name}, or fix the name",
                )
            ]
    return obj, []


def import_reference(reference: Any, *, key: str) -> Any:
    """The object `reference` names; a RecipeError on `key` when it cannot be imported."""
    obj, problems = resolve_reference(reference, key=key)
    if problems:
        raise RecipeError(problems)
    return obj
