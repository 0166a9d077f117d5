"""Per-rank memory figures: bytes held in local tensors (shards, not logical sizes) and resident memory.
(Whether a CPU process gives freed memory back to the OS: `ditty.parallel.allocator`.)"""

from __future__ import annotations

import resource
import sys
from typing import Iterable, Optional

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
