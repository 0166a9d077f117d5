"""Run `ditty ...` in a fresh process that starts without paying for the imports again.

Each run is a real process (so SIGKILL kills it, its dataloader workers and all), forked from a
multiprocessing forkserver that imported torch, transformers, datasets and the trainer once. A
`python -m ditty` subprocess spends most of its start importing those; on a busy 2-core machine
that is tens of seconds per run, which a test that kills and resumes a run five times cannot afford.
The forkserver runs no torch computation, so forking it is safe (unlike forking a process whose
OpenMP pool has run).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Optional

PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "datasets",
    "matplotlib.pyplot",
    "torch.distributed.checkpoint",
    "ditty.cli",
    "ditty.train.trainer",
    "ditty.train.env",
    "ditty.models.build",
    "ditty.checkpoint",
    "ditty.metrics.plot",
    "ditty.data.streaming",
    "ditty.data.workers",
    "tests.train.resume_hooks",
]


def _main(argv: list[str], env: dict[str, str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    from ditty.cli import main

    code = main(argv)
    os._exit(code)  # no atexit work: the run's own exit path already ran


def context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run(argv: list[str], log: Path, *, env: Optional[dict[str, str]] = None, sample_memory: bool = False):
    """(exit code, peak proportional set size in MiB of the run and its workers, or None). A run
    killed by SIGKILL exits with -9."""
    import psutil

    child = context().Process(target=_main, args=(argv, {"OMP_NUM_THREADS": "1", **(env or {})}, str(log)))
    child.start()
    peak = [0]

    def sample() -> None:
        process = psutil.Process(child.pid)
        while child.is_alive():
            try:
                tree = [process, *process.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_full_info().pss for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True) if sample_memory else None
    if sampler:
        sampler.start()
    child.join(timeout=600)
    if sampler:
        sampler.join()
    return child.exitcode, (peak[0] / 2**20 if sample_memory else None)
