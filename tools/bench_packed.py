"""Packed rows on the CPU (issue 30): where the dense mask beats the per-sample path, and ditty's packed
step against a bare loop on the same shape (tools/bench.py section "packed").

    python tools/bench_packed.py crossover [--reps 3] [--widths 128,256,...] [--samples 1,4,16]
    python tools/bench.py --only packed [--reps 3]

packed (a tools/bench.py section, beside "overhead"): ditty's Trainer training packed rows of
tiny_sft's built-in addition data (prompt/completion, about 10 tokens a sample) with the default
`model.packed_attention = "auto"`, against a bare loop (the same model object, ditty's batches
precomputed, fused AdamW, clipping, the same loss arithmetic) fed the same rows as plain causal rows:
input ids only, no mask, no position ids, so its samples are not isolated. Two shapes: 8 rows of 128
tokens and 2 rows of 2,048. Both count the same useful (non-padding) tokens; ratios on CPU time.

crossover: ms of CPU time per forward + backward of tools/bench.py's 3.4M-parameter Llama (4 layers, 256
wide, 4 heads, byte vocabulary, fp32, one torch thread) on packed rows of T tokens holding n samples
each, through the two isolating paths of ditty.models.packing: the dense [B, 1, T, T] block mask and
the per-sample SDPA (PACKED_SDPA). Each step includes building the path's inputs (packed_inputs), as
training does. Sample lengths are random cuts of the row (so a row of n samples has up to n distinct
lengths, the per-sample path's worst case); rows per step = max(1, 2048 // T), so each step holds at
least 2,048 tokens. The two paths alternate within one process, step by step, and the table shows the
median over the repeats; ratio > 1 means the dense mask is slower.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

MODEL = dict(
    vocab_size=259,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)


def build_llama(width: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**MODEL, max_position_embeddings=max(width, 128))
    return LlamaForCausalLM(config).train()


def packed_batch(rows: int, width: int, samples: int, seed: int) -> dict:
    """`rows` packed rows of `width` tokens, each cut into `samples` samples of random lengths."""
    from ditty.data.collate import pack_rows

    rng = random.Random(seed)
    packed = []
    for _ in range(rows):
        cuts = sorted(rng.sample(range(1, width), samples - 1)) if samples > 1 else []
        bounds = [0, *cuts, width]
        row = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            ids = [rng.randrange(3, 259) for _ in range(end - start)]
            row.append((ids, ids))
        packed.append(row)
    return pack_rows(packed, pad_token_id=0)


def crossover(widths: list[int], sample_counts: list[int], reps: int, log) -> list[dict]:
    import torch

    from ditty.models.packing import packed_inputs

    torch.set_num_threads(1)
    results = []
    for width in widths:
        model = build_llama(width)
        rows = max(1, 2048 // width)
        for samples in sample_counts:
            batch = packed_batch(rows, width, samples, seed=width + samples)
            times: dict[str, list[float]] = {"dense": [], "per-sample": []}
            for rep in range(reps + 1):  # the first round warms up both paths
                for path in times:
                    start = time.process_time()
                    logits = model(**packed_inputs(model, batch, choice=path), use_cache=False).logits
                    logits.float().square().mean().backward()
                    elapsed = time.process_time() - start
                    model.zero_grad(set_to_none=True)
                    if rep:
                        times[path].append(elapsed * 1000)
            dense, per_sample = statistics.median(times["dense"]), statistics.median(times["per-sample"])
            row = dict(width=width, samples=samples, rows=rows, dense_ms=dense, per_sample_ms=per_sample)
            log(f"  T={width} n={samples} rows={rows}: dense {dense:.0f} ms, per-sample {per_sample:.0f} ms")
            results.append(row)
    return results


def render_crossover(results: list[dict], command: str) -> str:
    out = [
        f"Command: `{command}`",
        "",
        "| row length T | samples per row | rows per step | dense mask (ms) | per-sample SDPA (ms) "
        "| dense / per-sample | faster |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["dense_ms"] / r["per_sample_ms"]
        out.append(
            f"| {r['width']:,} | {r['samples']} | {r['rows']} | {r['dense_ms']:,.0f} | {r['per_sample_ms']:,.0f} "
            f"| {ratio:.2f} | {'dense' if ratio < 1 else 'per-sample'} |"
        )
    return "\n".join(out)


SHAPES = {"8 x 128": (8, 128), "2 x 2,048": (2, 2048)}


def addition_data(width: int) -> dict:
    return dict(
        source="builtin",
        name="addition",
        format="prompt_completion",
        num_samples=20000,
        max_seq_len=width,
        packing=True,
    )


def run_section(run_worker, interleave, throughput_rows, base: dict, quick: bool, log) -> list[list[str]]:
    """tools/bench.py's "packed" rows: per shape, the bare loop on plain causal rows, then ditty."""
    rows: list[list[str]] = []
    for label, (batch, width) in SHAPES.items():
        timed = (3 if quick else 10) if width <= 512 else (2 if quick else 5)
        steps = base["warmup"] + timed
        common = dict(base, data=addition_data(width), steps=steps, batch=batch, non_pad=True)
        contenders = {
            f"bare loop, plain causal rows ({label})": ("bare", dict(common, name=f"p{width}-bare", plain_rows=True)),
            f"ditty Trainer, packed rows ({label})": ("ditty", dict(common, name=f"p{width}-ditty")),
        }
        log(f"packed: ditty on packed rows vs a bare loop on plain rows, {label}")
        results = interleave(contenders, base["reps"], log)
        rows += throughput_rows("packed", results, next(iter(contenders)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["crossover"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--widths", default="128,256,512,1024,2048,4096")
    parser.add_argument("--samples", default="1,4,16")
    opts = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    widths = [int(w) for w in opts.widths.split(",")]
    counts = [int(n) for n in opts.samples.split(",")]
    results = crossover(widths, counts, opts.reps, log)
    print(render_crossover(results, "python tools/bench_packed.py " + " ".join(argv or sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
