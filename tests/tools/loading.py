"""The scripts under tools/ are not a package: a test loads one by its file name and runs its main()."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(monkeypatch, name: str, *args: str) -> None:
    """tools/NAME.py's main() with `args` as its command line."""
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
    load_tool(name).main()
