"""The modules that left the package root still import under their old names (ditty.MOVED_MODULES),
as the very same module objects, without making `import ditty` load them."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ditty
from ditty import MOVED_MODULES, moved_to

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_name_imports_the_module_itself(old):
    new = MOVED_MODULES[old]
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) and sys.modules[old] is module
    # The module keeps its own name and spec: relative imports, reload and pickling read them.
    assert module.__name__ == new and module.__spec__.name == new
    assert getattr(ditty, old.removeprefix("ditty.")) is module  # `import ditty; ditty.loss.MSELoss`


def test_the_names_users_import_are_the_same_objects():
    from ditty.diffusion import Scheduler
    from ditty.fused_loss.kernels import fused_linear_cross_entropy
    from ditty.loss import MSELoss
    from ditty.pipeline import Data, ModelFactory, Pipeline
    from ditty.processors import PreProcessor
    from ditty.stages.diffusion import Scheduler as NewScheduler
    from ditty.stages.fused_loss import kernels

    assert Scheduler is NewScheduler and fused_linear_cross_entropy is kernels.fused_linear_cross_entropy
    assert MSELoss is ditty.MSELoss and PreProcessor is ditty.PreProcessor
    assert (Pipeline, ModelFactory, Data) == (ditty.Pipeline, ditty.ModelFactory, ditty.Data)
    # A submodule of a moved package is not loaded a second time under the old name.
    assert sys.modules["ditty.fused_loss.kernels"] is kernels
    assert moved_to("ditty.fused_loss.kernels") == "ditty.stages.fused_loss.kernels"
    assert moved_to("ditty.train.pipeline") is None and moved_to("ditty.lossy") is None


def test_a_recipe_reference_by_an_old_name_resolves():
    from ditty.config.references import import_reference

    assert import_reference("ditty.loss:MSELoss", key="pipeline.loss") is ditty.MSELoss
    assert import_reference("ditty.diffusion:NoisePreProcessor", key="pipeline.preprocessors").__module__ == (
        "ditty.stages.diffusion"
    )


def test_import_ditty_loads_no_moved_module_and_no_torch():
    code = (
        "import sys, ditty; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('ditty.stages', 'ditty.compat'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_every_ditty_name_the_readme_mentions_resolves():
    """README and the docs pages name modules and objects users import (`ditty.loss:MSELoss`,
    `ditty.pipeline.Data`): each resolves. Skipped: the original's names ditty refuses on purpose, the
    recipes' package data, and the dated benchmark records (history: what a name was when it ran)."""
    records = ROOT / "docs" / "benchmarks"
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if records not in p.parents)]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    names = set(re.findall(r"(?<![\w./-])(ditty(?:\.[A-Za-z_]\w*)+(?::\w+)?)", text))
    names -= {f"ditty.{refused}" for refused in ditty._REFUSED} | {"ditty.bundled_recipes"}
    assert len(names) >= 10
    for name in sorted(names):
        parts = name.replace(":", ".").split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        for attribute in parts[cut:]:
            assert hasattr(obj, attribute), f"the docs name {name}, which does not resolve"
            obj = getattr(obj, attribute)
