"""env.json: what ran, so a result can be traced back to versions, code and sizes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Optional

import torch

_PACKAGES = (
    "torch",
    "transformers",
    "datasets",
    "peft",
    "accelerate",
    "torchao",
    "bitsandbytes",
    "tokenizers",
    "safetensors",
)


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit(path: str) -> Optional[dict[str, Any]]:
    """Commit (and dirtiness) of the git checkout holding `path`, or None. Cost: two short git calls."""
    try:
        head = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(status.strip())}


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts: tied tensors once, 4-bit weights at their real size."""
    from ditty.models.adapters import trainable_parameter_counts

    return trainable_parameter_counts(model)


def environment(
    model: torch.nn.Module, *, world_size: int, seed: int, device: torch.device, extra: Optional[dict] = None
) -> dict:
    import ditty

    trainable, total = count_parameters(model)
    ditty_dir = os.path.dirname(os.path.abspath(ditty.__file__))
    env = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ditty_version": getattr(ditty, "__version__", None) or _version("ditty"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in _PACKAGES},
        "git": {"ditty": git_commit(ditty_dir), "cwd": git_commit(os.getcwd())},
        "device": str(device),
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "seed": seed,
        "parameters": {"trainable": trainable, "total": total},
    }
    env.update(extra or {})
    return env


def write_env(run_dir: str, env: dict) -> str:
    path = os.path.join(run_dir, "env.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(env, f, indent=2)
        f.write("\n")
    return path
