"""Muon's Newton-Schulz orthogonalisation in the dtype that is fast on the device (imports torch).

torch.optim.Muon always iterates in bfloat16. That suits GPUs; on a CPU without bfloat16 matrix
units the products are emulated: on the 2-core AMD EPYC this was built on, a 128 x 128 `addmm`
takes 1.4-1.7 ms in bfloat16 against 0.06 ms in float32 (one thread), and a Muon step of tiny_sft
took 3.6 s against AdamW's 3.9 ms (BENCHMARKS.md). Even a CPU with AVX512-BF16 ran a step on 16
matrices of 128 x 128 in 87 ms against AdamW's 1.1 ms (issue 43).

`ns_dtype(device, choice)` picks the dtype: bfloat16 on CUDA (tensor cores; torch's choice), and on
the CPU whichever of bfloat16 and float32 runs a 128 x 128 product (a small model's hidden matrix,
where bfloat16 gains the least) faster on one core, measured once per process
(`optimizer.ns_dtype = "auto"`). `Muon` is torch.optim.Muon with that dtype: in bfloat16 it is
torch's own step; in float32 the same arithmetic (same coefficients, momentum, Nesterov,
learning-rate adjustment, decoupled weight decay, the same "momentum_buffer" state, so checkpoints
load either way) with the products in float32, whose update matches torch's to bfloat16's precision
(tests/optim/test_newton_schulz.py).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PROBE_SIZE = 128
_CHOSEN: dict[str, torch.dtype] = {}
"""device type -> the dtype "auto" chose in this process (the probe runs once)."""


def ns_dtype(device: torch.device, choice: str = "auto") -> torch.dtype:
    """The dtype of the Newton-Schulz products: `choice` when it names one, else bfloat16 off the CPU
    and the faster of the two on the CPU (`probe_cpu_dtype`)."""
    if choice != "auto":
        return NS_DTYPES[choice]
    if device.type != "cpu":
        return torch.bfloat16
    if "cpu" not in _CHOSEN:
        _CHOSEN["cpu"] = _agreed(probe_cpu_dtype())
    return _CHOSEN["cpu"]


def _agreed(dtype: torch.dtype) -> torch.dtype:
    """The same dtype on every rank: bfloat16 only where every rank measured it faster. DDP keeps
    replicas equal by applying the same update everywhere; ranks orthogonalising in different
    dtypes would drift apart silently. One all-reduce of one number, once per process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return dtype
    vote = torch.tensor([1 if dtype == torch.bfloat16 else 0])
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    return torch.bfloat16 if int(vote) else torch.float32


def probe_cpu_dtype(size: int = PROBE_SIZE, repeats: int = 3) -> torch.dtype:
    """bfloat16 when one Newton-Schulz product (`addmm` of size x size) runs faster in bfloat16 than in
    float32 on one core of this CPU, else float32.

    On one torch thread and timed in this thread's CPU time: the question is whether the core has
    bfloat16 units, and on a busy machine a 2-thread product waits for the second core (a 128 x 128
    fp32 `addmm` read 26-66 ms of wall time beside other jobs, against 0.07 ms alone). Best of
    `repeats`; float32 is timed first and bfloat16 stops as soon as it is slower, so a CPU without
    bfloat16 units spends a few milliseconds here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)  # its own: the global generator's stream stays the run's
        base = torch.randn(size, size, generator=generator)
        fp32 = _best_time(base, repeats, limit=math.inf)
        bf16 = _best_time(base.bfloat16(), repeats, limit=fp32)
    finally:
        torch.set_num_threads(threads)
    return torch.bfloat16 if bf16 < fp32 else torch.float32


def _best_time(x: torch.Tensor, repeats: int, limit: float) -> float:
    torch.addmm(x, x, x)  # warm-up: the kernel's first call allocates and dispatches
    best = math.inf
    for _ in range(repeats):
        start = time.thread_time()
        torch.addmm(x, x, x, beta=-0.5, alpha=0.5)
        best = min(best, time.thread_time() - start)
        if best >= limit:
            break
    return best


def orthogonalize(
    matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration (torch.optim.Muon's) with products in `dtype`."""
    a, b, c = coefficients
    x = matrix.to(dtype)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: Any, shape: torch.Size) -> float:
    """torch.optim.Muon's per-shape learning rate: "original" sqrt(max(1, rows / cols)), or
    "match_rms_adamw" 0.2 sqrt(max(rows, cols))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Muon(torch.optim.Muon):
    """torch.optim.Muon whose Newton-Schulz products run in `ns_dtype` (bfloat16: torch's own step)."""

    def __init__(self, params: Any, *, ns_dtype: torch.dtype = torch.bfloat16, **options: Any) -> None:
        super().__init__(params, **options)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if self.ns_dtype == torch.bfloat16:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update.to(param.dtype), alpha=-adjusted_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss
