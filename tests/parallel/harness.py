"""Run a function on N real gloo ranks (spawned processes) with short timeouts, and tiny models.

`run_ranks(fn, world_size, *args)` returns each rank's return value, or fails the test with the
failing rank's traceback. A hang ends at `timeout` seconds (every process is killed), never later.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
import signal
import socket
import time
import traceback

import torch
from torch import nn

COLLECTIVE_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, results, args, collective_timeout=COLLECTIVE_TIMEOUT_S):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)  # 2 shared cores: one thread per rank keeps ranks from fighting
    try:
        from ditty.parallel.env import destroy_distributed, init_distributed

        init_distributed("cpu", timeout=collective_timeout)
        value = fn(rank, world_size, *args)
        destroy_distributed()
        # Plain bytes: a tensor put on a Queue travels as a shared-memory handle that dies with us.
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - the parent shows it
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn,
    world_size: int,
    *args,
    timeout: float = 120.0,
    collective_timeout: float = COLLECTIVE_TIMEOUT_S,
    fresh_interpreters: bool = False,
) -> list:
    """`collective_timeout`: how long a collective waits for the other ranks (raise it when ranks
    compile with torch.compile: one rank may compile its graphs much later than the other).

    Each rank is a new process forked from a server that imported torch, transformers and ditty
    once per test process (tests/train/forked.py), instead of a new interpreter that imports them
    again (several seconds of CPU per rank). `fresh_interpreters=True` spawns new interpreters:
    for tests that measure a rank's memory, which then holds only what the rank itself imported."""
    if fresh_interpreters:
        ctx = multiprocessing.get_context("spawn")
    else:
        from tests.train import forked

        ctx = forked.context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, port, results, args, collective_timeout), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"ranks {sorted(set(range(world_size)) - set(out))} did not finish in {timeout:.0f} s"
                )
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise AssertionError(_failure_report(procs, results, errors)) from None
                continue
            if status == "error":
                errors[rank] = value
                raise AssertionError(_failure_report(procs, results, errors))
            out[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world_size)]


FAILURE_GRACE_S = 15.0


def _failure_report(procs, results, errors: dict[int, str]) -> str:
    """What every rank did, once one failed: the first message to arrive is often a rank's "Connection
    reset by peer" from a collective whose peer had died, so the others' tracebacks and exit codes are
    gathered (for FAILURE_GRACE_S at most: a peer that hangs waits for its collective timeout)."""
    deadline = time.monotonic() + FAILURE_GRACE_S
    while True:
        try:
            rank, status, value = results.get(timeout=0.2)
        except queue.Empty:  # done once every rank has ended and its last message is read
            if all(p.exitcode is not None for p in procs) or time.monotonic() > deadline:
                break
            continue
        if status == "error":
            errors[rank] = value
    parts = []
    for rank, p in enumerate(procs):
        if rank in errors:
            parts.append(f"rank {rank} failed:\n{errors[rank]}")
        elif p.exitcode is None:
            parts.append(f"rank {rank}: still running {FAILURE_GRACE_S:.0f} s after the first failure")
        elif p.exitcode < 0:
            name = signal.Signals(-p.exitcode).name
            cause = " (from outside: the kernel's OOM killer, say)" if name == "SIGKILL" else ""
            parts.append(f"rank {rank}: died from {name}{cause} without a traceback")
        elif p.exitcode > 0:
            parts.append(f"rank {rank}: exited with code {p.exitcode} without a traceback")
        else:
            parts.append(f"rank {rank}: finished")
    return "\n".join(parts)


def run_ranks_until_killed(fn, world_size: int, *args, timeout: float = 300.0) -> list[int]:
    """Run `fn` on `world_size` ranks that are expected to kill themselves (SIGKILL, as a kill -9 from
    outside would); returns each rank's exit code once every rank has ended. A rank that returns
    instead, or fails, fails the test."""
    from tests.train import forked

    ctx = forked.context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, port, results, args), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        while any(p.exitcode is None for p in procs):
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks still running after {timeout:.0f} s")
            try:
                rank, status, value = results.get(timeout=0.5)
            except queue.Empty:
                continue
            raise AssertionError(f"rank {rank} ended with {status!r} instead of being killed:\n{value}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    assert all(code == -signal.SIGKILL for code in codes), codes
    return codes


# --- a tiny model with blocks (uneven widths, so FSDP pads its shards) ---------------------------


class TinyBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 2 * width + 1)
        self.down = nn.Linear(2 * width + 1, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class TinyNet(nn.Module):
    _no_split_modules = ["TinyBlock"]

    def __init__(self, dim: int = 8, width: int = 13, depth: int = 2):
        super().__init__()
        self.inp = nn.Linear(dim, width)
        self.blocks = nn.ModuleList(TinyBlock(width) for _ in range(depth))
        self.out = nn.Linear(width, dim)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def global_batches(steps: int, batch: int = 8, seq: int = 5, dim: int = 8, seed: int = 1):
    """(x, y, mask) per step; masks differ per row, so ranks hold different token counts."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, seq, dim, generator=g)
        y = torch.randn(batch, seq, dim, generator=g)
        lengths = torch.randint(1, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).float()
        out.append((x, y, mask))
    return out


def token_loss_sum(model, x, y, mask):
    """Sum over supervised tokens (the numerator of the per-token mean)."""
    return (((model(x) - y) ** 2).sum(-1) * mask).sum()


def full_state(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    state = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        state[name.removeprefix("module.")] = value.detach().clone()
    return state


def full_grads(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        grads[name.removeprefix("module.")] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return grads


def relative_error(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in b)
    den = sum(float(b[k].pow(2).sum()) for k in b)
    return (num / den) ** 0.5
