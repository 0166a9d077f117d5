"""How many torch threads a CPU process uses, and the hint when a CPU run is far slower than it should be.

torch starts one thread per core. Two cases make that slow, often by 10-30x on a small machine:
- a small model: its matrix products are too small to split, and the threads spend the step
  synchronising (the 0.7M-parameter demo ran at 4,300-8,800 tokens/s on one thread, 176-271 on two
  of two busy cores);
- busy cores: threads that wait for a core another job holds stall every matrix product.
So, unless `run.num_threads` or OMP_NUM_THREADS says otherwise, a process takes one thread for a
model under SMALL_MODEL_PARAMETERS, and otherwise only the cores other work leaves free (the
1-minute load average, less this process), shared among the processes of this node.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger("ditty.parallel")

SMALL_MODEL_PARAMETERS = 20_000_000
"""Below this, one thread per process is the fastest choice on CPU: the products of a model this
small (hidden size up to about 384) are too small for threads to share."""

SLOW_MFU = 0.05
"""A CPU run below this model-FLOPs utilisation of the measured peak (the demo runs at about 30%
on one thread) is waiting on something other than arithmetic, most often oversubscribed cores."""


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str
    """Why, in words for the screen; "" when nothing needs saying (the user's choice, or all cores)."""


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_cores(cores: int) -> int:
    """Cores other processes keep busy: the 1-minute load average less this process's own one."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0
    return max(0, min(cores, round(load - 1.0)))


def choose_cpu_threads(
    requested: int, *, parameters: Optional[int], local_processes: int = 1, busy: Optional[int] = None
) -> ThreadChoice:
    """The torch thread count of one CPU process: `requested` (run.num_threads) when set, else
    OMP_NUM_THREADS when set, else 1 for a small model, else the free cores shared among the
    `local_processes` of this node."""
    if requested:
        return ThreadChoice(requested, "")
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return ThreadChoice(max(1, int(os.environ["OMP_NUM_THREADS"])), "")
    cores = available_cores()
    share = max(1, cores // max(1, local_processes))
    if share == 1:
        return ThreadChoice(1, "")
    if parameters is not None and parameters < SMALL_MODEL_PARAMETERS:
        return ThreadChoice(
            1,
            f"CPU threads: 1 per process, as a {parameters / 1e6:.1f}M-parameter model trains fastest on one "
            f"(set run.num_threads to choose)",
        )
    busy = busy_cores(cores) if busy is None else busy
    free = max(1, (cores - busy) // max(1, local_processes))
    if free < share:
        return ThreadChoice(
            free,
            f"CPU threads: {free} per process, as other work keeps {busy} of {cores} cores busy "
            "(set run.num_threads to choose)",
        )
    return ThreadChoice(share, "")


def apply_cpu_threads(config: Any, parameters: Optional[int], *, announce: bool) -> ThreadChoice:
    """Choose (choose_cpu_threads) and set torch's thread count for this CPU process; print why when
    ditty chose fewer threads than cores and `announce` (rank 0)."""
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    choice = choose_cpu_threads(config.run.num_threads, parameters=parameters, local_processes=local)
    torch.set_num_threads(choice.threads)
    if announce and choice.reason:
        print(choice.reason, flush=True)
    return choice


def slow_cpu_hint(record: dict, device_type: str) -> Optional[str]:
    """A line for the screen when a CPU run's logged throughput is far below what its cores can do
    (model-FLOPs utilisation under SLOW_MFU), pointing at the thread setting; None otherwise."""
    mfu = record.get("mfu")
    if device_type != "cpu" or mfu is None or mfu >= SLOW_MFU or "tokens_per_s" not in record:
        return None
    import torch

    threads = torch.get_num_threads()
    cores = available_cores()
    busy = busy_cores(cores)
    advice = "try --run.num_threads 1" if threads > 1 else "fewer processes, or a machine less busy"
    return (
        f"slow: {record['tokens_per_s']:,.0f} tokens/s is {100 * mfu:.1f}% of this CPU's measured peak "
        f"({threads} torch thread(s) per process on {cores} cores, {busy} busy with other work); {advice}"
    )
