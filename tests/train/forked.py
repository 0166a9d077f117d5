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
    "ditty.parallel.memory",
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


def _main(argv: list[str], env: dict[str, str], log: str, peaks: Optional[str]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    from ditty.cli import main

    code = main(argv)
    if peaks:
        # The kernel's high-water marks (KiB): this process, and the largest of its children it has
        # reaped (the dataloader workers, joined when the run ends).
        import json
        import resource

        maxrss = {
            who: resource.getrusage(getattr(resource, f"RUSAGE_{who.upper()}")).ru_maxrss
            for who in ("self", "children")
        }
        Path(peaks).write_text(json.dumps(maxrss))
    os._exit(code)  # no atexit work: the run's own exit path already ran


def context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run(argv: list[str], log: Path, *, env: Optional[dict[str, str]] = None, sample_memory: bool = False):
    """(exit code, peak resident memory in MiB of the run plus its largest dataloader worker, or
    None, the pids of its dataloader workers still alive 15 s after it ended). A run killed by
    SIGKILL exits with -9 and has no peak.

    The peaks are the kernel's high-water marks, taken as the run ends: a sampler outside the run
    catches a peak that lasts a fraction of a second only by luck, and PSS would split the pages the
    run shares with the forkserver.

    Only this thread asks the child for its state: the forkserver sends a child's exit status once,
    over a pipe, and a second reader (a sampler calling `is_alive()` while `join()` waits) meets EOF,
    which multiprocessing reports as exit code 255."""
    import json
    import tempfile

    import psutil

    peaks = Path(tempfile.mkdtemp(prefix="forked-")) / "maxrss.json" if sample_memory else None
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    child = context().Process(target=_main, args=(argv, env, str(log), str(peaks) if peaks else None))
    child.start()
    workers, ended = set(), threading.Event()

    def watch_workers() -> None:
        process = psutil.Process(child.pid)
        while not ended.is_set():
            try:
                workers.update(p.pid for p in process.children(recursive=True))
            except psutil.Error:  # the run ended between two looks
                pass
            ended.wait(0.2)

    watcher = threading.Thread(target=watch_workers, daemon=True)
    watcher.start()
    child.join(timeout=600)
    ended.set()
    watcher.join()
    deadline = time.time() + 15  # torch's worker watchdog notices a dead parent within 5 s
    while time.time() < deadline and _alive(workers):
        time.sleep(0.5)
    peak = None
    if peaks is not None:
        if peaks.exists():  # a killed run wrote none
            maxrss = json.loads(peaks.read_text())
            peak = (maxrss["self"] + maxrss["children"]) / 1024
            peaks.unlink()
        peaks.parent.rmdir()
    return child.exitcode, peak, _alive(workers)


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
