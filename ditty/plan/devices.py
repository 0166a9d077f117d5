"""Accelerators the planner knows: memory and dense peak throughput by compute dtype.

Peak figures are the makers' dense (no sparsity) numbers in TFLOP/s: bf16/fp16 tensor-core math
with fp32 accumulation, as PyTorch runs it; float32 is the CUDA-core figure (PyTorch uses TF32
tensor cores for fp32 only when allowed). Sources: NVIDIA's H100 and H200 product pages (SXM), the
A100 datasheet, the L4 datasheet and the Ada Lovelace whitepaper (RTX 4090, fp32 accumulate).
This table is the planner's own; ditty/metrics' MFU table (issue 16) may replace it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ditty.config.errors import RecipeError
from ditty.plan.settings import GiB, parse_memory


@dataclass(frozen=True)
class Device:
    name: str
    memory: int
    peak_tflops: dict[str, float]
    """Dense peak by compute dtype ("bfloat16", "float16", "float32")."""


DEVICES: dict[str, Device] = {
    d.name.lower(): d
    for d in (
        Device("H100", 80 * GiB, {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
        Device("H200", 141 * GiB, {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
        Device("A100-80GB", 80 * GiB, {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
        Device("A100-40GB", 40 * GiB, {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
        Device("L4", 24 * GiB, {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3}),
        Device("RTX4090", 24 * GiB, {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6}),
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
