"""Environments the Python API is given as a class or an instance (`rl=RLConfig(environment=MyGame)`,
or `environment=MyGame(level=2)`), named by a reference the recipe can hold.

A recipe names its environment as "package.module:Name", which the compiler imports and checks and
every rank builds once per episode. A class the Python API is given keeps its own reference where it
has one ("my_games:MyGame"; "__main__:MyGame" for a script's, which every rank running the script
defines as well). A class without one (defined inside a function) and an instance are registered
here, under a name the reference then gives: an instance's class builds each episode's environment
as a deep copy of the instance, so episodes never share its state. Registered ones exist in this
process only: resuming such a run from the command line names the missing attribute (exit code 2).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

_registered: dict[int, str] = {}


def environment_reference(given: Any) -> str:
    """ "module:Name" for `given` (a class with reset and step, or an instance of one)."""
    if isinstance(given, type):
        module, name = given.__module__, given.__qualname__
        try:
            if "<" not in name and getattr(importlib.import_module(module), name) is given:
                return f"{module}:{name}"
        except (ImportError, AttributeError):
            pass
        return _register(given, given)
    return _register(given, _copies_of(given))


def _copies_of(instance: Any) -> type:
    """A class whose every construction is a deep copy of `instance` (one per episode)."""

    def new(cls: type) -> Any:
        return copy.deepcopy(instance)

    parent = type(instance)
    return type(f"CopiesOf{parent.__name__}", (parent,), {"__new__": new, "__init__": lambda self: None})


def _register(key: Any, environment: type) -> str:
    name = _registered.get(id(key))
    if name is None:
        name = f"given_environment_{len(_registered)}"
        _registered[id(key)] = name
        globals()[name] = environment
    return f"{__name__}:{name}"
