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
import re
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
    # What a run imports on its way (found by diffing sys.modules around one run).
    "ditty.train.entry",
    "ditty.recipe",
    "ditty.optim",
    "ditty.loss",
    "deepspeed",
    "pydantic",
    "einops",
    "torch.profiler",
    "transformers.convert_slow_tokenizer",
    "transformers.integrations",
    "PIL.PngImagePlugin",
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
    """(exit code, peak `data_pss_kib` in MiB of the run and its workers or None, the pids of its
    dataloader workers still alive 15 s after it ended). A run killed by SIGKILL exits with -9."""
    import psutil

    child = context().Process(target=_main, args=(argv, {"OMP_NUM_THREADS": "1", **(env or {})}, str(log)))
    child.start()
    peak, workers = [0], set()

    def sample() -> None:
        process = psutil.Process(child.pid)
        while child.is_alive():
            try:
                tree = process.children(recursive=True)
                workers.update(p.pid for p in tree)
                if sample_memory:
                    peak[0] = max(peak[0], sum(data_pss_kib(p.pid) for p in [process, *tree]) * 1024)
            except (psutil.Error, OSError):  # a worker or the run ended between listing and reading
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    child.join(timeout=600)
    sampler.join()
    deadline = time.time() + 15  # torch's worker watchdog notices a dead parent within 5 s
    while time.time() < deadline and _alive(workers):
        time.sleep(0.5)
    return child.exitcode, (peak[0] / 2**20 if sample_memory else None), _alive(workers)


_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ \S+\s*(.*)$")


def data_pss_kib(pid: int) -> int:
    """Proportional set size (KiB) of a process without its code: anonymous and shared memory and
    mapped data files, leaving out executable mappings and shared libraries. A library's pages are
    shared with every process on the machine that maps it, so its share moves with whatever else
    runs (another test's processes on the other xdist worker: 33 MB between two runs once), not
    with what this run holds."""
    total, counted = 0, True
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            mapping = _MAPPING.match(line)
            if mapping:
                permissions, path = mapping.groups()
                counted = "x" not in permissions and ".so" not in os.path.basename(path)
            elif counted and line.startswith("Pss:"):
                total += int(line.split()[1])
    return total


def _alive(pids: set[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive
