"""Peak dense FLOP/s of the device a rank trains on: the denominator of MFU.

CUDA: a table of known accelerators by compute dtype (the vendors' dense figures, without the 2x
of structured sparsity). CPU: a short fp32 matrix-product probe (best of several timings) per
machine and thread count, cached in ~/.cache/ditty/peak_flops.json (or under $DITTY_CACHE_DIR),
which keeps the best reading. `[logging] peak_tflops` overrides both.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Optional

# Substring of torch.cuda.get_device_name() -> dense TFLOP/s per compute dtype. First match wins, so
# more specific names come first ("H100 PCIe" before "H100", "A100" before "A10").
# fp32: true fp32 matrix products (torch's default); tf32 when torch allows TF32 matmuls.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("GB200", {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "tf32": 1250.0, "fp32": 80.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 80.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "fp8": 1671.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("H800", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6}),
    # GeForce RTX 4090: Ada Lovelace whitepaper, tensor-core math with fp32 accumulate.
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "tf32": 82.6, "fp32": 82.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "tf32": 60.0, "fp32": 30.3}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
    ("MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4}),
]
_PRECISION_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def table_peak_tflops(device_name: str, dtype: str) -> Optional[float]:
    """The table's dense TFLOP/s for a CUDA device name and compute dtype, None when unknown."""
    for key, figures in PEAK_TFLOPS:
        if key in device_name:
            return figures.get(dtype)
    return None


def compute_dtype(precision: str, *, fp8: bool = False, tf32: bool = False) -> str:
    """The dtype the matrix products of a run compute in ("fp8", "bf16", "fp16", "tf32", "fp32")."""
    if fp8:
        return "fp8"
    dtype = _PRECISION_DTYPE.get(precision, "fp32")
    return "tf32" if dtype == "fp32" and tf32 else dtype


def device_peak_flops(device, precision: str = "fp32", *, fp8: bool = False, override_tflops=None) -> Optional[float]:
    """Peak FLOP/s of one device of this rank: the override, the table (CUDA), or the CPU probe.
    None for an accelerator the table does not know (set `[logging] peak_tflops`)."""
    if override_tflops:
        return float(override_tflops) * 1e12
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        tflops = table_peak_tflops(torch.cuda.get_device_name(device), compute_dtype(precision, fp8=fp8, tf32=tf32))
        return tflops * 1e12 if tflops else None
    if device.type == "cpu":
        return cpu_peak_flops()
    return None


_PROBED: dict[str, float] = {}


def cpu_peak_flops(threads: Optional[int] = None) -> float:
    """fp32 matrix-product FLOP/s of this machine at `threads` torch threads (default: the current
    setting), per CPU model, thread count and torch version.

    Each process probes once (a fraction of a second) and the machine's cache keeps the highest
    figure ever measured: on a shared machine a probe taken under load reads low, and the best
    reading converges to what the cores can do. So every run on the machine divides by the same
    (or a better) peak, and the first run's reading does not stick if it was taken under load.
    """
    import torch

    threads = threads or torch.get_num_threads()
    key = f"{_cpu_name()}|threads={threads}|torch={torch.__version__}"
    if key not in _PROBED:
        _PROBED[key] = probe_cpu_flops(threads)
    path = os.path.join(_cache_dir(), "peak_flops.json")
    cached = _read(path)
    best = max(float(cached.get(key, 0.0)), _PROBED[key])
    if best > float(cached.get(key, 0.0)):
        cached[key] = best
        _write(path, cached)
    return best


def probe_cpu_flops(threads: int, size: int = 1024, repeats: int = 5) -> float:
    """Best of `repeats` timings of 3 fp32 [size x size] products: about 0.3 s at 100 GFLOP/s. The
    best, not the mean: the machine may be shared, and the peak is what the hardware can do."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # Its own generator: drawing from the global one would shift a run's RNG stream (dropout),
        # and a resumed run, which probes again, would no longer repeat the uninterrupted one.
        generator = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
        torch.mm(a, b)  # warm-up: allocations, thread pool
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(3):
                torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        return 3 * 2 * size**3 / best
    finally:
        torch.set_num_threads(previous)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def _cache_dir() -> str:
    root = os.environ.get("DITTY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ditty"
    )
    return root


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: str, values: dict) -> None:
    """Atomic replace; a cache that cannot be written only costs a probe next time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
