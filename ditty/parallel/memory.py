"""Per-rank memory figures: bytes held in local tensors (shards, not logical sizes) and resident memory,
and the host allocator policy of CPU processes in a multi-process run (`apply_distributed_allocator_policy`)."""

from __future__ import annotations

import os
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


# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def return_freed_memory_to_os(mmap_threshold: int = 64 * 1024) -> bool:
    """Make glibc give freed tensor memory back to the OS; returns whether it applied (glibc only).

    Fixes glibc's mmap threshold at `mmap_threshold` bytes (and its trim threshold at twice that),
    which also stops glibc from raising the threshold itself (up to 32 MB after the first large
    free). Every allocation of at least `mmap_threshold` bytes then gets fresh pages from the kernel
    and gives them back when freed: resident memory follows the live tensors, at the price of a page
    fault per 4 KB page on every reuse. Multi-process CPU runs get it with 2 MB by default
    (`apply_distributed_allocator_policy`, whose docstring has the measured trade-off); the 64 KB
    default here is an opt-in for CPU runs where resident memory matters more than speed, a single
    process included (105M Llama, AdamW: peak above baseline 1.67 GB instead of 1.96 GB on one
    process, 0.91 GB per rank on 2 ranks). `malloc_trim` after each step kept most of the growth
    (the peak is within a step). Host memory only: CUDA tensors have their own caching allocator.
    """
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2 * int(mmap_threshold))
    )


# The policy of a CPU process in a multi-process run (see `apply_distributed_allocator_policy`).
ALLOCATOR_ENV = "DITTY_CPU_ALLOCATOR"
""""glibc" (or "off"): keep glibc's own malloc settings in multi-process CPU runs."""
DISTRIBUTED_MMAP_THRESHOLD = 2 * 2**20
# glibc's own variables: a user who set any of them chose a policy, and ditty leaves it alone.
_GLIBC_MALLOC_ENV = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)


def apply_distributed_allocator_policy() -> bool:
    """Fix glibc's mmap threshold at 2 MB in a CPU process of a multi-process run; returns whether it applied.

    Applied by default by the trainer for fsdp/hsdp on the CPU with more than one process
    (`ditty.train.distributed.apply_allocator_policy`), before the process group starts its threads.
    Opt out with DITTY_CPU_ALLOCATOR=glibc; ditty also leaves
    glibc alone when MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_,
    MALLOC_ARENA_MAX or a glibc.malloc tunable (GLIBC_TUNABLES) is set (the user's policy wins).

    Why: glibc raises its mmap threshold to 32 MB after the first large free, so FSDP's gathered
    weights and gradients then come from the heap; the small activations a block keeps for backward
    land in the holes they leave, so the next block's 28 MB buffer no longer fits and the heap grows
    (measured: 2.3 GB of heap for 0.99 GB in use per rank). Below the threshold, buffers come from
    fresh pages of the kernel and go back on free: resident memory follows the tensors, at the price
    of a page fault per 4 KB page on every reuse.

    Measured (tests/parallel/workers.py `memory_run`: 105M Llama, AdamW, global batch 4 x 64
    tokens, 4 steps, 2 gloo ranks on 2 cores shared with other jobs, interleaved rounds; peak RSS
    above the after-import baseline, max over ranks; ratio to one process with glibc's defaults,
    1955-1975 MB; CPU time per step per rank, steps 2-4, which the other jobs disturb less than wall
    time; minor page faults per step per rank; wall time per step from a quieter interleaved run):

        policy (2 ranks)                  peak RSS MB  ratio       CPU s/step  faults/step  wall s/step
        glibc default (dynamic)           2170-2583    1.10-1.32   2.3-3.9     50-90k       4.4-4.9
        mmap threshold 16 MB              1326-1384    0.68-0.70   3.2-3.7     570-670k
        mmap threshold 8 MB               1297-1311    0.66-0.67   3.5-4.2     680-730k
        mmap threshold 4 MB               1143-1170    0.58-0.60   3.7-4.1     850-910k
        mmap threshold 2 MB (default)     1106-1114    0.56-0.57   3.6-4.2     890-980k     7.3-7.8
        mmap threshold 64 KB              911          0.46        3.9-4.4     1170k        8.0-9.4

    No glibc setting reaches 0.6 without the page faults: 2 MB costs about 1.5x glibc's CPU time
    (1.6x its wall time) per step on this model, 64 KB (`return_freed_memory_to_os()`) about 1.6x
    (1.75x); 2 MB is the smallest cost that meets 0.6 with a margin (4 MB sits on it); the opt-out
    is for runs that want glibc's speed back. Also measured, without effect or worse:
    MALLOC_ARENA_MAX 1 or 2 (2310 and 2495 MB: the waste is in one heap, not in the communication
    threads' arenas); transparent huge pages for malloc's mmaps (GLIBC_TUNABLES=glibc.malloc.hugetlb=1,
    with the 2 MB threshold: 3.3-9.5 CPU s/step on one process instead of 2.1-2.5, compaction and
    2 MB zeroing). An earlier measurement found `malloc_trim` after each step keeps most of the
    growth (the heap grows within the first step). One process keeps glibc's defaults: there the
    fixed threshold saves little (1891-1902 MB at 2 MB, 1670 MB at 64 KB) for 3-5x the page faults.
    Host memory only: CUDA tensors have their own caching allocator.
    """
    if os.environ.get(ALLOCATOR_ENV, "").strip().lower() in ("glibc", "off", "0", "none"):
        return False
    if any(name in os.environ for name in _GLIBC_MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return return_freed_memory_to_os(DISTRIBUTED_MMAP_THRESHOLD)
