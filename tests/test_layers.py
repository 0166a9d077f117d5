"""The layer table of DESIGN.md: imports point one way, down. Read from the syntax tree, including
imports inside functions, so a lazy import cannot sneak a dependency upward."""

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
    "ditty.processors": 2,
    "ditty.loss": 2,
    "ditty.task_losses": 2,
    "ditty.fused_loss": 2,
    "ditty.objectives": 2,
    "ditty.diffusion": 2,
    "ditty.metrics_logger": 2,
    "ditty.recipe": 3,
    "ditty.plan": 3,
    "ditty.train": 4,
    "ditty.pipeline": 4,
    "ditty.pipeline_options": 4,
    "ditty.model_factory": 4,
    "ditty.model_configs": 4,
    "ditty.porting": 4,
    "ditty.evaluation": 4,
    "ditty.cli": 5,
    "ditty.cli_plan": 5,
    "ditty.__main__": 5,
}
# The package root only re-exports lazily (module __getattr__), so it sits above everything.
ROOT_ALLOWED = {"ditty"}
# Imports between different packages of one layer, each with its reason.
SAME_LAYER_ALLOWED = {
    ("ditty.pipeline", "ditty.train"),  # the Python API is a facade over the one Trainer
    ("ditty.__main__", "ditty.cli"),  # `python -m ditty` is the command line
    ("ditty.cli", "ditty.cli_plan"),  # the command line's `--plan` and `init --method` parts
    ("ditty.contracts", "ditty.config"),  # contract problems are the compiler's Problem type
    ("ditty.diffusion", "ditty.processors"),  # diffusion's processors subclass the base processor types
    # The Python API in three modules: the facade, its keyword mapping, and the model factory.
    ("ditty.pipeline", "ditty.pipeline_options"),
    ("ditty.pipeline", "ditty.model_factory"),
    ("ditty.model_factory", "ditty.model_configs"),
    ("ditty.pipeline_options", "ditty.train"),  # the keywords become the Trainer's Config
    ("ditty.metrics_logger", "ditty.metrics"),  # the original's MetricsLogger reuses the TensorBoard tags
    ("ditty.task_losses", "ditty.loss"),  # the model tasks' losses subclass the loss base types
    ("ditty.fused_loss", "ditty.loss"),  # the fused loss is a LossCalculator with the token-loss convention
    ("ditty.objectives", "ditty.fused_loss"),  # completion log-probabilities go through the fused loss's head
    ("ditty.train", "ditty.evaluation"),  # the trainer runs [eval] harness_tasks on its model
}


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
        assert layer_of(name) is not None, f"{name} is in no layer of DESIGN.md; add it to LAYERS"


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
