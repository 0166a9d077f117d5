"""Accelerators the planner knows: memory here, dense peak throughput by compute dtype from the
one table that MFU uses too (ditty.metrics.peak: the makers' dense figures, no sparsity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ditty.config.errors import RecipeError
from ditty.metrics.peak import table_peak_tflops
from ditty.plan.settings import GiB, parse_memory

_TABLE_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Device:
    name: str
    memory: int
    table_name: str
    """The name in ditty.metrics.peak's table (a substring of what CUDA reports)."""

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for a compute dtype ("bfloat16", "float16", "float32"; others count as float32)."""
        found = table_peak_tflops(self.table_name, _TABLE_DTYPE.get(dtype, "fp32"))
        return found if found is not None else table_peak_tflops(self.table_name, "fp32")


DEVICES: dict[str, Device] = {
    d.name.lower(): d
    for d in (
        Device("H100", 80 * GiB, "H100"),
        Device("H200", 141 * GiB, "H200"),
        Device("A100-80GB", 80 * GiB, "A100"),
        Device("A100-40GB", 40 * GiB, "A100"),
        Device("L4", 24 * GiB, "L4"),
        Device("RTX4090", 24 * GiB, "RTX 4090"),
    )
}
ALIASES = {"a100": "a100-80gb", "rtx-4090": "rtx4090", "4090": "rtx4090", "h100-sxm": "h100"}
DEFAULT_MFU = 0.40
"""Model FLOPs utilisation assumed for the time estimate (printed with it): what well-tuned dense
bf16 training of 7-70B models reaches on these GPUs (torchtitan reports 38-50% on H100)."""


def find_device(name: str) -> Optional[Device]:
    key = name.strip().lower()
    return DEVICES.get(ALIASES.get(key, key))


def device_and_memory(text: str) -> tuple[Optional[Device], int]:
    """`--gpu-memory` takes a size ("80GB") or a GPU name ("H100", "RTX4090"): the device (when
    named, or the only one of that memory size) and its memory in bytes."""
    device = find_device(text)
    if device is not None:
        return device, device.memory
    try:
        memory = parse_memory(text)
    except RecipeError:
        raise RecipeError.single(
            f"--gpu-memory {text!r} is neither a size nor a GPU ditty knows",
            fix="write a size like 80GB, or one of " + ", ".join(d.name for d in DEVICES.values()),
        ) from None
    same = [d for d in DEVICES.values() if d.memory == memory]
    return (same[0] if len(same) == 1 else None), memory


def reference_device(memory: Optional[int]) -> Device:
    """The device a time estimate assumes when only a memory size was given: the table's device
    with the least memory that is at least that size, the newest first on a tie (an H100 when
    nothing is said)."""
    order = ["h100", "h200", "a100-80gb", "a100-40gb", "rtx4090", "l4"]
    if memory is None:
        return DEVICES["h100"]
    fitting = [DEVICES[k] for k in order if DEVICES[k].memory >= memory]
    if not fitting:
        return DEVICES["h200"]
    least = min(d.memory for d in fitting)
    return next(d for d in fitting if d.memory == least)
