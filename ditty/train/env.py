"""env.json: what ran, so a result can be traced back to versions, code and sizes; and the memory
figures the first metrics record adds to it."""

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

    path = os.path.join(run_dir, "env.json")
    write_text_atomic(path, json.dumps(env, indent=2) + "\n")
    return path


class MemoryReport:
    """Memory figures for metrics records: `peak_mem_mb` (max over ranks) on every record; on the first
    one also this rank's parameter and optimizer-state bytes (max over ranks, from the local tensors:
    shards under FSDP), added to env.json as "memory" by rank 0. Every rank logs the same steps, so
    the collectives match. Optimizer state exists only after the first step, which is why the bytes
    are taken then."""

    def __init__(self, engine: Any, run_dir: str) -> None:
        self.engine = engine
        self.runtime = engine.runtime
        self.run_dir = run_dir
        self.reported = False

    def record(self, model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
        device = self.runtime.device
        record: dict[str, Any] = {"peak_mem_mb": peak_memory_mb(device)}
        if not self.reported:
            self.reported = True
            params, states = self.engine.memory_figures(model, optimizer)
            params, states = _max_over_ranks([params, states])
            if self.runtime.is_main:
                memory = {
                    "parameter_bytes_per_rank": int(params),
                    "optimizer_state_bytes_per_rank": int(states),
                    "world_size": self.runtime.world_size,
                    "parallel": self.engine.config.parallel.kind,
                }
                add_to_env(self.run_dir, {"memory": memory})
        return record


def peak_memory_mb(device: torch.device) -> float:
    """This rank's peak memory in MB (CUDA: allocated by tensors; CPU: peak resident set size), then
    the maximum over ranks. Cost: one small all-reduce; call it only when a record is logged."""
    if device.type == "cuda":
        value = torch.cuda.max_memory_allocated(device)
    else:
        from ditty.parallel.memory import peak_rss_bytes

        value = peak_rss_bytes()
    return round(_max_over_ranks([float(value) / 2**20])[0], 1)


def _max_over_ranks(values: list[float]) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def add_to_env(run_dir: str, values: dict[str, Any]) -> None:
    """Merge `values` into env.json (rewritten atomically); a failure is logged, never raised: a
    figure must never stop training."""
    import logging

    path = os.path.join(run_dir, "env.json")
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
