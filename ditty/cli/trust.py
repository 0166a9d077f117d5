"""Which code a command may import. A recipe the user names may name the user's own code
(package.module:Name, imported from the current directory like `python -m`); a run directory is data
that may come from anyone, so the commands that read one import nothing it names, nor anything from
the current directory, unless TRUST_FLAG is given."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

from ditty.config import RecipeError

TRUST_FLAG = "--trust-run-code"
READERS = ("generate", "export", "push", "eval")
"""Commands that read a run directory: they never import code its files name, unless TRUST_FLAG."""


@contextlib.contextmanager
def import_path(*, user_code: bool) -> Iterator[None]:
    """sys.path for one command. A recipe the user names may name the user's own code as
    package.module:Name, which is imported from the current directory, like `python -m`. Reading a
    run directory imports nothing from there (nor from the directory read), even though
    `python -m ditty` itself put it first on the path."""
    saved = list(sys.path)
    here = str(Path.cwd())
    if user_code:
        if "" not in sys.path and here not in sys.path:
            sys.path.insert(0, here)
    else:
        sys.path[:] = [entry for entry in sys.path if entry not in ("", ".", here)]
    try:
        yield
    finally:
        sys.path[:] = saved


def imports_user_code(command: str, args: list[str]) -> bool:
    if command in ("run", "init", "rollout-server"):  # a recipe the user names, never a run directory
        return True
    if command == "check":
        return TRUST_FLAG in args or run_dir_recipe(args) is None
    return TRUST_FLAG in args  # the readers; ls and plot import nothing named anywhere


def run_dir_recipe(args: list[str]) -> Path | None:
    """For `ditty check RUN_DIR` (or a recipe.toml inside a run directory): the recipe file to read
    as a run's, whose code is not imported; None for a recipe the user names."""
    if not args or args[0].startswith("-"):
        return None
    from ditty._utils.run_dir import is_ditty_run

    given = Path(args[0])
    if given.is_dir() and is_ditty_run(str(given)):
        for candidate in (given / "recipe.toml", given / "final" / "recipe.toml"):
            if candidate.is_file():
                return candidate
        raise RecipeError.single(f"{given} is a run directory without a recipe.toml", fix="check a recipe file")
    if given.is_file() and given.suffix == ".toml" and is_ditty_run(str(given.parent)):
        return given
    if given.is_file() and given.name == "recipe.toml" and given.parent.name == "final":
        return given if is_ditty_run(str(given.parent.parent)) else None
    return None
