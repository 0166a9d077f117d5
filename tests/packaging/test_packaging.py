"""A plain (non-editable) install ships the bundled recipes inside the package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_every_bundled_recipe(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("ditty-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for recipe in (ROOT / "recipes").glob("*.toml"):
        assert f"ditty/bundled_recipes/{recipe.name}" in names
    for module in (
        "cli/__init__.py",
        "cli/commands.py",
        "compat/pipeline.py",
        "stages/loss.py",
        "stages/fused_loss/head.py",
    ):
        assert f"ditty/{module}" in names
