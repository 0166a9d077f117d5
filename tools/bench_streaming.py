"""Streaming benchmark: `data.streaming` (read, tokenize and pack on the fly) against the pre-tokenized
path on the same data, and peak memory as the corpus grows.

    python tools/bench.py --only streaming      # the same as: python tools/bench_streaming.py

Not part of `--quick`. Every contender is a subprocess with one torch thread training the model of
tools/bench.py (3.4M parameters) on packed rows of 512 tokens (8 per step) from the same generated
JSONL corpus (texts of log-normal length). Throughput is bench.py's meter (useful tokens of the
timed forwards over their wall time). Memory is the peak proportional set size (PSS) of the run
and its dataloader workers together, sampled every 0.2 s by this process: PSS counts pages shared
between the forked workers once, where summed RSS would count them once per process. Startup is
the wall time from the process start to the first forward: the pre-tokenized path tokenizes the
whole corpus (or reads its cache) before it, a stream only its first windows.

Sections:
- throughput: pre-tokenized vs streaming in the training process vs streaming with 2 workers.
  Tokens per CPU-second of the training process (one thread; robust to a loaded machine) compares
  the first two fairly; with workers, their reading, tokenizing and packing is not in that CPU
  time, so read their wall-time column (and only on a quiet machine).
- memory: peak PSS of the same runs on corpora of 1x, 10x and 100x rows (rows generated on disk).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
ROWS_1X = 4000  # about 0.9 MB of JSONL
SEQ, ROWS_PER_STEP = 512, 8


def write_corpus(path: Path, rows: int) -> None:
    """Texts of log-normal length (median ~160 bytes, clipped to [16, 2000]), written in blocks."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    with open(path, "w") as f:
        block = []
        for index in range(rows):
            length = int(min(2000, max(16, rng.lognormvariate(math.log(160), 0.9))))
            text = " ".join(rng.choice(words) for _ in range(length // 6 + 1))[:length]
            block.append(json.dumps({"text": f"{index} {text}"}))
            if len(block) == 10_000:
                f.write("\n".join(block) + "\n")
                block = []
        if block:
            f.write("\n".join(block) + "\n")


def worker(a: dict) -> dict:
    """One run of the real Trainer (inside a subprocess); bench.py's meter hooks the model."""
    import torch
    from bench import Meter, ditty_config

    from ditty.train.trainer import Trainer

    torch.set_num_threads(1)
    data = dict(source="file", path=a["corpus"], format="text", max_seq_len=SEQ, packing=True, **a["data"])
    config = ditty_config(Path(a["tmp"]), a["name"], data, a["steps"], ROWS_PER_STEP)
    trainer = Trainer(config)
    meter = Meter(trainer.model, trainer.tokenizer.pad_token_id)
    trainer.train()
    out = meter.result(a["warmup"])
    # The meter stamps events with perf_counter; the launcher's start is wall-clock time.
    first_step_wall = meter.events[0][0] + (time.time() - time.perf_counter())
    out["startup_s"] = first_step_wall - a["started"]
    return out


def run(args: dict, timeout: float = 3600) -> dict:
    """A worker subprocess; adds `peak_pss_mb` of it and its children (sampled every 0.2 s)."""
    import psutil

    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    args = dict(args, started=time.time())
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = [0]

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)]))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate(timeout=timeout)
    sampler.join()
    lines = [line for line in stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"streaming worker {args['name']} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return dict(json.loads(lines[-1][len("BENCH_RESULT ") :]), peak_pss_mb=peak[0] / 2**20)


CONTENDERS = {
    "pre-tokenized (datasets cache), packed": {"streaming": False},
    "streaming, packed on the fly, in the training process": {"streaming": True, "shuffle_buffer_size": 256},
    "streaming, packed on the fly, 2 dataloader workers": {
        "streaming": True,
        "shuffle_buffer_size": 256,
        "num_workers": 2,
    },
}


def main(reps: int = 2, scales: tuple[int, ...] = (1, 10, 100), log=print) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="ditty-bench-stream-"))
    atexit.register(shutil.rmtree, tmp, True)  # corpora and datasets caches; also on Ctrl-C
    started = time.time()
    corpora = {}
    for scale in scales:
        corpora[scale] = tmp / f"corpus-{scale}x.jsonl"
        write_corpus(corpora[scale], ROWS_1X * scale)
        log(f"corpus {scale}x: {ROWS_1X * scale:,} rows, {corpora[scale].stat().st_size / 2**20:.1f} MiB")
    warmup, timed = 3, 12
    base = dict(tmp=str(tmp), warmup=warmup, steps=warmup + timed)
    results: dict[tuple[str, int], list[dict]] = {}
    runs = 0
    for rep in range(reps):
        for scale in scales:
            for name, data in CONTENDERS.items():
                if scale > 10 and not data["streaming"]:
                    continue  # tokenizing 100x up front writes GBs of cache; memory grows already at 10x
                runs += 1
                tag = f"{runs}-{rep}"  # every run its own directory (one run must not resume another)
                cache = str(tmp / f"cache-{tag}")  # a cold datasets cache: every run tokenizes as a first run does
                r = run(dict(base, name=f"s{tag}", corpus=str(corpora[scale]), data=dict(data, cache_dir=cache)))
                log(f"  {name}, {scale}x, rep {rep}: {r['tok_per_s']:.0f} tok/s, {r['peak_pss_mb']:.0f} MiB PSS")
                results.setdefault((name, scale), []).append(r)

    def median(rs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rs)

    baseline = median(results[(next(iter(CONTENDERS)), 1)], "tok_per_cpu_s")
    out = [
        f"streaming benchmark ({reps} repeat(s) interleaved, {warmup} warm-up + {timed} timed steps of "
        f"{ROWS_PER_STEP} x {SEQ} packed tokens, 1 torch thread; {(time.time() - started) / 60:.1f} min)",
        "",
        "| path | corpus | useful tokens / CPU-s of the trainer (median) | ratio (CPU) | tokens / wall-s (median) "
        "| startup to first step (s) | peak PSS, run + workers (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, scale), rs in results.items():
        cpu = median(rs, "tok_per_cpu_s")
        out.append(
            f"| {name} | {scale}x ({corpora[scale].stat().st_size / 2**20:.1f} MiB) | {cpu:,.0f} | "
            f"{cpu / baseline:.3f}x | {median(rs, 'tok_per_s'):,.0f} | {median(rs, 'startup_s'):.1f} | "
            f"{median(rs, 'peak_pss_mb'):.0f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print("BENCH_RESULT " + json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        print(main(log=lambda message: print(message, file=sys.stderr, flush=True)))
