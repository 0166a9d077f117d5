"""Muon against AdamW on the CPU (issue 43): one optimizer step, and the whole `ditty run tiny_sft`.

    python tools/bench_muon.py step                 # one optimizer step on tiny_sft's model (a few seconds)
    python tools/bench_muon.py run [--reps 1]       # `ditty run tiny_sft`, --optimizer.kind muon then adamw

step: tiny_sft's model (0.72M parameters: 28 hidden matrices go to Muon, the rest to AdamW) with
random gradients; the median time of one `optimizer.step()` for AdamW (fused), Muon with
Newton-Schulz in float32 (`optimizer.ns_dtype = "float32"`, what "auto" picks on a CPU without
bfloat16 units) and in bfloat16 (torch.optim.Muon's own step), on one thread, in this thread's CPU
time and in wall time, alternating; also the dtype "auto" picks here.

run: the bundled recipe as a user runs it (`ditty run tiny_sft --optimizer.kind muon`, then the
AdamW default), each in its own process, one after the other (muon, adamw, muon, adamw, ...):
wall time of the whole command, its CPU time (user + sys), the held-out exact match at each
evaluation, and the 1-minute load average at the start and end of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_times(repeats: int = 7) -> str:
    from dataclasses import replace

    import torch

    from ditty.config.loader import load_recipe
    from ditty.data.tokenizer import byte_tokenizer
    from ditty.models import build_model
    from ditty.optim import build_optimizer
    from ditty.optim.newton_schulz import ns_dtype

    torch.set_num_threads(1)
    config = load_recipe("tiny_sft").config
    torch.manual_seed(0)
    model = build_model(config.model, tokenizer=byte_tokenizer(), device="cpu")
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter) * 1e-2
    kinds = {
        "AdamW (fused)": replace(config.optimizer, kind="adamw"),
        "Muon, Newton-Schulz in float32": replace(config.optimizer, kind="muon", ns_dtype="float32"),
        "Muon, Newton-Schulz in bfloat16 (torch's)": replace(config.optimizer, kind="muon", ns_dtype="bfloat16"),
    }
    optimizers = {name: build_optimizer(opt, model) for name, opt in kinds.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in optimizers}
    for repeat in range(repeats + 1):  # the first round warms up (state allocation)
        for name, optimizer in optimizers.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            optimizer.step()
            if repeat:
                times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    adamw_cpu = statistics.median(t[1] for t in times["AdamW (fused)"])
    lines = [
        "Command: `python tools/bench_muon.py step`",
        "",
        f'One thread; load average {os.getloadavg()[0]:.1f}; `optimizer.ns_dtype = "auto"` picks '
        f"{ns_dtype(torch.device('cpu'))} on this CPU.",
        "",
        "| optimizer | step, CPU time (ms) | step, wall (ms) | CPU time / AdamW's |",
        "|---|---|---|---|",
    ]
    for name, ts in times.items():
        cpu = statistics.median(t[1] for t in ts)
        wall = statistics.median(t[0] for t in ts)
        lines.append(f"| {name} | {1000 * cpu:,.2f} | {1000 * wall:,.2f} | {cpu / adamw_cpu:,.1f}x |")
    return "\n".join(lines)


def one_run(kind: str, out: Path) -> dict:
    command = [sys.executable, "-m", "ditty", "run", "tiny_sft", "--optimizer.kind", kind]
    command += ["--logging.progress", "false", "--run.output_dir", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_start, wall = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=4 * 3600)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluations = {r["step"]: r["val_exact_match"] for r in records if "val_exact_match" in r}
    threads = json.loads((out / "env.json").read_text()).get("torch_threads")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall_s=wall, cpu_s=cpu, em=evaluations, load=(load_start, os.getloadavg()[0]), threads=threads)


def runs(reps: int, log) -> str:
    results: dict[str, list[dict]] = {"muon": [], "adamw": []}
    with tempfile.TemporaryDirectory(prefix="ditty-muon-") as tmp:
        for rep in range(reps):
            for kind in results:
                r = one_run(kind, Path(tmp) / f"{kind}-{rep}")
                results[kind].append(r)
                log(f"  {kind} rep {rep}: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU, EM {r['em']}")
    lines = [
        f"Command: `python tools/bench_muon.py run --reps {reps}`",
        "",
        "| optimizer | repeat | wall time (s) | CPU time (s) | torch threads | load average (start, end) "
        "| held-out exact match by step |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, rs in results.items():
        for rep, r in enumerate(rs):
            em = ", ".join(f"{step}: {value:.3f}" for step, value in sorted(r["em"].items()))
            lines.append(
                f"| {kind} | {rep} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['threads']} | "
                f"{r['load'][0]:.1f}, {r['load'][1]:.1f} | {em} |"
            )
    wall = {k: statistics.median(r["wall_s"] for r in rs) for k, rs in results.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in rs) for k, rs in results.items()}
    ratios = f"wall {wall['muon'] / wall['adamw']:.2f}x, CPU time {cpu['muon'] / cpu['adamw']:.2f}x"
    lines += ["", f"Muon / AdamW (medians): {ratios}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["step", "run"])
    parser.add_argument("--reps", type=int, default=1)
    opts = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    print(step_times() if opts.what == "step" else runs(opts.reps, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
