"""ditty's own thread count against 1 and 2 threads (issue 43): `ditty run tiny_sft` without
`--run.num_threads` must run within 10% of the faster fixed count, alone and beside a 2-thread job.

    python tools/bench_threads.py                       # both models, alone and beside a 2-thread job, 3 repeats
    python tools/bench_threads.py --models wide --conditions alone --reps 5 --steps 1000

Each run is `ditty run tiny_sft` in its own process with evaluation and the progress bar off, for
`--steps` steps, at `--run.num_threads 1`, `2` and `0` (ditty's choice: the rule, then for a run of
500 steps or more the timed first steps of ditty.parallel.threads), the three in rotating order
within each repeat. Throughput is the run's own record of its last step: tokens / elapsed_s, from the
start of the loop (so ditty's timing steps are inside it), not counting start-up. "beside" runs a
2-thread job (fp32 products of 1024 x 1024 matrices in a loop) for the whole of each run. Models:
"tiny" is tiny_sft as bundled (0.72M parameters); "wide" is tiny_sft widened to 3.4M (256 wide,
768 MLP, 4 layers; tools/bench.py's model) with the same data and batch. The table gives medians,
the load average before each run, and which count ditty chose and why (env.json). On a 2-core
machine shared with other work the 2-thread figures measure the neighbours as much as ditty: the
acceptance asks for a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRIAL_MIN_STEPS = 500  # ditty.parallel.threads.TRIAL_MIN_STEPS; only the runs import ditty
WIDE = (
    "{ hidden_size = 256, intermediate_size = 768, num_hidden_layers = 4, num_attention_heads = 4, "
    "num_key_value_heads = 4, max_position_embeddings = 64, tie_word_embeddings = false }"
)
MODELS = {"tiny": [], "wide": ["--model.config", WIDE]}
BUSY_JOB = """
import sys, time, torch
torch.set_num_threads(2)
a = torch.randn(1024, 1024)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a = (a @ a.T).tanh()
"""


def run_once(model: str, threads: int, steps: int, out: Path) -> dict:
    command = [sys.executable, "-m", "ditty", "run", "tiny_sft", *MODELS[model], "--run.output_dir", str(out)]
    command += ["--run.num_threads", str(threads), "--train.steps", str(steps), "--train.eval_every", "0"]
    command += ["--train.log_every", str(steps), "--logging.progress", "false"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMP_NUM_THREADS", None)
    load = os.getloadavg()[0]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in reversed(records) if r.get("step") == steps and "elapsed_s" in r)
    environment = json.loads((out / "env.json").read_text())
    return {
        "tok_per_s": last["tokens"] / last["elapsed_s"],
        "elapsed_s": last["elapsed_s"],
        "load": load,
        "threads": environment.get("torch_threads"),
        "why": environment.get("threads_chosen", ""),
    }


def compare(models: list[str], conditions: list[str], reps: int, steps: int, tmp: Path, log) -> list[dict]:
    rows = []
    for model in models:
        for condition in conditions:
            runs: dict[int, list[dict]] = {1: [], 2: [], 0: []}
            for rep in range(reps):
                order = list(runs)[rep % 3 :] + list(runs)[: rep % 3]  # rotate: no setting always goes first
                for threads in order:
                    busy = None
                    if condition == "beside":
                        busy = subprocess.Popen([sys.executable, "-c", BUSY_JOB, "3600"])
                        time.sleep(2)  # let it start its threads
                    try:
                        r = run_once(model, threads, steps, tmp / f"{model}-{condition}-{threads}-{rep}")
                    finally:
                        if busy is not None:
                            busy.kill()
                            busy.wait()
                    runs[threads].append(r)
                    log(
                        f"  {model} {condition} num_threads={threads} rep {rep}: {r['tok_per_s']:,.0f} tok/s "
                        f"(load {r['load']:.1f}, ran on {r['threads']}) {r['why']}"
                    )
            medians = {n: statistics.median(r["tok_per_s"] for r in rs) for n, rs in runs.items()}
            best = max(medians[1], medians[2])
            rows.append(
                dict(
                    model=model,
                    condition=condition,
                    one=medians[1],
                    two=medians[2],
                    auto=medians[0],
                    ratio=medians[0] / best,
                    picks=[r["threads"] for r in runs[0]],
                    loads=[r["load"] for rs in runs.values() for r in rs],
                    why=[r["why"] for r in runs[0]],
                )
            )
    return rows


def render(rows: list[dict], command: str) -> str:
    out = [
        f"Command: `{command}`",
        "",
        "| model | condition | 1 thread (tok/s) | 2 threads (tok/s) | ditty's choice (tok/s) | choice / faster fixed "
        "| counts ditty ran on | load average |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        loads = f"{min(r['loads']):.1f}-{max(r['loads']):.1f}"
        out.append(
            f"| {r['model']} | {r['condition']} | {r['one']:,.0f} | {r['two']:,.0f} | {r['auto']:,.0f} | "
            f"{r['ratio']:.3f} | {', '.join(map(str, r['picks']))} | {loads} |"
        )
    out += ["", "Why ditty chose (env.json `threads_chosen`, one line per repeat):", ""]
    for r in rows:
        for why in r["why"]:
            out.append(f"- {r['model']}, {r['condition']}: {why or '(the rule; no timing)'}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,wide")
    parser.add_argument("--conditions", default="alone,beside")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    opts = parser.parse_args(argv)
    if opts.steps < TRIAL_MIN_STEPS:
        parser.error(f"--steps {opts.steps}: ditty times threads only in runs of {TRIAL_MIN_STEPS} steps or more")
    models, conditions = opts.models.split(","), opts.conditions.split(",")
    if set(models) - set(MODELS) or set(conditions) - {"alone", "beside"}:
        parser.error(f"models from {sorted(MODELS)}, conditions from ['alone', 'beside']")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ditty-threads-") as tmp:
        rows = compare(models, conditions, opts.reps, opts.steps, Path(tmp), log)
    print(render(rows, "python tools/bench_threads.py " + " ".join(argv if argv is not None else sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
