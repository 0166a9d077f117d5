"""One variant of `tools/bench.py --gpu`, short and in-process, for finding where GPU time goes:
12 steps logged every 4 (the last interval is steady state), nothing saved, optionally under
cProfile (top functions by own time). BENCHMARKS.md quotes its runs.

    python tools/bench_gpu_probe.py packed flex_attention        # VARIANT ATTENTION [--profile] [--steps N]
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import bench_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", help="a key of bench_gpu.variants: eager, chunked, padded, packed, ...")
    parser.add_argument("attention", help="model.attn_implementation: auto, sdpa, flex_attention, ...")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
    opts = parser.parse_args()

    from ditty.config.loader import parse_recipe
    from ditty.metrics.logger import read_metrics
    from ditty.train.trainer import Trainer

    class Unsaved(Trainer):
        def save(self, final: bool = False):  # a 1B checkpoint is not what is measured here
            return None

    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="ditty-probe-", dir=shm if shm.is_dir() else None))
    atexit.register(shutil.rmtree, tmp, True)  # /dev/shm is memory
    bench_gpu.write_data(tmp)
    bench_gpu.LOG_EVERY = 4
    name, variant = bench_gpu.variants(tmp)[opts.variant]
    variant = {**variant, "attn": opts.attention}
    trainer = Unsaved(parse_recipe(bench_gpu.recipe(tmp, name, variant, opts.steps), source=name).config)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    if opts.profile:
        profiler.enable()
    result = trainer.train()
    if opts.profile:
        profiler.disable()
    print(f"{opts.variant} with {opts.attention}: {time.perf_counter() - started:.1f} s")
    for record in read_metrics(result.run_dir):
        print({key: record.get(key) for key in ("step", "tokens_per_s", "mfu", "peak_mem_mb")})
    if opts.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
