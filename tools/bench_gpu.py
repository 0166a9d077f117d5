"""`tools/bench.py --gpu`: MFU of a ~1B Llama-architecture model (random init, no download) on one
CUDA GPU, through ditty's Trainer, with and without each of torch.compile, FP8 (torchao), the
chunked loss (and its liger / cut-cross-entropy backends) and packing.

The model has Llama-3.2-1B's shape (hidden 2048, MLP 8192, 16 layers, 32 heads, 8 KV heads,
vocabulary 128,256, tied embeddings: 1.24B parameters), bf16 autocast, AdamW; attention is
ditty's default (sdpa; flex_attention for packed rows on CUDA), and sdpa where a variant says so.
Each variant runs in its own process for `steps` steps (compile and warm-up land in the first
interval, which is not reported) and reports the last logged interval's `mfu`, tokens/s and peak
memory from metrics.jsonl. MFU is ditty's own figure (ditty.metrics.mfu: 6N plus attention over
the peak of ditty's accelerator table for bf16).
Packing is compared on instruction-like data of log-normal lengths (median ~300, up to 2,048
tokens) padded per micro-batch against packed rows; the other variants use rows of 2,048 tokens.
"""

from __future__ import annotations

import atexit
import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

MODEL = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
SEQ, MICRO, STEPS, LOG_EVERY = 2048, 4, 20, 10


def variants(tmp: Path) -> dict[str, tuple[str, dict]]:
    """Short key (for `--only`) -> (the table's name, the recipe's changes)."""
    fixed = dict(path=str(tmp / "text.jsonl"), format="text", packing=False)
    mixed = dict(path=str(tmp / "instructions.jsonl"), format="prompt_completion")
    return {
        "eager": ("eager", dict(data=fixed)),
        "compile": ("train.compile (blocks)", dict(data=fixed, train={"compile": True})),
        "fp8": ("fp8 (torchao)", dict(data=fixed, fp8={"enabled": True})),
        "chunked": ("chunked loss (loss_chunks = 8)", dict(data=fixed, train={"loss_chunks": 8})),
        "liger": ("liger loss", dict(data=fixed, train={"loss_chunks": 8, "loss_backend": "liger"})),
        "cce": ("cut-cross-entropy loss", dict(data=fixed, train={"loss_chunks": 8, "loss_backend": "cce"})),
        "all": (
            "compile + fp8 + chunked loss",
            dict(data=fixed, train={"compile": True, "loss_chunks": 8}, fp8={"enabled": True}),
        ),
        "padded": ("varied lengths, padded", dict(data=dict(mixed, packing=False))),
        "packed": ("varied lengths, packed (auto: flex_attention)", dict(data=dict(mixed, packing=True))),
        "packed-sdpa": (
            "varied lengths, packed, sdpa (per-sample loop)",
            dict(data=dict(mixed, packing=True), attn="sdpa"),
        ),
    }


def write_data(tmp: Path, n: int = 400) -> None:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz      "
    with open(tmp / "text.jsonl", "w") as f:
        for _ in range(n):  # byte tokenizer: 2,200 characters fill a 2,048-token row
            f.write(json.dumps({"text": "".join(rng.choice(letters) for _ in range(2200))}) + "\n")
    with open(tmp / "instructions.jsonl", "w") as f:
        for _ in range(n * 4):
            total = int(min(2040, max(16, rng.lognormvariate(math.log(300), 0.9))))
            text = "".join(rng.choice(letters) for _ in range(total))
            f.write(json.dumps({"prompt": text[: total // 3], "completion": text[total // 3 :]}) + "\n")


def recipe(tmp: Path, name: str, variant: dict, steps: int) -> str:
    def table(values: dict) -> str:
        return "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else json.dumps(v)}" for k, v in values.items())

    model = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in MODEL.items()) + " }"
    train = dict(
        steps=steps,
        global_batch_size=MICRO,
        micro_batch_size=MICRO,
        precision="bf16",
        log_every=LOG_EVERY,
        eval_every=0,
        eval_samples=0,
        **variant.get("train", {}),
    )
    data = dict(source="file", max_seq_len=SEQ, val_fraction=0.0, **variant["data"])
    return f"""
[run]
name = "{name}"
output_dir = "{tmp / name.replace(" ", "_").replace("(", "").replace(")", "").replace("=", "")}"
seed = 0
device = "cuda"
[model]
init = "random"
architecture = "llama"
config = {model}
attn_implementation = "{variant.get("attn", "auto")}"
[tokenizer]
kind = "byte"
[data]
{table(data)}
[train]
{table(train)}
[optimizer]
kind = "adamw"
lr = 1e-4
[scheduler]
kind = "constant"
[fp8]
{table(variant.get("fp8", {"enabled": False}))}
[checkpoint]
every = 0
keep_last = 1
[logging]
progress = false
"""


def worker_train(a: dict) -> dict:
    """One variant: the Trainer for `steps` steps; the last interval's figures from metrics.jsonl."""
    from ditty.config.loader import parse_recipe
    from ditty.metrics.logger import read_metrics
    from ditty.train.trainer import Trainer

    config = parse_recipe(a["recipe"], source=a["name"]).config
    started = time.perf_counter()
    result = Trainer(config).train()
    last = [r for r in read_metrics(result.run_dir) if "mfu" in r][-1]
    shutil.rmtree(result.run_dir, ignore_errors=True)  # a 1B checkpoint and final/ per variant: ~20 GB
    return {
        "mfu": last["mfu"],
        "hfu": last["hfu"],
        "tokens_per_s": last["tokens_per_s"],
        "peak_mem_mb": last["peak_mem_mb"],
        "seconds": time.perf_counter() - started,
    }


WORKERS = {"gpu-train": worker_train}


def main(run_worker, quick: bool, only: str | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("tools/bench.py --gpu needs a CUDA GPU; none is visible here (see BENCHMARKS.md)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    # Each variant ends with a checkpoint and final/ of a 1B model (~20 GB): memory-backed files keep
    # that end short where /dev/shm exists (it is not part of what is measured).
    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="ditty-bench-gpu-", dir=shm if shm.is_dir() else None))
    atexit.register(shutil.rmtree, tmp, True)  # also on Ctrl-C: /dev/shm is memory
    write_data(tmp)
    steps = 12 if quick else STEPS
    chosen = variants(tmp)
    if only:
        unknown = set(only.split(",")) - set(chosen)
        if unknown:
            print(f"--only with --gpu takes {','.join(chosen)}; not {','.join(sorted(unknown))}", file=sys.stderr)
            return 2
        chosen = {key: chosen[key] for key in only.split(",")}
    rows = []
    for name, variant in chosen.values():
        print(f"gpu: {name}", file=sys.stderr, flush=True)
        try:
            r = run_worker("gpu-train", dict(tmp=str(tmp), name=name, recipe=recipe(tmp, name, variant, steps)))
            rows.append(
                f"| {name} | {r['mfu']:.3f} | {r['hfu']:.3f} | {r['tokens_per_s']:,.0f} | {r['peak_mem_mb']:,.0f} |"
            )
            print(f"{rows[-1]} ({r['seconds']:.0f} s)", flush=True)  # each row as it lands: a cut-off run keeps them
        except RuntimeError as error:  # one variant failing (FP8 on an older GPU, say) keeps the others
            print(error, file=sys.stderr, flush=True)
            rows.append(f"| {name} | failed: {str(error).splitlines()[-1][:120]} | | | |")
    shape = f"~1B Llama (random init), bf16, micro batch {MICRO} x {SEQ}, {steps} steps"
    print(f"ditty --gpu benchmark on {device}: {shape}")
    print()
    print("| variant | mfu | hfu | tokens/s | peak memory (MB) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0
