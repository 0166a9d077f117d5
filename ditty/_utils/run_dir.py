"""A run's `env.json`: what ran (versions, code, machine, sizes), written first at the start of every
run, so it also marks a directory as a ditty run (`is_ditty_run`).

Torch-free at import, so `ditty check RUN_DIR` can tell a run directory (whose code it must not import) from a
user's recipe without loading the trainer.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Optional

RUN_MARKER = "env.json"


def is_ditty_run(path: str) -> bool:
    marker = os.path.join(path, RUN_MARKER)
    if not os.path.isfile(marker):
        return False
    try:
        with open(marker, encoding="utf-8") as f:
            return "ditty_version" in json.load(f)
    except (OSError, ValueError):
        return False


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


def environment(
    parameters: tuple[int, int], *, world_size: int, seed: int, device: Any, extra: Optional[dict] = None
) -> dict:
    """What env.json records: versions, code, machine, sizes; `parameters` is (trainable, total)."""
    import torch

    import ditty

    trainable, total = parameters
    ditty_dir = os.path.dirname(os.path.abspath(ditty.__file__))
    env = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ditty_version": ditty.__version__ or _version("ditty"),
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
    from ditty._utils.atomic import write_text_atomic

    path = os.path.join(run_dir, RUN_MARKER)
    write_text_atomic(path, json.dumps(env, indent=2) + "\n")
    return path


def add_to_env(run_dir: str, values: dict[str, Any]) -> None:
    """Merge `values` into env.json (rewritten atomically); a failure is logged, never raised: a
    figure must never stop training."""
    import logging

    path = os.path.join(run_dir, RUN_MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            env = json.load(f)
        env.update(values)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(env, f, indent=2)
            f.write("\n")
        os.replace(path + ".tmp", path)
    except (OSError, ValueError) as exc:
        logging.getLogger("ditty.train").warning("could not add memory figures to env.json: %s", exc)
