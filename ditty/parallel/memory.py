"""Per-rank memory figures: bytes held in local tensors (shards, not logical sizes) and resident memory,
and the peak over ranks that the metrics records and env.json report (`MemoryReport`).
(Whether a CPU process gives freed memory back to the OS: `ditty.parallel.allocator`.)"""

from __future__ import annotations

import resource
import sys
from typing import Any, Iterable, Optional

import torch


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank stores for `tensor` (a DTensor's local shard, else the tensor).

    A wrapper tensor subclass (torchao's 8-bit optimizer state: uint8 codes, fp32 block scales and
    a code table behind an fp32-looking tensor) counts the tensors it holds, not its shape x dtype.
    """
    return sum(nbytes for _, nbytes in _storages(tensor))


def _storages(tensor: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of the plain tensors behind `tensor`: a DTensor's local shard, the
    inner tensors of a `__tensor_flatten__` subclass, or the tensor itself."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return _storages(tensor.to_local())
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return [pair for name in names for pair in _storages(getattr(tensor, name))]
    return [(tensor.data_ptr(), tensor.numel() * tensor.element_size())]


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(local_nbytes(p) for p in model.parameters())


def optimizer_state_bytes(optimizer: Optional[torch.optim.Optimizer]) -> int:
    """Bytes of every tensor in the optimizer's state on this rank, each storage counted once
    (bitsandbytes shares one pair of 8-bit code tables among all parameters)."""
    if optimizer is None:
        return 0
    seen: dict[tuple[int, int], int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                for pointer, nbytes in _storages(value):
                    # Empty tensors may share a null pointer; their size is 0 anyway.
                    seen[(pointer, nbytes) if pointer else (id(value), nbytes)] = nbytes
    return sum(seen.values())


def gradient_bytes(parameters: Iterable[torch.nn.Parameter]) -> int:
    return sum(local_nbytes(p.grad) for p in parameters if p.grad is not None)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (bytes): Linux's VmHWM, else getrusage.

    Not `ru_maxrss` on Linux: it survives exec, so a process spawned from a big parent (a test
    runner holding a model) starts with the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Start a new peak (Linux: VmHWM restarts from the current RSS); returns whether it could.

    For a per-interval "peak memory" metric: read `peak_rss_bytes()`, then reset.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


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
                from ditty._utils.run_dir import add_to_env

                add_to_env(self.run_dir, {"memory": memory})
        return record


def peak_memory_mb(device: torch.device) -> float:
    """This rank's peak memory in MB (CUDA: allocated by tensors; CPU: peak resident set size), then
    the maximum over ranks. Cost: one small all-reduce; call it only when a record is logged."""
    if device.type == "cuda":
        value = torch.cuda.max_memory_allocated(device)
    else:
        value = peak_rss_bytes()
    return round(_max_over_ranks([float(value) / 2**20])[0], 1)


def _max_over_ranks(values: list[float]) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
