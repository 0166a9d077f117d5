"""The layer table of docs/ARCHITECTURE.md: imports point one way, down; the core never imports the
compatibility API (ditty.compat); the package root holds only __init__.py and __main__.py. Read
from the syntax tree, including imports inside functions, so a lazy import cannot sneak a
dependency upward."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ditty"

# module prefix -> layer; the most specific prefix wins.
LAYERS = {
    "ditty._utils": 0,
    "ditty.config": 1,
    "ditty.contracts": 1,
    "ditty.data": 2,
    "ditty.models": 2,
    "ditty.optim": 2,
    "ditty.parallel": 2,
    "ditty.checkpoint": 2,
    "ditty.metrics": 2,
    "ditty.stages": 2,
    "ditty.objectives": 2,
    "ditty.rl": 2,
    "ditty.recipe": 3,
    "ditty.plan": 3,
    "ditty.train": 4,
    "ditty.compat": 5,
    "ditty.cli": 5,
    "ditty.__main__": 5,
}
# The package root only re-exports lazily (module __getattr__), so it sits above everything.
ROOT_ALLOWED = {"ditty"}
# Imports between different packages of one layer, each with its reason.
SAME_LAYER_ALLOWED = {
    ("ditty.__main__", "ditty.cli"),  # `python -m ditty` is the command line
    ("ditty.contracts", "ditty.config"),  # contract problems are the compiler's Problem type
    ("ditty.metrics", "ditty.checkpoint"),  # lm-eval harness scores are written into the model card
    ("ditty.objectives", "ditty.stages"),  # log-probabilities reuse the fused loss's head, not a second copy
    ("ditty.models", "ditty.stages"),  # a model task's row builds its default loss (ditty.models.tasks)
    ("ditty.models", "ditty.metrics"),  # a model task's row lists its validation metrics
    ("ditty.models", "ditty.objectives"),  # the reward-model row builds its Bradley-Terry loss and pair accuracy
    ("ditty.objectives", "ditty.metrics"),  # the reward model's pair accuracy is a task metric
    # An objective's row builds its parts from the data and the model, as the trainer builds the policy's:
    ("ditty.objectives", "ditty.data"),  # RL reads the prompt stream and collates rollouts as causal-LM samples
    ("ditty.objectives", "ditty.models"),  # a reference model is built as [model] builds the policy
    ("ditty.rl", "ditty.objectives"),  # the public names of the RL parts a user writes, from their homes
    ("ditty.objectives", "ditty.checkpoint"),  # a teacher or reference given by path is verified as final/ is
}
COMPAT = "ditty.compat"
"""The original Ditty's API: it may use the core, the core never uses it."""


def area(module: str) -> str:
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best[1] if best else None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from ditty import train` imports the submodule ditty.train
            if target == "ditty":
                found += [(node.lineno, f"ditty.{alias.name}") for alias in node.names]
    return found


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in ROOT_ALLOWED or path.parent.name == "bundled_recipes":
            continue
        assert layer_of(name) is not None, (
            f"{name} is in no layer of docs/ARCHITECTURE.md; add it to LAYERS and the doc"
        )


def test_imports_point_down():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in ROOT_ALLOWED:
            continue
        own = layer_of(name)
        for line, target in imported_modules(path):
            if not target.startswith("ditty") or target == "ditty":
                continue
            other = layer_of(target)
            if other is None or own is None:
                continue
            sideways = (
                other == own and area(target) != area(name) and (area(name), area(target)) not in SAME_LAYER_ALLOWED
            )
            if other > own or sideways:
                violations.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: {name} (layer {own}) imports {target} (layer {other})"
                )
    assert not violations, "\n".join(violations)


def test_the_package_root_holds_only_init_and_main():
    modules = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_file() and p.suffix == ".pyc"))
    assert modules == ["__init__.py", "__main__.py"], f"put {modules} into a package (docs/ARCHITECTURE.md)"


def test_no_core_module_imports_the_compatibility_api():
    """ditty.compat is the original Ditty's API over the core; the core never reaches back into it,
    neither by the new name nor by an old one that now leads there (ditty.MOVED_MODULES)."""
    from ditty import moved_to

    violations = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in ROOT_ALLOWED or name == COMPAT or name.startswith(COMPAT + "."):
            continue
        for line, target in imported_modules(path):
            resolved = moved_to(target) or target
            if resolved == COMPAT or resolved.startswith(COMPAT + "."):
                violations.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target}")
    assert not violations, "\n".join(violations)


def test_the_library_imports_modules_by_their_names_now():
    """The old module names (ditty.loss, ditty.pipeline, ...) are for users; ditty's own imports use
    the names the layer table knows, so the checks above see the real dependency."""
    from ditty import moved_to

    old = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {target} -> {moved_to(target)}"
        for path in PACKAGE.rglob("*.py")
        for line, target in imported_modules(path)
        if moved_to(target) is not None
    ]
    assert not old, "\n".join(old)


def test_the_compat_checker_sees_a_core_import_of_compat():
    """Negative control for the compat rule, through an old name too."""
    sample = PACKAGE / "train" / "_compat_probe.py"
    sample.write_text("def f():\n    import ditty.pipeline\n    from ditty.compat import porting\n")
    try:
        from ditty import moved_to

        targets = [moved_to(t) or t for _, t in imported_modules(sample)]
        assert targets == ["ditty.compat.pipeline", "ditty.compat"]
    finally:
        sample.unlink()


def test_nothing_imports_recipes_tests_or_tools():
    for path in PACKAGE.rglob("*.py"):
        for line, target in imported_modules(path):
            assert target.split(".")[0] not in ("recipes", "tests", "tools"), f"{path}:{line} imports {target}"


def test_the_checker_sees_an_upward_import(tmp_path):
    """Negative control: a lazy import inside a function is found."""
    sample = PACKAGE / "config" / "_layer_probe.py"
    sample.write_text("def f():\n    from ditty.train import Trainer\n")
    try:
        assert (2, "ditty.train") in imported_modules(sample)
    finally:
        sample.unlink()


# Words that say nothing of a module's role on their own: a module named by one of them lives in
# one package only, so `preference.py` is the [preference] section and `compat` the original
# library's API, never also a loss, a data format or a set of rules.
ROLE_BLIND_WORDS = {"preference", "plan", "compat", "distill", "reward", "rules", "task"}
# tests/ mirrors the package: its root holds the fixtures and the tests of the whole tree only.
TESTS_ROOT_FILES = {
    "__init__.py",
    "conftest.py",
    "test_layers.py",
    "test_readme.py",
    "test_snapshots.py",
    "test_suite_tiers.py",
}


def test_a_role_blind_name_names_one_module_or_package():
    owners: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*"):
        if path.name == "__init__.py" or "__pycache__" in path.parts:
            continue
        if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
            owners.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE.parent)))
    shared = {word: sorted(owners[word]) for word in ROLE_BLIND_WORDS if len(owners.get(word, [])) > 1}
    assert not shared, f"name these by their role (and keep the old import path in ditty.MOVED_MODULES): {shared}"


def test_the_tests_root_holds_only_the_cross_cutting_tests():
    root = PACKAGE.parent / "tests"
    stray = sorted(p.name for p in root.glob("*.py") if p.name not in TESTS_ROOT_FILES)
    assert not stray, f"move these into the tests/ folder of the part of ditty they test: {stray}"
