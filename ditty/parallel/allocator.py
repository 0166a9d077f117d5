"""The host allocator policy of CPU processes: whether glibc gives the memory a step frees back to the OS.

glibc raises its mmap threshold to 32 MB after the first large free, so tensors of a few MB then
come from its heap, and the heap keeps what a step frees. Two kinds of CPU run pay for that in
resident memory, and ditty fixes the threshold at 2 MB for them (`returns_freed_memory`):
- fsdp/hsdp on several processes, by default: FSDP's gathered weights and gradients leave holes
  the next block's buffers no longer fit, and the heap grows (2.3 GB of heap for 0.99 GB in use
  per rank, a 105M Llama on 2 ranks);
- every CPU run with DITTY_CPU_ALLOCATOR=return: one process with long rows, where the heap rather
  than the tensors sets the peak (a packed row of 16,384 tokens: 2,009 MB with glibc's defaults,
  1,422 MB returning freed memory).
Each allocation of 2 MB or more then gets fresh pages from the kernel: a page fault per page on
every reuse. torch's huge pages (THP_MEM_ALLOC_ENABLE=1: 2 MB-aligned tensors, faulted in 2 MB at a
time) make that cheaper: about 1.2x glibc's CPU time per step on 2 fsdp ranks instead of 1.7x with
4 KB pages, and 1.05x on one process with long rows (BENCHMARKS.md, "Host memory of FSDP on the
CPU" and `scale`). torch reads the switch once, at its first allocation, so it is set before torch
loads: by `import ditty` for DITTY_CPU_ALLOCATOR=return, and by ditty's launcher for the workers of
a sharded run (`worker_environment`).

DITTY_CPU_ALLOCATOR=glibc (or a MALLOC_* variable or glibc.malloc tunable of the user's own) keeps
glibc's settings. Host memory only: CUDA tensors have their own caching allocator. This module
imports no torch: the memory planner (`ditty check --plan`) and the launcher ask it too.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

ALLOCATOR_ENV = "DITTY_CPU_ALLOCATOR"
""""glibc" (or "off", "0", "none"): keep glibc's own malloc settings. "return": every CPU run, one
process included, returns freed memory (the same 2 MB threshold), in huge pages. Unset or
"default": sharded runs on several CPU processes return it, others keep glibc's settings."""
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
RETURNING = "return"
MMAP_THRESHOLD = 2 * 2**20
"""2 MB: the smallest cost that kept a 2-rank FSDP peak under 0.6 of one process with a margin."""
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20
"""The highest mmap threshold glibc's dynamic adjustment reaches on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""
_KEEP_GLIBC = ("glibc", "off", "0", "none")
# glibc's own variables: a user who set any of them chose a policy, and ditty leaves it alone.
_GLIBC_MALLOC_ENV = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)
# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def cpu_allocator_choice(environ: Optional[Mapping[str, str]] = None) -> str:
    """DITTY_CPU_ALLOCATOR as "default", "glibc" or "return"; another value is a user error (a typo
    would otherwise leave the run on a policy its user did not choose)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ALLOCATOR_ENV, "").strip().lower()
    if value in ("", "default"):
        return "default"
    if value in _KEEP_GLIBC:
        return "glibc"
    if value == RETURNING:
        return RETURNING
    from ditty.config.errors import RecipeError

    raise RecipeError.single(
        f"{environ[ALLOCATOR_ENV]!r} is not a host allocator policy (an environment variable)",
        key=ALLOCATOR_ENV,
        fix=f'unset it, or set "{RETURNING}" (every CPU run returns freed memory) or "glibc" (keep glibc\'s settings)',
    )


def returning_allocator_requested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """DITTY_CPU_ALLOCATOR=return: every CPU run returns freed memory, one process included."""
    return cpu_allocator_choice(environ) == RETURNING


def user_chose_malloc_settings(environ: Optional[Mapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(name in environ for name in _GLIBC_MALLOC_ENV) or "glibc.malloc" in environ.get("GLIBC_TUNABLES", "")


def returns_freed_memory(
    device_type: str, parallel_kind: str, world_size: int, environ: Optional[Mapping[str, str]] = None
) -> bool:
    """Whether a run's CPU processes fix glibc's mmap threshold (see the module docstring): fsdp/hsdp
    on several processes unless the user opted out, any CPU run with DITTY_CPU_ALLOCATOR=return.
    DDP and DeepSpeed keep glibc's defaults: they have no per-step gathers to leave holes."""
    from ditty.config.sections import SHARDED_KINDS

    if device_type != "cpu" or not sys.platform.startswith("linux"):
        return False
    choice = cpu_allocator_choice(environ)
    if choice == "glibc" or user_chose_malloc_settings(environ):
        return False
    return choice == RETURNING or (parallel_kind in SHARDED_KINDS and world_size >= 2)


def heap_mmap_threshold(device_type: str, parallel_kind: str, world_size: int) -> int:
    """Below this size a run's CPU process takes tensors from glibc's heap, which keeps them once
    freed; larger ones are mapped and unmapped. The memory planner counts a step of the former."""
    if returns_freed_memory(device_type, parallel_kind, world_size):
        return MMAP_THRESHOLD
    return GLIBC_MMAP_THRESHOLD_MAX


def return_freed_memory_to_os(mmap_threshold: int = 64 * 1024) -> bool:
    """Fix glibc's mmap threshold at `mmap_threshold` bytes (and its trim threshold at twice that),
    which also stops glibc from raising it; returns whether it applied (glibc only).

    The trainer uses `MMAP_THRESHOLD` (`apply_host_allocator_policy`). The 64 KB default here
    returns more for more page faults: a 105M Llama with AdamW peaked 1.67 GB above its baseline
    instead of 1.96 GB on one process, 0.91 GB per rank on 2 ranks. `malloc_trim` after each step
    kept most of the growth (the peak is within a step).
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


def apply_host_allocator_policy(device_type: str, parallel_kind: str, world_size: int) -> bool:
    """In a process of the run, before its process group starts threads: fix glibc's mmap threshold
    where `returns_freed_memory` says so; returns whether it applied. Warns when torch's huge pages
    are off, since each step then pays 4 KB page faults (1.4-1.7x glibc's CPU time, measured)."""
    if not returns_freed_memory(device_type, parallel_kind, world_size):
        return False
    applied = return_freed_memory_to_os(MMAP_THRESHOLD)
    if applied and os.environ.get(HUGE_PAGES_ENV) != "1":
        import logging

        logging.getLogger("ditty.train").warning(
            "freed memory goes back to the OS without torch's huge pages (%s is not 1 where torch loaded): "
            "each step pays 4 KB page faults, 1.4-1.7x the CPU time; start runs with `ditty run` (its launcher "
            "sets it for the workers), import ditty first, or set %s=1 before starting Python",
            HUGE_PAGES_ENV,
            HUGE_PAGES_ENV,
        )
    return applied


def worker_environment(device_type: str, parallel_kind: str, world_size: int) -> dict[str, str]:
    """What the launcher adds to its workers' environment: torch's huge pages where the workers will
    return freed memory, unless the user set the switch themselves."""
    if returns_freed_memory(device_type, parallel_kind, world_size) and HUGE_PAGES_ENV not in os.environ:
        return {HUGE_PAGES_ENV: "1"}
    return {}


def huge_pages_at_import(environ: Optional[Mapping[str, str]] = None) -> bool:
    """For `import ditty`, before torch loads: whether DITTY_CPU_ALLOCATOR=return will apply, so that
    torch's huge pages should be on. Reads the variable itself rather than through
    `cpu_allocator_choice`: quiet about a bad value (the run reports it as a user error) and without
    importing ditty.config (44 ms) on every `import ditty`."""
    environ = os.environ if environ is None else environ
    requested = environ.get(ALLOCATOR_ENV, "").strip().lower() == RETURNING
    return requested and sys.platform.startswith("linux") and not user_chose_malloc_settings(environ)
