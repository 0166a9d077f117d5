"""Reading a run directory that someone else may have written: its recipe, never its code.

A run directory is data: it can be downloaded, shared or edited. Its recipe.toml may name code
(`trainer = "pkg.mod:Class"`, [pipeline] stages, `model.factory`, `model.trust_remote_code`), and
importing that code runs it. So the commands that read a run (`generate`, `export`, `push`, `eval`,
`check RUN_DIR`) parse its recipe without importing anything it names; a command that would need
that code (export of a custom model, check of a recipe with its own stages) stops and names it
instead, unless the user passes `--trust-run-code`.

The recipe read is the copy inside `final/` (listed in final/manifest.json, so verified with the
model) when there is one, else the run's recipe.toml; `ditty export` reads the copy inside the
checkpoint's sidecar (listed in the checkpoint's manifest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ditty.config.errors import RecipeError

RECIPE_FILE = "recipe.toml"
TRUST_FLAG = "--trust-run-code"


def recipe_file(run_dir: str | Path) -> Optional[Path]:
    """The recipe a reader of `run_dir` uses: final/recipe.toml, else recipe.toml, else None."""
    run_dir = Path(run_dir)
    for path in (run_dir / "final" / RECIPE_FILE, run_dir / RECIPE_FILE):
        if path.is_file():
            return path
    return None


def read_run_recipe(run_dir: str | Path, *, trust_code: bool = False) -> Any:
    """The LoadedRecipe of a run (None when it has none), its code not imported unless `trust_code`."""
    path = recipe_file(run_dir)
    if path is None:
        return None
    return parse_run_recipe(path.read_bytes(), str(path), trust_code=trust_code)


def parse_run_recipe(raw: bytes | str, source: str, *, trust_code: bool = False) -> Any:
    from ditty.config.loader import parse_recipe

    return parse_recipe(raw, source=source, import_code=trust_code)


def refuse_run_code(loaded: Any, *, needs: str, trust_code: bool, ignore_trainer: bool = False) -> None:
    """RecipeError when the run's recipe names code that `needs` (what the command would do with
    it) and the user has not said `--trust-run-code`."""
    if trust_code or loaded is None:
        return
    from ditty.config.references import code_references

    named = code_references(loaded.config, None if ignore_trainer else loaded.trainer)
    if named:
        listed = "\n    ".join(named)
        raise RecipeError.single(
            f"{loaded.source} names code, which {needs} would import and run:\n    {listed}\n"
            "A run directory may come from anyone, so nothing it names is imported unless you say so",
            fix=f"read that code first; if you trust it, add {TRUST_FLAG}",
        )
