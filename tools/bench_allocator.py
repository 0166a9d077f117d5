"""Host memory and step time of FSDP on the CPU under each host allocator policy (ditty.parallel.allocator).

    python tools/bench_allocator.py [--rounds 3]     # or: python tools/bench.py --only allocator

A ~105M-parameter Llama (13 layers, 768 wide, MLP 2048, 8,192-token vocabulary), AdamW, a global
batch of 4 x 64 tokens, 4 steps (tests/parallel/workers.py `memory_run`, the loop of
tests/parallel/test_memory.py), one torch thread per process, gloo. Contenders, interleaved by round:
- 1 process, glibc's defaults (the reference for the peak);
- 2 ranks, glibc's defaults (DITTY_CPU_ALLOCATOR=glibc);
- 2 ranks, ditty's policy (2 MB mmap threshold) with 4 KB pages (THP_MEM_ALLOC_ENABLE=0: a worker
  started without ditty's launcher, torch imported first);
- 2 ranks, ditty's policy with torch's huge pages (what `ditty run --nproc-per-node 2` gives).
Per contender: peak resident memory above the after-import baseline (max over ranks) and its ratio
to the lowest peak of one process; CPU seconds, wall seconds and minor page faults per step per rank (steps 2-4, max
over ranks). Ranges are over the rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20
CONTENDERS = [
    ("1 process, glibc defaults", 1, {"DITTY_CPU_ALLOCATOR": "glibc"}),
    ("2 ranks, glibc defaults (DITTY_CPU_ALLOCATOR=glibc)", 2, {"DITTY_CPU_ALLOCATOR": "glibc"}),
    ("2 ranks, 2 MB threshold, 4 KB pages (THP_MEM_ALLOC_ENABLE=0)", 2, {"THP_MEM_ALLOC_ENABLE": "0"}),
    ("2 ranks, 2 MB threshold + torch's huge pages (ditty's default)", 2, {"THP_MEM_ALLOC_ENABLE": "1"}),
]
_OURS = ("DITTY_CPU_ALLOCATOR", "THP_MEM_ALLOC_ENABLE")


def measure(model_dir: str, world: int, env: dict) -> dict:
    """One contender: the ranks are spawned with `env` (torch reads THP_MEM_ALLOC_ENABLE at start)."""
    from tests.parallel import workers
    from tests.parallel.harness import run_ranks

    # the contenders' settings only: a MALLOC_* variable or glibc tunable of the caller's would turn
    # ditty's policy off in the ranks
    theirs = [n for n in os.environ if n.startswith("MALLOC_") or n == "GLIBC_TUNABLES"]
    saved = {name: os.environ.pop(name, None) for name in (*_OURS, *theirs)}
    os.environ.update(env)
    try:
        ranks = run_ranks(workers.memory_run, world, model_dir, "sharded", 4, timeout=900)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
    steps = range(1, 4)  # the first step grows the heap and the caches
    return {
        "peak": max(r["peak_above_baseline"] for r in ranks) / MB,
        "cpu": [max(r["step_cpu_seconds"][i] for r in ranks) for i in steps],
        "wall": [max(r["step_seconds"][i] for r in ranks) for i in steps],
        "faults": [max(r["step_page_faults"][i] for r in ranks) for i in steps],
        "losses": [sum(r["losses"][i] for r in ranks) / world for i in range(4)],
    }


def span(values, fmt="{:.2f}") -> str:
    low, high = min(values), max(values)
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}-{fmt.format(high)}"


def main(rounds: int = 3, log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> str:
    sys.path.insert(0, str(ROOT))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="ditty-bench-allocator-") as work:
        from tests.parallel.workers import save_llama_105m

        model_dir = os.path.join(work, "llama-105m")
        save_llama_105m(model_dir)
        for round_ in range(rounds):
            for name, world, env in CONTENDERS:
                result = measure(model_dir, world, env)
                results[name].append(result)
                log(f"round {round_ + 1}/{rounds} {name}: peak {result['peak']:.0f} MB, CPU s/step {result['cpu']}")
    reference = [r["peak"] for r in results[CONTENDERS[0][0]]]
    base = min(reference)
    lines = [
        f"Host allocator policies, 105M Llama, fsdp, {rounds} round(s); peak RSS above the after-import baseline,"
        f" ratio to one process's lowest peak ({span(reference, '{:.0f}')} MB); per step per rank, steps 2-4:",
        "",
        "| policy | peak RSS (MB) | / one process | CPU s/step | wall s/step | minor faults/step (k) |",
        "|---|---|---|---|---|---|",
    ]
    for name, _, _ in CONTENDERS:
        runs = results[name]
        peaks = [r["peak"] for r in runs]
        lines.append(
            f"| {name} | {span(peaks, '{:.0f}')} | {span([p / base for p in peaks])} "
            f"| {span([c for r in runs for c in r['cpu']])} | {span([w for r in runs for w in r['wall']])} "
            f"| {span([f / 1000 for r in runs for f in r['faults']], '{:.0f}')} |"
        )
    # Every policy trains the same model on the same batches: the losses agree (to float rounding).
    first = results[CONTENDERS[0][0]][0]["losses"]
    agree = all(
        abs(a - b) <= 1e-4 * abs(b) for runs in results.values() for r in runs for a, b in zip(r["losses"], first)
    )
    lines += [
        "",
        f"losses agree across policies and rounds (1e-4): {agree}; one process: {[round(x, 4) for x in first]}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    print(main(parser.parse_args().rounds))
