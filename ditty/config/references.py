"""User code named in a recipe as "package.module:Name": the one place that imports it.

Importing runs the module's top-level code, the trust a user gives `python -m`; nothing the
reference names is called here. Callers decide what they accept (a class, a function, a subclass of
something) and call it themselves. A dotted name after the colon reaches nested attributes
("pkg.mod:Outer.Inner").
"""

from __future__ import annotations

import importlib
import os
import traceback
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
    except SyntaxError as error:  # IndentationError and TabError too: the file and line are the error's own
        return None, [
            Problem(
                key,
                f"cannot import module {module_name!r}: {error.msg} ({error.filename}, line {error.lineno})",
                fix="fix the syntax error at that line",
            )
        ]
    except SystemExit as error:  # the module's top level called sys.exit(): not an answer from ditty
        return None, [
            Problem(
                key,
                f"importing module {module_name!r} called sys.exit({error.code!r}){_where(error)}",
                fix="a module a recipe names must not exit when imported; put that code under "
                '`if __name__ == "__main__":`',
            )
        ]
    except Exception as error:  # noqa: BLE001 - whatever the user's module raises is the user's to fix
        return None, [
            Problem(
                key,
                f"importing module {module_name!r} raised {type(error).__name__}: {error}{_where(error)}",
                fix="fix the error at that line of the module (it runs when the recipe is loaded)",
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


def _where(error: BaseException) -> str:
    """ " (FILE, line N)": where the error was raised, leaving out the import machinery's frames."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    frames = [f for f in frames if not f.filename.endswith(("importlib/__init__.py", "ditty/config/references.py"))]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def code_references(config: Any, trainer: str | None = None) -> list[str]:
    """Every piece of code a recipe makes ditty import or run, as `key = value` lines: its trainer,
    each [pipeline] stage, `model.factory`, converter classes in `model.converters`, reward
    functions in `rl.rewards` and tools in `rl.tools` (the compiler imports them to check their
    signature), the environment class of `rl.environment`, and an advantage estimator or policy loss
    of one's own (`rl.advantage`, `rl.loss`), each other than ditty's own, and
    `model.trust_remote_code` (code shipped beside the model). Readers of someone else's run refuse
    to go on while this is not empty, unless told to trust it."""
    import dataclasses

    found = [f"trainer = {trainer!r}"] if trainer else []

    def walk(node: Any, prefix: str) -> None:
        for item in dataclasses.fields(node):
            value, key = getattr(node, item.name), f"{prefix}{item.name}"
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                walk(value, key + ".")
            elif isinstance(value, (list, tuple)):
                for index, entry in enumerate(value):
                    if dataclasses.is_dataclass(entry) and not isinstance(entry, type):
                        walk(entry, f"{key}[{index}].")
                    elif item.name == "converters" and isinstance(entry, str) and ":" in entry:
                        found.append(f"{key}[{index}] = {entry!r}")
                    elif (
                        item.name in ("rewards", "tools")
                        and isinstance(entry, str)
                        and is_code_reference(entry)
                        and not _ditty_own(entry)
                    ):
                        found.append(f"{key}[{index}] = {entry!r}")
            elif item.name in ("use", "factory") and isinstance(value, str) and value:
                found.append(f"{key} = {value!r}")
            elif item.name == "environment" and isinstance(value, str) and value and not _ditty_own(value):
                found.append(f"{key} = {value!r}")
            elif (
                key in ("rl.advantage", "rl.loss")
                and isinstance(value, str)
                and is_code_reference(value)
                and not _ditty_own(value)
            ):  # an advantage estimator or a policy loss of one's own
                found.append(f"{key} = {value!r}")
            elif item.name == "trust_remote_code" and value is True:
                found.append(f"{key} = true")

    walk(config, "")
    return found


def is_code_reference(reference: str) -> bool:
    """ "package.module:name" (code to import), not a path or hub id (`rl.rewards` also takes reward models)."""
    module, colon, name = reference.partition(":")
    return bool(colon and name) and "/" not in module and os.sep not in module


def _ditty_own(reference: str) -> bool:
    """A reference into the installed ditty package (`ditty.objectives.rewards.builtin_rewards:exact_match`):
    importing it runs nothing a run directory brought (readers drop the current directory from
    sys.path, so a planted `ditty/` there is not what loads)."""
    return reference.split(":", 1)[0].split(".", 1)[0] == "ditty"
