"""Functions that run on each rank (importable by spawned processes)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.parallel.harness import TinyNet, full_grads, full_state, global_batches, token_loss_sum


def train(rank: int, world: int, parallel_kwargs: dict, steps: int = 4, accumulation: int = 2):
    """SGD with momentum (sensitive to the gradient's scale, unlike Adam) on the same global batches.

    Each rank takes a contiguous slice of every global batch and splits it into `accumulation`
    micro-batches; the loss is the per-token mean over the whole global batch. Returns the per-step
    losses, the final full weights and the first step's full gradients.
    """
    from ditty.config.sections import ParallelConfig
    from ditty.parallel.accumulation import grad_average_correction, no_sync_context
    from ditty.parallel.env import init_distributed
    from ditty.parallel.mesh import build_mesh
    from ditty.parallel.wrap import apply_parallelism

    parallel = ParallelConfig(**parallel_kwargs)
    torch.manual_seed(0)
    model = TinyNet()
    if world > 1:
        info = init_distributed("cpu")
        model = apply_parallelism(model, parallel, build_mesh(parallel, info), precision="fp32")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    correction = grad_average_correction(world)
    losses, first_grads = [], None
    for step, (x, y, mask) in enumerate(global_batches(steps)):
        per_rank = x.shape[0] // world
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        x, y, mask = x[mine], y[mine], mask[mine]
        global_tokens = mask.sum()
        if world > 1:
            dist.all_reduce(global_tokens)
        micro = per_rank // accumulation
        total = torch.zeros(())
        for i in range(accumulation):
            part = slice(i * micro, (i + 1) * micro)
            with no_sync_context(model, i == accumulation - 1, parallel.sync_grad_accum):
                loss = token_loss_sum(model, x[part], y[part], mask[part]) / global_tokens
                (loss * correction).backward()
            total += loss.detach()
        if world > 1:
            dist.all_reduce(total)
        if step == 0:
            first_grads = full_grads(model)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(total))
    return losses, full_state(model), first_grads, type(model).__name__


def load_sharded(rank: int, world: int, model_dir: str, how: str):
    """Build a tiny HF Llama on meta, fully_shard it, fill it from rank 0; return full weights and logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ditty.config.sections import ParallelConfig
    from ditty.parallel.env import init_distributed
    from ditty.parallel.materialize import load_sharded_from_rank0, load_sharded_from_safetensors, meta_init
    from ditty.parallel.mesh import build_mesh
    from ditty.parallel.wrap import apply_parallelism

    info = init_distributed("cpu")
    config = AutoConfig.from_pretrained(model_dir)
    with meta_init():
        model = AutoModelForCausalLM.from_config(config)
    assert all(p.is_meta for p in model.parameters())
    parallel = ParallelConfig(kind="fsdp")
    model = apply_parallelism(model, parallel, build_mesh(parallel, info))
    if how == "safetensors":
        load_sharded_from_safetensors(model, model_dir if rank == 0 else None)
    else:
        full = None
        if rank == 0:
            from safetensors.torch import load_file

            full = load_file(f"{model_dir}/model.safetensors")
        load_sharded_from_rank0(model, full)
    local = {n: p.to_local().shape for n, p in model.named_parameters()}
    with torch.no_grad():
        logits = model(torch.arange(10)[None, :]).logits
    return full_state(model), logits, local


# ~105M parameters with the blocks dominating, as in real LLMs (7B Llama: the embedding and the head
# are 2% each). With a 32k vocabulary at this width they would be 23% each, and FSDP's transient for
# the largest unit (gathered weight, full gradient, reduce-scatter buffers) would set the peak.
LLAMA_105M = dict(
    vocab_size=8192,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=13,
    num_attention_heads=12,
    num_key_value_heads=12,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def save_llama_105m(path: str) -> int:
    """A random LLAMA_105M (seed 0) saved in Hugging Face format at `path`; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_105M))
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def memory_run(rank: int, world: int, model_dir: str, mode: str, steps: int = 2, opt_in_mmap: bool = False):
    """Peak resident memory above the after-import baseline, and local parameter + optimizer bytes.

    mode "sharded": meta build -> fully_shard (on >1 rank) -> rank 0 streams the checkpoint.
    mode "naive": every rank builds and loads the whole model, then fully_shard (the old way).
    Same global batch (4 sequences of 64 tokens) split over the ranks; AdamW; `steps` steps.
    The allocator policy is ditty's for fsdp (`ditty.parallel.allocator`: glibc's own on one process,
    a fixed 2 MB mmap threshold on several, unless the environment says otherwise); `opt_in_mmap` applies
    `return_freed_memory_to_os()` (64 KB) instead, for comparison.
    """
    import gc
    import resource
    import time

    import psutil
    from transformers import AutoConfig, LlamaForCausalLM

    from ditty.config.sections import ParallelConfig
    from ditty.parallel.allocator import apply_host_allocator_policy, return_freed_memory_to_os
    from ditty.parallel.env import init_distributed
    from ditty.parallel.materialize import load_sharded_from_safetensors, meta_init
    from ditty.parallel.memory import optimizer_state_bytes, parameter_bytes, peak_rss_bytes
    from ditty.parallel.mesh import build_mesh
    from ditty.parallel.wrap import apply_parallelism

    if opt_in_mmap:
        assert return_freed_memory_to_os()
    else:  # what the trainer applies (a fixed 2 MB threshold for fsdp on several CPU processes)
        apply_host_allocator_policy("cpu", "fsdp", world)
    config = AutoConfig.from_pretrained(model_dir)
    gc.collect()
    baseline_peak, baseline_rss = peak_rss_bytes(), psutil.Process().memory_info().rss
    info = init_distributed("cpu")
    parallel = ParallelConfig(kind="fsdp")
    if mode == "sharded":
        with meta_init():
            model = LlamaForCausalLM(config)
        if world > 1:
            model = apply_parallelism(model, parallel, build_mesh(parallel, info))
        load_sharded_from_safetensors(model, model_dir if rank == 0 else None)
    else:
        model = LlamaForCausalLM(config)
        load_sharded_from_safetensors(model, model_dir)  # each rank reads the whole checkpoint
        if world > 1:
            model = apply_parallelism(model, parallel, build_mesh(parallel, info))
    after_load = peak_rss_bytes() - baseline_peak
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (4, 64), generator=g)
    per_rank = 4 // world
    mine = tokens[rank * per_rank : (rank + 1) * per_rank]
    losses, step_seconds, step_cpu_seconds, step_page_faults = [], [], [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        loss = model(input_ids=mine, labels=mine).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        step_seconds.append(time.perf_counter() - start)
        step_cpu_seconds.append(time.process_time() - cpu_start)
        step_page_faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start)
    return {
        "step_seconds": step_seconds,  # wall clock: noisy on a shared machine
        "step_cpu_seconds": step_cpu_seconds,  # this process's CPU time (all threads, user + system)
        "step_page_faults": step_page_faults,  # minor faults: fresh pages from the kernel
        "baseline_rss": baseline_rss,
        "peak_above_baseline": peak_rss_bytes() - baseline_peak,
        "peak_after_load": after_load,
        "param_bytes": parameter_bytes(model),
        "optimizer_bytes": optimizer_state_bytes(optimizer),
        "losses": losses,
    }
