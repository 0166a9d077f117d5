"""Per-rank memory figures: bytes held in local tensors (shards, not logical sizes) and resident memory,
and the host allocator policy of CPU processes (`apply_distributed_allocator_policy`: multi-process
runs by default, every CPU run with DITTY_CPU_ALLOCATOR=return)."""

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
    (`apply_distributed_allocator_policy`, whose docstring gives the trade-off); the 64 KB
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
""""glibc" (or "off"): keep glibc's own malloc settings in multi-process CPU runs. "return": every CPU
run, one process included, returns freed memory (the same 2 MB threshold), in huge pages."""
RETURNING = "return"
DISTRIBUTED_MMAP_THRESHOLD = 2 * 2**20
# glibc's own variables: a user who set any of them chose a policy, and ditty leaves it alone.
_GLIBC_MALLOC_ENV = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)


def returning_allocator_requested() -> bool:
    """DITTY_CPU_ALLOCATOR=return: apply `apply_distributed_allocator_policy` to every CPU run.

    For one process with long rows, where glibc's heap rather than the tensors sets the peak: a
    packed row of 16,384 tokens (2-layer, 256-wide Llama, AdamW, one thread) peaked at 2,009 MB with
    glibc's defaults and 1,422 MB returning freed memory (1,557 and 1,026 MB with activation
    checkpointing), for 4-5% more CPU time per step on an idle machine (up to 30% beside other
    work). That price holds with huge pages only: ditty's `__init__` sets torch's
    THP_MEM_ALLOC_ENABLE=1 for this choice (torch reads it once, at its first allocation, so
    `import ditty` must come before `import torch`); each fresh 2 MB-aligned tensor then faults in
    2 MB pages, where 4 KB pages cost 41-52% (BENCHMARKS.md, `scale`).
    """
    return cpu_allocator_choice() == RETURNING


_KEEP_GLIBC = ("glibc", "off", "0", "none")


def cpu_allocator_choice() -> str:
    """DITTY_CPU_ALLOCATOR as "default", "glibc" or "return"; another value is a user error (a typo
    would otherwise leave the run on a policy its user did not choose)."""
    value = os.environ.get(ALLOCATOR_ENV, "").strip().lower()
    if value in ("", "default"):
        return "default"
    if value in _KEEP_GLIBC:
        return "glibc"
    if value == RETURNING:
        return RETURNING
    from ditty.config.errors import RecipeError

    raise RecipeError.single(
        f"{os.environ[ALLOCATOR_ENV]!r} is not a host allocator policy (an environment variable)",
        key=ALLOCATOR_ENV,
        fix=f'unset it, or set "{RETURNING}" (every CPU run returns freed memory) or "glibc" (keep glibc\'s settings)',
    )


def apply_distributed_allocator_policy() -> bool:
    """Fix glibc's mmap threshold at 2 MB in a CPU process of a multi-process run (or of any CPU run,
    with DITTY_CPU_ALLOCATOR=return); returns whether it applied.

    Applied by default by the trainer for fsdp/hsdp on the CPU with more than one process
    (`ditty.train.runtime.apply_allocator_policy`), before the process group starts its threads.
    Opt out with DITTY_CPU_ALLOCATOR=glibc; ditty also leaves
    glibc alone when MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_,
    MALLOC_ARENA_MAX or a glibc.malloc tunable (GLIBC_TUNABLES) is set (the user's policy wins).

    Why: glibc raises its mmap threshold to 32 MB after the first large free, so FSDP's gathered
    weights and gradients then come from the heap; the small activations a block keeps for backward
    land in the holes they leave, so the next block's 28 MB buffer no longer fits and the heap grows
    (measured: 2.3 GB of heap for 0.99 GB in use per rank). Below the threshold, buffers come from
    fresh pages of the kernel and go back on free: resident memory follows the tensors, at the price
    of a page fault per 4 KB page on every reuse.

    The cost: a page fault per page on every reuse, about 1.5x the CPU time (1.6x the wall time)
    of a step of a 105M Llama on 2 ranks, for a per-rank peak of 0.56-0.57 of one process instead of
    1.1-1.3. 2 MB is the smallest cost that keeps the peak under 0.6 with a margin; the opt-out is
    for runs that want glibc's speed back. One process keeps glibc's defaults unless
    DITTY_CPU_ALLOCATOR=return (`returning_allocator_requested`): for that 105M Llama the fixed
    threshold saved little for 3-5x the page faults, but long rows are another matter. The
    measurements behind these figures, and the settings tried without effect, are in BENCHMARKS.md
    ("Host memory of FSDP on the CPU").
    Host memory only: CUDA tensors have their own caching allocator.
    """
    if cpu_allocator_choice() == "glibc":
        return False
    if any(name in os.environ for name in _GLIBC_MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return return_freed_memory_to_os(DISTRIBUTED_MMAP_THRESHOLD)
