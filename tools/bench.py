"""Side-by-side speed and memory benchmark: ditty against a bare PyTorch loop and the Hugging Face Trainer.

    python tools/bench.py            # full run (~15-25 min on 2 shared cores), markdown table on stdout
    python tools/bench.py --quick    # a few minutes; also asserts ditty's weights equal the bare loop's

Every contender runs in its own subprocess with one torch thread (`OMP_NUM_THREADS=1`), on the same
tiny Llama-architecture model (4 layers, 256 wide, byte vocabulary: 3.4M parameters), the same
data and sequence lengths, fused AdamW (lr 1e-3, betas 0.9/0.95, no weight decay) and clipping at 1.0.
Contenders of one comparison are interleaved (A B C A B C ...) and each reports steady-state
throughput after warm-up steps; the table shows medians over the repeats and ratios.

Throughput is measured the same way for everyone: a forward pre-hook on the model stamps wall
and CPU (process) time and counts the useful (non-padding) tokens of each forward; tokens/s is
the tokens of forwards W..N-1 over the time from forward W to forward N (W warm-up steps, one
forward per step), so it includes everything a loop does between forwards (data, backward,
clipping, optimizer, logging). The machine is shared and wall time is noisy (the same step has
varied 8x), so ratios are taken on CPU time (tokens per CPU-second of the single thread); wall
figures are shown beside them.

Comparisons:
- overhead: ditty's Trainer vs a bare loop (same model object built by ditty from the same seed,
  the same batches precomputed from ditty's stream, torch AdamW, the same loss arithmetic) vs the
  Hugging Face Trainer (same model init, batch, optimizer, clipping; no eval, no saving, no logging
  work). --quick asserts ditty's final weights equal the bare loop's bit for bit.
- packed (tools/bench_packed.py; not in --quick unless named with --only): ditty on packed rows of short
  samples vs a bare loop on the same rows as plain causal rows, at 8 x 128 and 2 x 2,048 tokens.
- packing: useful tokens/s on instruction data with log-normal lengths in [16, 1024].
- memory: peak RSS and optimizer-state bytes per parameter (full, LoRA, QLoRA, 8-bit AdamW), and
  8-bit AdamW under FSDP2 on 2 gloo ranks: each rank's optimizer-state bytes per local (sharded)
  parameter, and whether every rank's state tensors are torchao's 8-bit subclass (--quick asserts it).
- compile: tokens/s with train.compile (blocks) vs eager; compile time separately.
- scale (tools/bench_scale.py; not in --quick unless named with --only): chunked loss vs full logits at
  a 128,256-token vocabulary, mask-free vs dense-mask packing at 16,384 tokens, validation generation
  with and without the KV cache.
--gpu (tools/bench_gpu.py): MFU of a ~1B Llama on CUDA with and without compile, FP8, chunked loss, packing.
- streaming (only with `--only streaming`, never in --quick): data.streaming against the
  pre-tokenized path, and peak memory over 1x/10x/100x corpora; see tools/bench_streaming.py.
- allocator (only with `--only allocator`, never in --quick): host memory and step time of fsdp on 2
  CPU ranks under each host allocator policy; see tools/bench_allocator.py.
- independent (only with `--only independent`): ditty on packed rows against a bare loop that shares
  no code with ditty (its own model build, packing, loss and optimizer step), both on 2 threads, at
  8 x 128 and 2 x 2,048 tokens; see tools/bench_independent.py (also --baseline and --profile there).
- dpo, grpo (tools/bench_post.py; only when named with --only, never in the default or --quick set):
  ditty's Trainer against TRL's DPOTrainer (pairs per CPU-second) and GRPOTrainer (completions per
  CPU-second and the share of step time spent generating) on the same tiny Llama, data and settings
  (full finetune, fp32); `--quick --only dpo,grpo` is a smoke run of a few steps.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
LR, BETAS, EPS, CLIP, SEED = 1e-3, (0.9, 0.95), 1e-8, 1.0, 0
SEQ, BATCH = 128, 8  # overhead and compile: 8 x 128 tokens per step
PACK_LEN, PACK_BATCH, PACK_ROWS = 1024, 8, 2  # packing: 8 samples per step padded, or 2 packed rows of 1024


# ============================================================================ data files


def write_text(path: Path, n: int) -> None:
    """Texts longer than SEQ bytes: every sample is cut to exactly SEQ tokens (no padding)."""
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))}) + "\n")


def write_instructions(path: Path, n: int) -> None:
    """prompt/completion pairs, total length log-normal (median ~180 bytes) clipped to [16, 1024]."""
    rng = random.Random(2)
    letters = "abcdefghijklmnopqrstuvwxyz     "
    with open(path, "w") as f:
        for _ in range(n):
            total = int(min(1024, max(16, rng.lognormvariate(math.log(180), 0.9)))) - 2  # BOS/EOS
            cut = max(4, total // 3)
            text = "".join(rng.choice(letters) for _ in range(total))
            f.write(json.dumps({"prompt": text[:cut], "completion": text[cut:]}) + "\n")


# ============================================================================ configs


def bench_recipe(
    *,
    name: str,
    output_dir: Path,
    model: str,
    steps: int,
    batch: int,
    lr: float,
    clip: float,
    seed: int,
    run: str = "",
    optimizer: str = "",
    extra: str = "",
) -> str:
    """The benchmarks' recipe text (tools/bench.py and tools/bench_post.py): one process on the CPU in
    fp32, a constant learning rate, no evaluation, checkpoints or progress bar, so that only training
    steps are timed. `model` is the [model] table's body; `run` and `optimizer` add keys to those
    tables; `extra` adds tables ([data], [preference], ...)."""
    return f"""
[run]
name = "{name}"
output_dir = "{output_dir}"
seed = {seed}
device = "cpu"
{run}
[model]
{model}
[train]
steps = {steps}
global_batch_size = {batch}
micro_batch_size = {batch}
max_grad_norm = {clip}
precision = "fp32"
log_every = 1000
eval_every = 0
eval_samples = 0
[optimizer]
kind = "adamw"
lr = {lr}
weight_decay = 0.0
{optimizer}
[scheduler]
kind = "constant"
warmup_steps = 0
[checkpoint]
every = 0
[logging]
progress = false
{extra}
"""


def ditty_config(tmp: Path, name: str, data: dict, steps: int, batch: int, **sections):
    from dataclasses import replace

    from ditty.config.loader import parse_recipe

    config = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in MODEL.items()) + " }"
    model = f'init = "random"\narchitecture = "llama"\nconfig = {config}\n[tokenizer]\nkind = "byte"'
    optimizer = f"betas = {list(BETAS)}\neps = {EPS}"
    text = bench_recipe(
        name=name,
        output_dir=tmp / name,
        model=model,
        steps=steps,
        batch=batch,
        lr=LR,
        clip=CLIP,
        seed=SEED,
        optimizer=optimizer,
    )
    config = parse_recipe(text).config
    config = replace(config, data=replace(config.data, val_fraction=0.0, **data))
    for section, changes in sections.items():
        config = replace(config, **{section: replace(getattr(config, section), **changes)})
    return config


def overhead_data(tmp: Path) -> dict:
    return dict(source="file", path=str(tmp / "text.jsonl"), format="text", max_seq_len=SEQ, packing=False)


def packing_data(tmp: Path, packing: bool) -> dict:
    return dict(
        source="file",
        path=str(tmp / "instructions.jsonl"),
        format="prompt_completion",
        max_seq_len=PACK_LEN,
        packing=packing,
    )


# ============================================================================ measuring (inside a worker)


class Meter:
    """Forward pre-hook: wall and CPU stamps and useful tokens per forward."""

    def __init__(self, model, pad_id: int, non_pad: bool = False):
        self.events: list[tuple[float, float, int]] = []
        self.pad_id = pad_id
        self.non_pad = non_pad  # count non-pad ids whatever the inputs (a bare loop on packed rows: no mask)
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return  # evaluation forwards do not count
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if "cu_seq_lens_q" in kwargs or self.non_pad:  # ditty's packed rows (an all-ones 2D mask): pad ids
            tokens = int((ids != self.pad_id).sum())
        elif mask is not None and mask.dim() == 2:
            tokens = int(mask.sum())
        elif mask is not None:  # packed rows (4-D mask): padding is at the row ends as pad ids
            tokens = int((ids != self.pad_id).sum())
        else:  # flattened (padding-free) batch
            tokens = ids.numel()
        self.events.append((time.perf_counter(), time.process_time(), tokens))

    def result(self, warmup: int) -> dict:
        ev = self.events
        if len(ev) < warmup + 2:
            raise RuntimeError(f"only {len(ev)} forwards recorded, need warmup {warmup} + 2")
        tokens = sum(e[2] for e in ev[warmup:-1])
        wall, cpu = ev[-1][0] - ev[warmup][0], ev[-1][1] - ev[warmup][1]
        return {
            "tokens": tokens,
            "wall_s": wall,
            "cpu_s": cpu,
            "tok_per_s": tokens / wall,
            "tok_per_cpu_s": tokens / cpu,
            "first_step_s": ev[1][0] - ev[0][0],
            "steady_step_s": wall / (len(ev) - 1 - warmup),
        }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def optimizer_state_bytes(optimizer) -> int:
    import torch

    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:  # not the step counters
                total += _tensor_bytes(value)
    return total


def _tensor_bytes(t) -> int:
    """Bytes of a tensor, looking inside tensor subclasses (torchao's OptimState8bit: codes + scales)."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):  # FSDP2: this rank's shard
        return _tensor_bytes(t.to_local())
    names = getattr(t, "__tensor_flatten__", None)
    if names is not None and type(t).__name__ != "Tensor" and type(t).__name__ != "Parameter":
        inner, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in inner if isinstance(getattr(t, n), torch.Tensor))
    return t.numel() * t.element_size()


# ============================================================================ workers


def worker_ditty(a: dict) -> dict:
    """The real Trainer; the meter hooks the model after build."""
    import torch

    from ditty.train.trainer import Trainer

    sections = dict(a.get("sections", {}))
    if sections.get("quant", {}).get("kind", "none") != "none":  # a quantized base loads from disk
        sections["model"] = {"init": "pretrained", "path": pretrained_dir(a), "architecture": None, "config": {}}
    config = ditty_config(Path(a["tmp"]), a["name"], a["data"], a["steps"], a["batch"], **sections)
    trainer = Trainer(config)
    meter = Meter(trainer.model, trainer.tokenizer.pad_token_id, a.get("non_pad", False))
    trainer.train()
    from ditty.models.adapters import trainable_parameter_counts

    trainable, total = trainable_parameter_counts(trainer.model)  # counts 4-bit packed weights as parameters, not bytes
    out = {
        "params": total,
        "trainable": trainable,
        "opt_state_bytes": optimizer_state_bytes(trainer.optimizer),
        "peak_rss_mb": peak_rss_mb(),
    }
    if a.get("measure", True):
        out.update(meter.result(a["warmup"]))
    if a.get("save"):
        from ditty._utils.modules import unwrap as unwrap_model

        torch.save({k: v.detach().clone() for k, v in unwrap_model(trainer.model).state_dict().items()}, a["save"])
    return out


def worker_fsdp_rank(a: dict) -> dict:
    """One rank of a 2-process gloo FSDP2 run with torchao's 8-bit AdamW: what this rank holds."""
    from torch.distributed.tensor import DTensor

    from ditty.parallel.env import destroy_distributed
    from ditty.train.trainer import Trainer

    world = int(os.environ["WORLD_SIZE"])
    sections = {
        "optimizer": {"kind": "adamw8bit", "backend": "torchao"},
        "parallel": {"kind": "fsdp"},
        "train": {"micro_batch_size": a["batch"] // world},
    }
    config = ditty_config(Path(a["tmp"]), a["name"], a["data"], a["steps"], a["batch"], **sections)
    trainer = Trainer(config)
    trainer.train()
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t  # noqa: E731
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    block = getattr(trainer.optimizer, "block_size", 256)
    kinds, eligible, eight_bit = {}, 0, 0
    for p in params:
        # torchao quantizes a state tensor when its local shard has >= 4096 values, a multiple of the block size
        quantized = local(p).numel() >= 4096 and local(p).numel() % block == 0
        eligible += quantized
        for key in ("exp_avg", "exp_avg_sq"):
            name = type(local(trainer.optimizer.state[p][key])).__name__
            kinds[name] = kinds.get(name, 0) + 1
            eight_bit += quantized and name == "OptimState8bit"
    out = {
        "rank": trainer.runtime.rank,
        "params": sum(local(p).numel() for p in params),
        "opt_state_bytes": optimizer_state_bytes(trainer.optimizer),
        "state_kinds": kinds,
        "eligible_states": 2 * eligible,
        "eight_bit_states": eight_bit,
        "peak_rss_mb": peak_rss_mb(),
        "global_params": sum(p.numel() for p in params),
    }
    destroy_distributed()
    return out


def run_fsdp_ranks(args: dict, world: int = 2, timeout: float = 1800) -> list[dict]:
    """`world` gloo ranks of worker_fsdp_rank (torchrun's environment, set by hand), one thread each."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cache = tempfile.mkdtemp(prefix="inductor-", dir=args["tmp"])
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            TORCHINDUCTOR_CACHE_DIR=cache,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            DITTY_DIST_TIMEOUT_S="300",
            **dynamo_env(args),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", "fsdp-rank", json.dumps(args)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            lines = [line for line in stdout.splitlines() if line.startswith("BENCH_RESULT ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"fsdp rank failed ({proc.returncode}):\n{stderr[-3000:]}")
            results.append(json.loads(lines[-1][len("BENCH_RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return sorted(results, key=lambda r: r["rank"])


def pretrained_dir(a: dict) -> str:
    """The benchmark model (same seed, same init) saved once in Hugging Face format, for QLoRA."""
    import torch

    from ditty.data.tokenizer import build_tokenizer
    from ditty.models import build_model

    path = Path(a["tmp"]) / "pretrained"
    if not (path / "config.json").exists():
        config = ditty_config(Path(a["tmp"]), "pretrained-build", a["data"], 1, 1)
        tokenizer = build_tokenizer(config.tokenizer, config.model)
        torch.manual_seed(SEED)
        build_model(config.model, tokenizer=tokenizer, device="cpu").save_pretrained(path)
    return str(path)


def _ditty_model_and_batches(a: dict):
    """The model ditty builds (same seed, same init) and the batches of its stream, precomputed."""
    from ditty.train.trainer import Trainer

    config = ditty_config(Path(a["tmp"]), a["name"], a["data"], a["steps"], a["batch"])
    trainer = Trainer(config)
    batches = [mb for _ in range(a["steps"]) for mb in trainer.stream.next_step()]
    return trainer.model, batches, trainer.tokenizer.pad_token_id


def worker_bare(a: dict) -> dict:
    """A hand-written loop doing ditty's math: sum of token cross-entropy / supervised tokens, clip, AdamW."""
    import torch
    import torch.nn.functional as F

    model, batches, pad_id = _ditty_model_and_batches(a)
    if a.get("compile"):
        for layer in model.model.layers:
            layer.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.0}] + (
        [{"params": no_decay, "weight_decay": 0.0}] if no_decay else []
    )
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)  # as ditty (and a careful user) on CPU
    meter = Meter(model, pad_id, a.get("non_pad", False))
    model.train()
    # plain_rows: ditty's packed rows as plain causal rows (input ids only: no isolation, nothing to build)
    keys = ("input_ids",) if a.get("plain_rows") else ("input_ids", "attention_mask", "position_ids")
    for batch in batches:
        inputs = {k: batch[k] for k in keys}
        logits = model(**inputs, use_cache=False).logits
        labels = batch["labels"][..., 1:]
        total = F.cross_entropy(
            logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        count = (labels != -100).sum().to(torch.float64).clamp_min(1)
        (total * (1 / count.to(torch.float32))).backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0, False, None)
        # torch's clip takes the parameters (it scales their .grad); given the gradients it would clip nothing
        torch.nn.utils.clip_grads_with_norm_([p for p in params if p.grad is not None], CLIP, norm, None)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model(input_ids=batches[0]["input_ids"][:1, :8])  # closes the last timed interval (stamp only)
    out = meter.result(a["warmup"])
    if a.get("save"):
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a["save"])
    return out


def worker_hf(a: dict) -> dict:
    """transformers.Trainer as a careful user sets it up: same model init, optimizer, batch, clipping;
    no evaluation, saving, logging, pinning or worker processes."""
    import torch
    import transformers
    from datasets import Dataset

    from ditty.train.trainer import Trainer as DittyTrainer

    # The model: built by ditty from the same seed (so the same init); the data: ditty's tokenized samples.
    config = ditty_config(Path(a["tmp"]), a["name"], a["data"], a["steps"], a["batch"])
    dt = DittyTrainer(config)
    model, pad_id = dt.model, dt.tokenizer.pad_token_id
    train = dt.data.train
    rows = [
        {"input_ids": list(ids), "labels": [-100] + list(labels)[1:]}
        for ids, labels in zip(train["input_ids"], train["labels"])
    ]
    collator_kind = a.get("collator", "fixed")
    if collator_kind == "flatten":
        collator = transformers.DataCollatorWithFlattening()
    elif collator_kind == "padding":
        collator = transformers.DataCollatorForSeq2Seq(dt.tokenizer, padding="longest", label_pad_token_id=-100)
    else:  # every sample has exactly SEQ tokens: plain stacking
        collator = transformers.default_data_collator
        rows = [dict(r, attention_mask=[1] * len(r["input_ids"])) for r in rows]
    dataset = Dataset.from_list(rows)
    args = transformers.TrainingArguments(
        output_dir=str(Path(a["tmp"]) / (a["name"] + "-hf")),
        max_steps=a["steps"],
        per_device_train_batch_size=a["batch"],
        learning_rate=LR,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        adam_epsilon=EPS,
        weight_decay=0.0,
        max_grad_norm=CLIP,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_cpu=True,
        seed=SEED,
        remove_unused_columns=False,
    )
    meter = Meter(model, pad_id)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    if a.get("profile"):
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        trainer.train()
        prof.disable()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").dump_stats(a["profile"])
    else:
        trainer.train()
    model(input_ids=torch.tensor([[1, 2, 3]]))  # closes the last timed interval
    return meter.result(a["warmup"])


WORKERS = {"ditty": worker_ditty, "bare": worker_bare, "hf": worker_hf, "fsdp-rank": worker_fsdp_rank}


def dynamo_env(args: dict) -> dict:
    """--quick memory runs: torchao's 8-bit AdamW update runs eagerly (TORCHDYNAMO_DISABLE=1) instead of
    compiling itself once per parameter shape (40-100 s here); its state (the subclass, codes and
    scales, so the bytes) is the same either way. The full run keeps the compiled update."""
    return {"TORCHDYNAMO_DISABLE": "1"} if args.get("eager_optimizer") else {}


def run_worker(kind: str, args: dict, timeout: float = 1800) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        HF_HUB_OFFLINE="1",
        # a fresh inductor cache per run: the compile time reported is a cold compile, as a first run sees
        TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-", dir=args["tmp"]),
    )
    env.update(dynamo_env(args))
    env.update(args.get("env", {}))
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", kind, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {kind} {args.get('name')} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH_RESULT ") :])


# ============================================================================ comparisons


def interleave(contenders: dict[str, tuple[str, dict]], reps: int, log) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    for rep in range(reps):
        for name, (kind, args) in contenders.items():
            r = run_worker(kind, dict(args, name=f"{args['name']}-{rep}"))
            log(
                f"  {name} rep {rep}: {r.get('tok_per_cpu_s', 0):.0f} tok/CPU-s, {r.get('tok_per_s', 0):.0f} tok/s wall"
            )
            results[name].append(r)
    return results


def med(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def throughput_rows(section: str, results: dict[str, list[dict]], baseline: str) -> list[list[str]]:
    base = med(results[baseline], "tok_per_cpu_s")
    base_wall = med(results[baseline], "tok_per_s")
    rows = []
    for name, rs in results.items():
        cpu, wall = med(rs, "tok_per_cpu_s"), med(rs, "tok_per_s")
        rows.append(
            [
                section,
                name,
                f"{cpu:,.0f}",
                f"{wall:,.0f}",
                f"{cpu / base:.3f}x",
                f"{wall / base_wall:.3f}x",
                str(len(rs)),
            ]
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat; asserts equal weights")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated sections: overhead,packed,packing,memory,compile,scale (default: all; --quick leaves"
        " out packed and scale),"
        " streaming, allocator, dpo, grpo, independent (only when named);"
        " with --gpu, variants: eager,compile,fp8,chunked,liger,cce,all,padded,packed,packed-sdpa",
    )
    parser.add_argument(
        "--gpu", action="store_true", help="MFU of a ~1B Llama on CUDA (tools/bench_gpu.py) instead of the CPU sections"
    )
    parser.add_argument("--profile-hf", default=None, help="write a cProfile of one HF Trainer run here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("worker_args", nargs="?", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        import importlib

        importlib.import_module("ditty")  # before torch: DITTY_CPU_ALLOCATOR=return sets torch's huge pages there
        import bench_gpu
        import bench_post
        import bench_scale
        import torch

        if not opts.worker.startswith("gpu-"):
            torch.set_num_threads(1)
        workers = {**WORKERS, **bench_scale.WORKERS, **bench_gpu.WORKERS, **bench_post.WORKERS}
        out = workers[opts.worker](json.loads(opts.worker_args))
        print("BENCH_RESULT " + json.dumps(out), flush=True)
        return 0

    quick = opts.quick
    reps = opts.reps or (1 if quick else 3)
    warmup = 2 if quick else 3
    timed = 4 if quick else 12
    if opts.gpu:
        import bench_gpu

        return bench_gpu.main(run_worker, quick, opts.only)
    default = "overhead,packing,memory,compile" + ("" if quick else ",packed,scale")
    sections = (opts.only or default).split(",")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    tmp = Path(tempfile.mkdtemp(prefix="ditty-bench-"))
    atexit.register(shutil.rmtree, tmp, True)  # run directories, checkpoints, inductor caches; also on Ctrl-C
    write_text(tmp / "text.jsonl", 2000)
    write_instructions(tmp / "instructions.jsonl", 3000)
    started = time.time()
    rows: list[list[str]] = []
    notes: list[str] = []
    base = dict(tmp=str(tmp), warmup=warmup)

    if "overhead" in sections:
        log("overhead: ditty vs bare loop vs HF Trainer")
        steps = warmup + timed
        common = dict(base, data=overhead_data(tmp), steps=steps, batch=BATCH)
        contenders = {
            "bare PyTorch loop": ("bare", dict(common, name="bare", save=str(tmp / "bare.pt"))),
            "ditty Trainer": ("ditty", dict(common, name="ditty", save=str(tmp / "ditty.pt"))),
            "HF Trainer": ("hf", dict(common, name="hf")),
        }
        results = interleave(contenders, reps, log)
        rows += throughput_rows("overhead", results, "bare PyTorch loop")
        import torch

        a, b = torch.load(tmp / "bare.pt"), torch.load(tmp / "ditty.pt")
        equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        diff = max((a[k] - b[k]).abs().max().item() for k in a if k in b)
        notes.append(
            f"overhead: ditty's final weights {'EQUAL' if equal else 'DIFFER FROM'} the bare loop's "
            f"after {steps} steps (max abs difference {diff:.3g})."
        )
        if quick:
            assert equal, f"ditty's weights differ from the bare loop's (max abs difference {diff})"
        if opts.profile_hf:
            run_worker("hf", dict(common, name="hf-profile", profile=opts.profile_hf))

    if "packed" in sections:
        import bench_packed

        rows += bench_packed.run_section(run_worker, interleave, throughput_rows, dict(base, reps=reps), quick, log)

    if "packing" in sections:
        log("packing: useful tokens/s on log-normal instruction data")
        steps = warmup + (3 if quick else 6)
        common = dict(base, steps=steps)
        contenders = {
            "HF Trainer, dynamic padding (DataCollatorForSeq2Seq)": (
                "hf",
                dict(common, name="hf-pad", data=packing_data(tmp, False), batch=PACK_BATCH, collator="padding"),
            ),
            "HF Trainer, DataCollatorWithFlattening": (
                "hf",
                dict(common, name="hf-flat", data=packing_data(tmp, False), batch=PACK_BATCH, collator="flatten"),
            ),
            "ditty, padding": (
                "ditty",
                dict(common, name="ditty-pad", data=packing_data(tmp, False), batch=PACK_BATCH),
            ),
            "ditty, packing": ("ditty", dict(common, name="ditty-pack", data=packing_data(tmp, True), batch=PACK_ROWS)),
        }
        results = interleave(contenders, reps, log)
        rows += throughput_rows("packing", results, "HF Trainer, dynamic padding (DataCollatorForSeq2Seq)")

    if "compile" in sections:
        log("compile: train.compile (blocks) vs eager")
        steps = warmup + 2 + timed  # compiling (and one recompile) happens in the first steps
        common = dict(base, data=overhead_data(tmp), steps=steps, batch=BATCH, warmup=warmup + 2)
        contenders = {
            "bare PyTorch loop (eager)": ("bare", dict(common, name="c-bare")),
            "ditty (eager)": ("ditty", dict(common, name="c-ditty")),
            "ditty, train.compile (blocks)": (
                "ditty",
                dict(common, name="c-ditty-compile", sections={"train": {"compile": True}}),
            ),
        }
        results = interleave(contenders, reps, log)
        rows += throughput_rows("compile", results, "bare PyTorch loop (eager)")
        first = med(results["ditty, train.compile (blocks)"], "first_step_s")
        steady = med(results["ditty, train.compile (blocks)"], "steady_step_s")
        notes.append(
            f"compile: the first compiled step took {first:.1f} s wall against {steady:.2f} s for a steady step "
            f"(compile time about {first - steady:.0f} s with a cold inductor cache, not counted in tokens/s)."
        )

    mem_rows = []
    if "memory" in sections:
        log("memory: peak RSS and optimizer state bytes per parameter")
        common = dict(base, data=overhead_data(tmp), steps=3, batch=BATCH, measure=False, eager_optimizer=quick)
        lora = {
            "kind": "lora",
            "r": 8,
            "alpha": 16,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        }
        variants = {
            "full finetune, AdamW fp32": {},
            "full finetune, 8-bit AdamW (torchao)": {"optimizer": {"kind": "adamw8bit", "backend": "torchao"}},
            "LoRA r=8 (all linears), AdamW": {"peft": lora},
            "QLoRA (bnb 4-bit NF4 base) r=8, AdamW": {"peft": lora, "quant": {"kind": "bnb-4bit"}},
        }
        for name, sections_ in variants.items():
            r = run_worker("ditty", dict(common, name=f"mem-{len(mem_rows)}", sections=sections_))
            log(f"  {name}: {r['peak_rss_mb']:.0f} MB, {r['opt_state_bytes'] / r['params']:.2f} B/param")
            mem_rows.append(
                [
                    name,
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['params']:,}",
                    f"{r['trainable']:,}",
                    f"{r['opt_state_bytes']:,}",
                    f"{r['opt_state_bytes'] / r['params']:.3f}",
                    f"{r['opt_state_bytes'] / max(r['trainable'], 1):.3f}",
                ]
            )
        # 8-bit AdamW under FSDP2: every rank must hold torchao's 8-bit state for its own shards.
        ranks = run_fsdp_ranks(dict(common, name="mem-fsdp8bit", steps=1 if quick else 3))
        for r in ranks:
            log(
                f"  FSDP rank {r['rank']}: {r['opt_state_bytes'] / r['params']:.2f} B/local param, states "
                f"{r['state_kinds']}"
            )
            mem_rows.append(
                [
                    f"FSDP2 2 ranks, 8-bit AdamW (torchao): rank {r['rank']} (local shards)",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['params']:,}",
                    f"{r['params']:,}",
                    f"{r['opt_state_bytes']:,}",
                    f"{r['opt_state_bytes'] / r['params']:.3f}",
                    f"{r['opt_state_bytes'] / r['params']:.3f}",
                ]
            )
        every_rank = all(r["eight_bit_states"] == r["eligible_states"] > 0 for r in ranks)
        total = sum(r["opt_state_bytes"] for r in ranks) / ranks[0]["global_params"]
        notes.append(
            "memory: under FSDP2 (2 gloo ranks) "
            + "; ".join(
                f"rank {r['rank']} holds {r['eight_bit_states']} of its {r['eligible_states']} quantizable "
                f"AdamW state tensors "
                f"as torchao OptimState8bit ({', '.join(f'{n} {k}' for k, n in sorted(r['state_kinds'].items()))})"
                for r in ranks
            )
            + f": 8-bit state {'PRESENT on every rank' if every_rank else 'MISSING on some rank'}; "
            f"{total:.3f} state bytes per parameter over both ranks."
        )
        if quick:
            assert every_rank, f"8-bit AdamW state missing on some FSDP rank: {ranks}"

    post_rows: list[list[str]] = []
    for which in ("dpo", "grpo"):
        if which in sections:
            import bench_post

            log(f"{which}: ditty's Trainer vs TRL's {which.upper()}Trainer (interleaved)")
            section_rows, section_notes = bench_post.run_section(which, run_worker, base, reps, 3 if quick else 30, log)
            post_rows += section_rows
            notes += section_notes

    scale_rows: list[list[str]] = []
    if "scale" in sections:
        import bench_scale

        log("scale: chunked loss, mask-free packing, cached generation (one contender at a time)")
        scale_rows, scale_notes = bench_scale.run_section(run_worker, tmp, quick, log)
        notes += scale_notes

    if rows or mem_rows or notes or scale_rows:
        print(render(rows, mem_rows, notes, quick, reps, warmup, timed, time.time() - started, scale_rows, post_rows))
    if "streaming" in sections and not quick:
        from bench_streaming import main as streaming_benchmark  # tools/ is on the path of this script

        print(streaming_benchmark(reps=opts.reps or 2, log=log))
    if "allocator" in sections and not quick:
        from bench_allocator import main as allocator_benchmark

        print(allocator_benchmark(rounds=opts.reps or 3, log=log))
    if "independent" in sections:
        import bench_independent

        shapes = ["8x128"] if quick else list(bench_independent.SHAPES)
        found = bench_independent.compare(shapes, reps, 2, tmp / "independent", log)
        print(bench_independent.render(found, "python tools/bench.py " + " ".join(argv or sys.argv[1:])))
    return 0


def render(rows, mem_rows, notes, quick, reps, warmup, timed, elapsed, scale_rows=(), post_rows=()) -> str:
    out = [
        f"ditty benchmark ({'--quick' if quick else 'full'}: {reps} repeat(s) interleaved, {warmup} warm-up steps, "
        f"1 torch thread per process; {elapsed / 60:.1f} min)",
        "",
    ]
    if rows:
        out += [
            "| comparison | contender | useful tokens / CPU-s (median) | tokens / wall-s (median) "
            "| ratio (CPU) | ratio (wall) | runs |",
            "|---|---|---|---|---|---|---|",
        ]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    if mem_rows:
        out += [
            "| memory | peak RSS (MB) | parameters | trainable | optimizer state (bytes) "
            "| state bytes / parameter | state bytes / trainable |",
            "|---|---|---|---|---|---|---|",
        ]
        out += ["| " + " | ".join(r) + " |" for r in mem_rows]
        out.append("")
    if scale_rows:
        import bench_scale

        out += bench_scale.render(list(scale_rows))
    if post_rows:
        import bench_post

        out += bench_post.render(list(post_rows))
    out += [f"- {n}" for n in notes]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
