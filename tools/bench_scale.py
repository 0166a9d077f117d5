"""tools/bench.py's section "scale": memory at long sequences and large vocabularies (issue 16).

Each contender is one training step (or one generation) in a fresh subprocess with one torch
thread, run one after the other (never at the same time, so peak resident memory is each one's
own); the ratios compare contenders of one run.

- loss: a causal LM with a 128,256-token vocabulary (hidden 256, 2 layers), one micro-batch of
  4,096 tokens (4 rows of 1,024), AdamW: the full-logits loss (CausalLMLoss) against the chunked
  one (FusedLinearCrossEntropyLoss, 8 chunks). Peak RSS of the process, tokens per CPU-second of
  the steps after a warm-up step, and the per-token loss and every gradient of the first step
  compared (the same seed builds the same weights in both processes).
- packing: one packed row of 16,384 tokens (64 samples of 256), byte vocabulary, same shape of
  model: mask-free (cumulative lengths, per-sample attention) against the dense [1, 1, T, T] mask;
  then the same pair with each decoder layer checkpointed (ditty's activation_checkpointing "full");
  then both pairs again with DITTY_CPU_ALLOCATOR=return (freed memory goes back to the kernel), to
  separate what the tensors need from what glibc's heap keeps after a step freed it.
- generation: 64 prompts (a validation batch) and 64 new tokens with transformers' KV-cached greedy
  search against the uncached decode (the whole prefix again for every token); same outputs asserted.
--quick shrinks every size (vocabulary 8,192 and 512 tokens; 2,048 packed tokens; 16 new tokens).
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

SEED = 0
RETURNING_MALLOC = {"DITTY_CPU_ALLOCATOR": "return"}
"""ditty's opt-in for CPU runs whose peak is glibc's heap rather than the tensors
(`ditty.parallel.allocator.returning_allocator_requested`): every allocation of 2 MB or more is its
own mapping, in huge pages, returned to the kernel when freed."""


def sizes(quick: bool) -> dict:
    if quick:
        return dict(vocab=8192, rows=2, width=256, chunks=8, samples=8, sample_len=256, prompts=8, new_tokens=16)
    return dict(vocab=128256, rows=4, width=1024, chunks=8, samples=64, sample_len=256, prompts=64, new_tokens=64)


def model_config(vocab: int, max_positions: int):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "llama",
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def build(vocab: int, max_positions: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    return AutoModelForCausalLM.from_config(model_config(vocab, max_positions), attn_implementation="sdpa")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_steps(step, steps: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each call of `step`."""
    out = []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        out.append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


# ============================================================================ workers


def worker_loss(a: dict) -> dict:
    """One micro-batch of rows x width tokens through ditty's pipeline, backward, AdamW step."""
    import contextlib

    import torch
    from safetensors.torch import save_file

    from ditty.stages.fused_loss import FusedLinearCrossEntropyLoss
    from ditty.stages.loss import CausalLMLoss
    from ditty.stages.processors import Context
    from ditty.train.pipeline import StageChain, run_pipeline

    model = build(a["vocab"], a["width"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, a["vocab"], (a["rows"], a["width"]), generator=generator)
    batch = {"input_ids": ids, "labels": ids.clone()}
    loss = FusedLinearCrossEntropyLoss(chunks=a["chunks"]) if a["chunked"] else CausalLMLoss()
    pipeline = StageChain([], [], loss)
    before = rss_mb()
    first = {}

    def step():
        out = run_pipeline(pipeline, model, batch, Context(model=model), contextlib.nullcontext)
        mean = out.loss / out.num_tokens
        mean.backward()
        if not first:
            first["loss"] = mean.item()
            save_file({n: p.grad.contiguous() for n, p in model.named_parameters()}, a["grads"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = timed_steps(step, a["steps"])
    tokens = a["rows"] * (a["width"] - 1)
    cpu = sum(t[1] for t in times[1:])
    return {
        "loss": first["loss"],
        "peak_rss_mb": peak_rss_mb(),
        "step_increment_mb": peak_rss_mb() - before,
        "tok_per_cpu_s": tokens * (len(times) - 1) / cpu,
        "tok_per_s": tokens * (len(times) - 1) / sum(t[0] for t in times[1:]),
    }


def worker_packed(a: dict) -> dict:
    """One packed row of `samples` x `sample_len` tokens: forward, backward, AdamW step."""
    import torch

    from ditty.config import TrainerConfig
    from ditty.data.collate import pack_rows
    from ditty.models.packing import dense_block_mask, packed_inputs
    from ditty.parallel.allocator import returning_allocator_requested
    from ditty.parallel.runtime import apply_allocator_policy
    from ditty.stages.loss import CausalLMLoss

    if returning_allocator_requested():  # what the trainer does first, with the same checks
        assert apply_allocator_policy(TrainerConfig(), torch.device("cpu")), "glibc did not take the mmap threshold"
    width = a["samples"] * a["sample_len"]
    model = build(259, width)
    if a["checkpointing"]:
        from ditty.parallel.speed import apply_activation_checkpointing

        apply_activation_checkpointing(model, "full")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(a["samples"]):
        ids = torch.randint(3, 259, (a["sample_len"],), generator=generator).tolist()
        samples.append((ids, ids))
    batch = pack_rows([samples], pad_token_id=0)
    if a["mask_free"]:
        kwargs = packed_inputs(model, batch)  # PACKED_SDPA: per-sample attention, no mask
    else:  # what ditty did before: the block-diagonal additive mask
        kwargs = {
            "input_ids": batch["input_ids"],
            "position_ids": batch["position_ids"],
            "attention_mask": dense_block_mask(batch["cu_seq_lens_q"], 1, width),
        }
    loss = CausalLMLoss()
    before = rss_mb()

    def step():
        out = loss.compute(model(**kwargs, use_cache=False), {"labels": batch["labels"]})
        (out.loss / out.num_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = timed_steps(step, a["steps"])
    return {
        "peak_rss_mb": peak_rss_mb(),
        "step_increment_mb": peak_rss_mb() - before,
        "step_cpu_s": min(t[1] for t in times[1:]),
        "step_wall_s": min(t[0] for t in times[1:]),
        "kernel": model.config._attn_implementation,
    }


def worker_generate(a: dict) -> dict:
    """Validation generation: `prompts` addition prompts, `new_tokens` greedy tokens."""
    import json

    import torch

    from ditty.data.task import greedy_generate
    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = model_config(len(tokenizer), 256)
    config.num_hidden_layers = 4
    torch.manual_seed(SEED)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    prompts = [f"{(7 * i) % 100}+{(13 * i) % 100}=" for i in range(a["prompts"])]
    greedy_generate(model, tokenizer, prompts[:2], "cpu", 2, use_cache=a["cache"])  # warm-up
    wall, cpu = time.perf_counter(), time.process_time()
    texts = greedy_generate(model, tokenizer, prompts, "cpu", a["new_tokens"], use_cache=a["cache"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    Path(a["texts"]).write_text(json.dumps(texts))
    return {"wall_s": wall, "cpu_s": cpu}


WORKERS = {"scale-loss": worker_loss, "scale-packed": worker_packed, "scale-generate": worker_generate}


# ============================================================================ the section


def run_section(run_worker, tmp: Path, quick: bool, log) -> tuple[list[list[str]], list[str]]:
    """Rows of the "scale" table and notes (with the acceptance targets of issue 16)."""
    import json

    from safetensors.torch import load_file

    s = sizes(quick)
    rows: list[list[str]] = []
    notes: list[str] = []
    steps = 2 if quick else 3

    # --- chunked loss vs full logits
    results = {}
    for name, chunked in (("full logits (CausalLMLoss)", False), (f"chunked loss ({s['chunks']} chunks)", True)):
        args = dict(s, tmp=str(tmp), name=name, chunked=chunked, steps=steps, grads=str(tmp / f"grads-{chunked}.st"))
        results[name] = r = run_worker("scale-loss", args)
        log(f"  loss, {name}: peak {r['peak_rss_mb']:.0f} MB, {r['tok_per_cpu_s']:.0f} tok/CPU-s")
    full, chunk = results.values()
    grads = [load_file(str(tmp / f"grads-{flag}.st")) for flag in (False, True)]
    grad_diff = max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0])
    loss_diff = abs(full["loss"] - chunk["loss"])
    tokens = s["rows"] * s["width"]
    for name, r in results.items():
        rows.append(
            [
                f"loss, vocab {s['vocab']:,}, {tokens:,} tokens",
                name,
                f"{r['peak_rss_mb']:,.0f}",
                f"{r['peak_rss_mb'] / full['peak_rss_mb']:.3f}x",
                f"{r['tok_per_cpu_s']:,.0f} tok/CPU-s",
                f"{r['tok_per_cpu_s'] / full['tok_per_cpu_s']:.3f}x",
            ]
        )
    notes.append(
        f"scale/loss: per-token loss {full['loss']:.6f} (full) vs {chunk['loss']:.6f} (chunked), difference "
        f"{loss_diff:.2e}; largest gradient difference over every parameter {grad_diff:.2e}. Target: peak RSS "
        f"<= 0.4x ({chunk['peak_rss_mb'] / full['peak_rss_mb']:.3f}x), loss and gradients within 1e-5 "
        f"({'met' if max(loss_diff, grad_diff) <= 1e-5 else 'MISSED'}), tokens/s >= 0.9x "
        f"({chunk['tok_per_cpu_s'] / full['tok_per_cpu_s']:.3f}x)."
    )

    # --- mask-free packing vs the dense mask, without and with activation checkpointing (the mask's
    # share where the layers' activations are recomputed, as long rows are usually trained), under
    # glibc's default and under RETURNING_MALLOC (what the tensors need, without the memory glibc's
    # heap holds on to); the ratios compare within a pair.
    width = s["samples"] * s["sample_len"]
    for returning, checkpointing in ((False, False), (False, True), (True, False), (True, True)):
        results = {}
        suffix = (", activation checkpointing" if checkpointing else "") + (
            ", freed memory returned (DITTY_CPU_ALLOCATOR=return)" if returning else ""
        )
        env = RETURNING_MALLOC if returning else {}
        for name, mask_free in (("dense [1,1,T,T] mask", False), ("mask-free (per-sample SDPA)", True)):
            args = dict(s, tmp=str(tmp), name=name, mask_free=mask_free, checkpointing=checkpointing, steps=steps)
            args["env"] = env
            results[name] = r = run_worker("scale-packed", args)
            log(
                f"  packing{suffix}, {name}: peak {r['peak_rss_mb']:.0f} MB, step {r['step_cpu_s']:.2f} CPU-s "
                f"({r['kernel']})"
            )
        dense, free = results.values()
        for name, r in results.items():
            rows.append(
                [
                    f"packing, 1 row of {width:,} tokens ({s['samples']} x {s['sample_len']}){suffix}",
                    name,
                    f"{r['peak_rss_mb']:,.0f}",
                    f"{r['peak_rss_mb'] / dense['peak_rss_mb']:.3f}x",
                    f"{r['step_cpu_s']:.2f} CPU-s / step",
                    f"{dense['step_cpu_s'] / r['step_cpu_s']:.3f}x",
                ]
            )
        notes.append(
            f"scale/packing{suffix}: step increment over the built model {dense['step_increment_mb']:,.0f} MB "
            f"(dense) vs {free['step_increment_mb']:,.0f} MB (mask-free). Target: peak RSS <= 0.5x "
            f"({free['peak_rss_mb'] / dense['peak_rss_mb']:.3f}x), step not slower "
            f"({dense['step_cpu_s'] / free['step_cpu_s']:.3f}x the dense step's speed, CPU time)."
        )

    # --- generation with and without the KV cache
    results = {}
    for name, cache in (("uncached decode", False), ("KV cache (transformers generate)", True)):
        texts = str(tmp / f"texts-{cache}.json")
        results[name] = r = run_worker("scale-generate", dict(s, tmp=str(tmp), name=name, cache=cache, texts=texts))
        log(f"  generation, {name}: {r['cpu_s']:.2f} CPU-s")
    same = json.loads((tmp / "texts-True.json").read_text()) == json.loads((tmp / "texts-False.json").read_text())
    slow, fast = results.values()
    for name, r in results.items():
        rows.append(
            [
                f"generation, {s['prompts']} prompts x {s['new_tokens']} new tokens",
                name,
                "",
                "",
                f"{r['cpu_s']:.2f} CPU-s",
                f"{slow['cpu_s'] / r['cpu_s']:.3f}x",
            ]
        )
    notes.append(
        f"scale/generation: outputs {'IDENTICAL' if same else 'DIFFERENT'}; KV cache "
        f"{slow['cpu_s'] / fast['cpu_s']:.2f}x faster in CPU time ({slow['wall_s'] / fast['wall_s']:.2f}x wall). "
        "Target >= 3x, same outputs."
    )
    assert same, "cached generation changed the outputs"
    return rows, notes


def render(rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    out = [
        "| scale | contender | peak RSS (MB) | RSS ratio | throughput | speed ratio |",
        "|---|---|---|---|---|---|",
    ]
    return out + ["| " + " | ".join(r) + " |" for r in rows] + [""]
