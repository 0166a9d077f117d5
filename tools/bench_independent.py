"""ditty on packed rows against an independent bare PyTorch loop (issue 43; tools/bench.py section
"independent").

    python tools/bench_independent.py                      # 8 x 128 and 2 x 2,048, 3 interleaved repeats, 2 threads
    python tools/bench_independent.py --shapes 8x128 --reps 5 --threads 1
    python tools/bench_independent.py --profile /tmp/prof  # plus a cProfile of one run of each, by phase
    python tools/bench_independent.py --baseline main      # and ditty as of git ref main, interleaved (before/after)
    python tools/bench.py --only independent

The bare loop shares no code with ditty (its worker never imports it; the run fails if ditty turns
up in sys.modules): it builds transformers' LlamaForCausalLM from a LlamaConfig, reads the same
JSONL rows, encodes them itself (one token per byte, BOS and EOS, loss on the completion and EOS),
packs them itself (greedy, in order, into rows of T tokens), and trains them as plain causal rows
(input ids only: no mask, no position ids, so its samples are NOT isolated, the fastest a loop can
be) with its own loss (token cross-entropy, mean over supervised tokens), clipping at 1.0 and fused
AdamW. ditty trains the same rows through its Trainer with `data.packing = true` (samples isolated,
`model.packed_attention = "auto"`), its default logging every 50 steps, no evaluation or checkpoints.

The model is tools/bench.py's 3.4M-parameter Llama (4 layers, 256 wide, 4 heads, byte vocabulary of
259, fp32, eager), the data tiny_sft's: two-digit additions, about 10 tokens a sample. Both count the
useful (non-padding) tokens of each step and stamp wall and CPU (user + sys, all threads) time at the
start of each step (the bare loop in its loop, ditty from a forward pre-hook on the model, which comes
after its data for the step); throughput is the tokens of the timed steps over the time from the
first timed step to the end of the last. Contenders alternate (bare, ditty, bare, ditty, ...) and the
table shows medians. `--profile` adds, for one extra run of each, the share of the timed steps spent
in each phase (data, mask, forward, loss, backward, clipping, optimizer, logging) from cProfile.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = dict(
    vocab_size=259,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)
LR, BETAS, EPS, CLIP, SEED = 1e-3, (0.9, 0.95), 1e-8, 1.0, 0
PAD, BOS, EOS, BYTE_OFFSET = 0, 1, 2, 3
SHAPES = {"8x128": (8, 128), "2x2048": (2, 2048)}
STEPS = {128: (5, 60), 2048: (3, 20)}
"""(warm-up, timed) steps by row width: about 8 s of timed steps each on 2 threads."""


def write_rows(path: Path, count: int = 20_000, seed: int = 20240229) -> None:
    """Two-digit additions as prompt/completion rows (tiny_sft's data, generated here)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(count):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n")


# ============================================================================ the bare loop (no ditty)


def encode(row: dict) -> tuple[list[int], list[int]]:
    prompt = [BOS] + [BYTE_OFFSET + b for b in row["prompt"].encode()]
    answer = [BYTE_OFFSET + b for b in row["completion"].encode()] + [EOS]
    return prompt + answer, [-100] * len(prompt) + answer


def pack(encoded: list, cursor: int, rows: int, width: int):
    """`rows` rows of `width` tokens from the samples at `cursor` on (cycling), greedy in order (a
    sample that does not fit starts the next row), right-padded: (input ids, labels, useful tokens,
    the next cursor)."""
    import torch

    ids, labels, useful = [], [], 0
    for _ in range(rows):
        row_ids: list[int] = []
        row_labels: list[int] = []
        while not row_ids or len(row_ids) + len(encoded[cursor % len(encoded)][0]) <= width:
            sample_ids, sample_labels = encoded[cursor % len(encoded)]
            row_ids += sample_ids[:width]
            row_labels += sample_labels[:width]
            cursor += 1
        useful += len(row_ids)
        ids.append(row_ids + [PAD] * (width - len(row_ids)))
        labels.append(row_labels + [-100] * (width - len(row_labels)))
    return torch.tensor(ids), torch.tensor(labels), useful, cursor


def bare_loop(a: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    rows, width = a["rows"], a["width"]
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA, max_position_embeddings=max(1024, width))).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=True)
    with open(a["data"]) as f:
        encoded = [encode(json.loads(line)) for line in f]
    random.Random(SEED).shuffle(encoded)
    cursor = 0
    stamps: list[tuple[float, float, int]] = []
    profiler = _profiler(a)
    for step in range(a["warmup"] + a["timed"]):
        if step == a["warmup"] and profiler:
            profiler.enable()
        stamp = (time.perf_counter(), time.process_time())
        ids, labels, useful, cursor = pack(encoded, cursor, rows, width)
        stamps.append((*stamp, useful))
        logits = model(input_ids=ids, use_cache=False).logits  # training: no KV cache to build
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", file=sys.stderr)
    stamps.append((time.perf_counter(), time.process_time(), 0))
    if profiler:
        profiler.disable()
    if "ditty" in sys.modules or any(name.startswith("ditty.") for name in sys.modules):
        raise RuntimeError("the bare loop imported ditty")
    return _throughput(stamps, a["warmup"]) | _phases(profiler, a, BARE_PHASES, a["timed"])


# ============================================================================ ditty


def ditty_run(a: dict) -> dict:
    import torch

    from ditty.config.loader import parse_recipe
    from ditty.train.trainer import Trainer

    rows, width = a["rows"], a["width"]
    recipe = RECIPE.format(
        out=Path(a["tmp"]) / a["name"],
        threads=a["threads"],
        llama=", ".join(f"{k} = {json.dumps(v)}" for k, v in LLAMA.items()),
        positions=max(1024, width),
        data=a["data"],
        width=width,
        steps=a["warmup"] + a["timed"],
        rows=rows,
        lr=LR,
        betas=list(BETAS),
        eps=EPS,
        clip=CLIP,
    )
    trainer = Trainer(parse_recipe(recipe).config)
    pad = trainer.tokenizer.pad_token_id
    stamps: list[tuple[float, float, int]] = []
    profiler = _profiler(a)

    def stamp(module, args, kwargs):
        if not torch.is_grad_enabled():
            return
        if profiler and len(stamps) == a["warmup"]:
            profiler.enable()
        stamps.append((time.perf_counter(), time.process_time(), int((kwargs["input_ids"] != pad).sum())))

    trainer.model.register_forward_pre_hook(stamp, with_kwargs=True)
    if profiler:  # the profile ends at the last step's forward, before the final save
        trainer.model.register_forward_pre_hook(
            lambda *_: profiler.disable() if len(stamps) == a["warmup"] + a["timed"] else None
        )
    trainer.train()
    stamps.append((time.perf_counter(), time.process_time(), 0))
    # The last interval holds the final save; stop at the last step's start and count one step fewer.
    return _throughput(stamps[:-1], a["warmup"]) | _phases(profiler, a, DITTY_PHASES, a["timed"] - 1)


RECIPE = """
[run]
name = "bench"
output_dir = "{out}"
seed = 0
device = "cpu"
num_threads = {threads}
[model]
init = "random"
architecture = "llama"
config = {{ {llama}, max_position_embeddings = {positions} }}
[tokenizer]
kind = "byte"
[data]
source = "file"
path = "{data}"
format = "prompt_completion"
max_seq_len = {width}
packing = true
val_fraction = 0.0
[train]
steps = {steps}
global_batch_size = {rows}
micro_batch_size = {rows}
max_grad_norm = {clip}
precision = "fp32"
log_every = 50
eval_every = 0
eval_samples = 0
[optimizer]
kind = "adamw"
lr = {lr}
betas = {betas}
eps = {eps}
weight_decay = 0.0
[scheduler]
kind = "constant"
warmup_steps = 0
[checkpoint]
every = 0
[logging]
progress = false
"""


# ============================================================================ measuring


def _throughput(stamps: list[tuple[float, float, int]], warmup: int) -> dict:
    """Tokens of steps warmup..N-1 over the time from the start of step `warmup` to the last stamp."""
    timed = stamps[warmup:]
    tokens = sum(s[2] for s in timed[:-1])
    wall, cpu = timed[-1][0] - timed[0][0], timed[-1][1] - timed[0][1]
    return {
        "tokens": tokens,
        "steps": len(timed) - 1,
        "wall_s": wall,
        "cpu_s": cpu,
        "tok_per_s": tokens / wall,
        "tok_per_cpu_s": tokens / cpu,
    }


# Phase -> (file substring, function name) pairs whose cumulative time is the phase's.
BARE_PHASES = {
    "data (pack)": [("bench_independent", "pack")],
    "forward (model)": [("module.py", "_call_impl")],
    "loss": [("functional.py", "cross_entropy")],
    "backward": [("_tensor.py", "backward")],
    "clipping": [("clip_grad.py", "clip_grad_norm_")],
    "optimizer": [("optimizer.py", "wrapper"), ("optimizer.py", "zero_grad")],
    "logging": [("_tensor.py", "item"), ("", "print")],
}
DITTY_PHASES = {
    "data (fetch, pack)": [("batching.py", "next_step")],
    "mask (packed inputs)": [("packing.py", "packed_inputs")],
    "forward (model)": [("module.py", "_call_impl")],
    "loss": [("loss.py", "__call__"), ("loss.py", "forward")],
    "backward": [("_tensor.py", "backward")],
    "clipping + optimizer": [("engines", "step")],
    "logging": [("trainer.py", "log_step")],
}


def _profiler(a: dict):
    if not a.get("profile"):
        return None
    import cProfile

    # CPU time (all threads), not wall: on a shared machine wall time measures the neighbours
    return cProfile.Profile(time.process_time)


def _phases(profiler, a: dict, phases: dict, steps: int) -> dict:
    """CPU milliseconds per step of each phase over the `steps` profiled steps, the total, and the file."""
    if profiler is None:
        return {}
    import pstats

    path = Path(a["profile"]) / f"{a['name']}.prof"
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(path))
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    out = {}
    for phase, names in phases.items():
        total = 0.0
        for (file, _line, function), (_cc, _nc, _tt, cumulative, callers) in stats.items():
            if any(part in file and function == name for part, name in names):
                # only the outermost frames: a caller of the same phase already counts this time
                inner = any(any(p in c[0] and c[2] == n for p, n in names) for c in callers)
                total += 0.0 if inner else cumulative
        out[phase] = 1000 * total / steps
    total = 1000 * sum(v[2] for v in stats.values()) / steps  # every function's own time
    return {"phases": out, "profiled_ms_per_step": total, "profile_file": str(path)}


# ============================================================================ running


WORKERS = {"bare": bare_loop, "ditty": ditty_run}


def run_worker(kind: str, args: dict, threads: int, source: Path = ROOT, timeout: float = 1200) -> dict:
    """One run in its own process; a ditty worker imports ditty from `source`."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(source) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", kind, json.dumps(dict(args, threads=threads))],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH_RESULT ") :])


def baseline_source(ref: str, tmp: Path) -> Path:
    """ditty as of git `ref` (its ditty/ package only), exported under `tmp`."""
    target = tmp / f"ditty-at-{ref.replace('/', '_')}"
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "ditty"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def compare(
    shapes: list[str], reps: int, threads: int, tmp: Path, log, profile: str = "", baseline: str = ""
) -> list[dict]:
    """Per shape: the bare loop, ditty (and ditty at git ref `baseline`) alternating `reps` times;
    one row per shape with the medians."""
    tmp.mkdir(parents=True, exist_ok=True)
    data = tmp / "addition.jsonl"
    if not data.exists():
        write_rows(data)
    contenders = {"bare": ("bare", ROOT), "ditty": ("ditty", ROOT)}
    if baseline:
        contenders[f"ditty at {baseline}"] = ("ditty", baseline_source(baseline, tmp))
    results = []
    for shape in shapes:
        rows, width = SHAPES[shape]
        warmup, timed = STEPS[width]
        base = dict(tmp=str(tmp), data=str(data), rows=rows, width=width, warmup=warmup, timed=timed)
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        for rep in range(reps):
            for name, (kind, source) in contenders.items():
                load = os.getloadavg()[0]
                label = name.replace(" ", "-").replace("/", "_")
                r = run_worker(kind, dict(base, name=f"{label}-{shape}-{rep}"), threads, source)
                r["load"] = load
                runs[name].append(r)
                log(
                    f"  {shape} {name} rep {rep}: {r['tok_per_s']:,.0f} tok/s wall, {r['tok_per_cpu_s']:,.0f} "
                    f"tok/CPU-s (load {load:.2f})"
                )
        row = dict(shape=shape, threads=threads, loads=[r["load"] for rs in runs.values() for r in rs], runs={})
        for name, rs in runs.items():
            row["runs"][name] = dict(
                wall=statistics.median(r["tok_per_s"] for r in rs),
                cpu=statistics.median(r["tok_per_cpu_s"] for r in rs),
                pairs=[r["tok_per_s"] / b["tok_per_s"] for b, r in zip(runs["bare"], rs)],
            )
        if profile:
            row["profiles"] = {}
            for name, (kind, source) in contenders.items():
                label = name.replace(" ", "-").replace("/", "_")
                r = run_worker(kind, dict(base, name=f"{label}-{shape}-profile", profile=profile), threads, source)
                row["profiles"][name] = (r["profiled_ms_per_step"], r["phases"])
        results.append(row)
    return results


def render(results: list[dict], command: str) -> str:
    out = [
        f"Command: `{command}`",
        "",
        "| shape | threads | contender | tok/s (wall, median) | / bare loop | per repeat / bare loop "
        "| tok per CPU-s | / bare loop (CPU) | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        bare = r["runs"]["bare"]
        loads = f"{min(r['loads']):.1f}-{max(r['loads']):.1f}"
        for name, x in r["runs"].items():
            pairs = ", ".join(f"{p:.3f}" for p in x["pairs"])
            out.append(
                f"| {r['shape']} | {r['threads']} | {name} | {x['wall']:,.0f} | {x['wall'] / bare['wall']:.3f} | "
                f"{pairs} | {x['cpu']:,.0f} | {x['cpu'] / bare['cpu']:.3f} | {loads} |"
            )
    for r in results:
        if "profiles" not in r:
            continue
        out += ["", f"Profile at {r['shape']} (cProfile on CPU time, all threads; ms per step, share of the step):", ""]
        for name, (step, phases) in r["profiles"].items():
            parts = ", ".join(f"{k} {v:.1f} ({100 * v / step:.1f}%)" for k, v in phases.items())
            out.append(f"- {name}, {step:.1f} ms per step: {parts}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x128,2x2048", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", default="", help="also profile one run of each per shape; .prof files here")
    parser.add_argument("--baseline", default="", help="also run ditty as of this git ref (e.g. main), interleaved")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("worker_args", nargs="?", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        out = WORKERS[opts.worker](json.loads(opts.worker_args))
        print("BENCH_RESULT " + json.dumps(out), flush=True)
        return 0
    shapes = opts.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {sorted(SHAPES)}")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ditty-independent-") as tmp:
        results = compare(shapes, opts.reps, opts.threads, Path(tmp), log, opts.profile, opts.baseline)
    print(render(results, "python tools/bench_independent.py " + " ".join(argv if argv is not None else sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
