"""How long a run takes: tokens and FLOPs per step, steps per epoch, and the wall time.

FLOPs count the matrix products (2 per multiply-add): per token, the forward does 2 x (weights of
every linear layer, the output head included) plus causal attention, 2 x sequence x q-width per
layer (flash kernels skip the masked half). The backward doubles the forward where weights train
and computes only the input gradients of frozen weights (LoRA, QLoRA); full activation
checkpointing adds one forward. The wall time divides by the accelerators' dense peak at an
assumed utilisation (printed), or extrapolates a measured probe (`ditty check --plan --probe N`).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Optional

from ditty.plan.architecture import ModelShape
from ditty.plan.devices import DEFAULT_MFU, Device
from ditty.plan.parameters import HeldTensor
from ditty.plan.settings import Settings

QUANTIZED_SLOWDOWN = 0.75
"""Utilisation factor for 4-bit bases: dequantizing every weight in the forward and the backward
costs time that FLOPs do not count (bitsandbytes QLoRA runs about 1.3x slower than bf16 LoRA)."""


@dataclass(frozen=True)
class TimePlan:
    tokens_per_step: int
    flops_per_step: float
    steps: Optional[int]
    steps_per_epoch: Optional[int]
    samples: Optional[int]
    seconds_per_step: Optional[float]
    basis: str
    """How the seconds per step were obtained (peak and MFU, or the probe)."""

    @property
    def total_seconds(self) -> Optional[float]:
        if self.seconds_per_step is None or self.steps is None:
            return None
        return self.seconds_per_step * self.steps


def flops_per_token(shape: ModelShape, s: Settings, held: list[HeldTensor]) -> float:
    base = [t for t in held if t.matmul and t.group not in ("LoRA adapters", "modules_to_save copies")]
    linear = sum(t.numel for t in base)
    adapters = sum(t.numel for t in held if t.matmul and t.group == "LoRA adapters")
    trainable_linear = sum(t.numel for t in held if t.trainable and t.matmul)
    attention = 2 * s.seq_len * shape.q_dim * shape.num_layers
    forward = 2 * (linear + adapters) + attention
    backward = 2 * (linear + adapters) + 2 * trainable_linear + 2 * attention
    recompute = forward if s.activation_checkpointing == "full" else 0
    return forward + backward + recompute


def plan_time(
    shape: ModelShape,
    s: Settings,
    held: list[HeldTensor],
    config: Any,
    device: Optional[Device],
    *,
    mfu: float = DEFAULT_MFU,
    seconds_per_micro_batch: Optional[float] = None,
) -> TimePlan:
    from ditty.plan.objective import reference_flops_per_token

    global_batch = config.train.global_batch_size
    rows = s.objective.rows_per_sample if s.objective is not None else 1  # a preference pair is 2 rows
    tokens = global_batch * rows * s.seq_len
    flops = tokens * (flops_per_token(shape, s, held) + reference_flops_per_token(shape, s, held))
    samples = training_samples(config)
    per_epoch = samples // global_batch if samples is not None and not config.data.packing else None
    steps = config.train.steps
    if steps is None and per_epoch is not None:
        steps = max(1, int(per_epoch * config.train.epochs))
    seconds, basis = None, ""
    if seconds_per_micro_batch is not None:
        seconds = seconds_per_micro_batch * s.accumulation
        basis = f"measured: {seconds_per_micro_batch:.2f} s per micro-batch x {s.accumulation} per step on this machine"
    elif device is not None and s.device == "cuda":
        dtype = s.compute_dtype or s.weight_dtype
        peak = device.peak_tflops(dtype) * 1e12
        used = mfu * (QUANTIZED_SLOWDOWN if s.quant == "bnb-4bit" else 1.0)
        seconds = flops / (s.world_size * peak * used)
        basis = (
            f"{device.name} {dtype} peak {peak / 1e12:g} TFLOP/s x {s.world_size} at {used:.0%} utilisation (assumed)"
        )
    else:
        basis = "no accelerator peak for this device: `--probe N` measures N steps here"
    return TimePlan(tokens, flops, steps, per_epoch, samples, seconds, basis)


def training_samples(config: Any) -> Optional[int]:
    """Training samples, when countable without reading the data: a built-in dataset's size, or
    the rows of local jsonl/csv/text files (lines) and parquet files (metadata); None otherwise."""
    data = config.data
    holdout = 0.0 if data.val_path else data.val_fraction
    if data.source == "builtin":
        return int(data.num_samples * (1 - holdout))
    if data.source != "file" or not data.path:
        return None
    total = 0
    for path in sorted(glob.glob(os.path.expanduser(data.path))):
        rows = _rows(path)
        if rows is None:
            return None
        total += rows
    return int(total * (1 - holdout))


def _rows(path: str) -> Optional[int]:
    extension = os.path.splitext(path)[1].lower()
    if extension in (".jsonl", ".txt", ".csv"):
        with open(path, "rb") as handle:
            lines = sum(1 for line in handle if line.strip())
        return lines - 1 if extension == ".csv" else lines
    if extension == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return None
