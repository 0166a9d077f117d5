"""The recipes that ship with ditty (the top-level `recipes/` folder, packaged as
`ditty.bundled_recipes`), found by name for `ditty ls`, `ditty run NAME` and `ditty check NAME`."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class BundledRecipe:
    name: str
    path: Path
    description: str


def _recipe_dir() -> Path | None:
    try:
        folder = resources.files("ditty.bundled_recipes")
        path = Path(str(folder))
        if path.is_dir():
            return path
    except ModuleNotFoundError:
        pass
    # A source checkout that was not installed: recipes/ sits beside the package.
    checkout = Path(__file__).resolve().parents[2] / "recipes"
    return checkout if checkout.is_dir() else None


def bundled_recipes() -> list[BundledRecipe]:
    folder = _recipe_dir()
    if folder is None:
        return []
    return [BundledRecipe(path.stem, path, _description(path)) for path in sorted(folder.glob("*.toml"))]


def find_bundled(name: str) -> Path | None:
    stem = name[:-5] if name.endswith(".toml") else name
    for recipe in bundled_recipes():
        if recipe.name == stem:
            return recipe.path
    return None


def _description(path: Path) -> str:
    """The first comment line of the recipe is its one-line description."""
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if stripped.startswith("#"):
                return stripped.lstrip("#").strip()
            if stripped:
                break
    except OSError:
        pass
    return ""
