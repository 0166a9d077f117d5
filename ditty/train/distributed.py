"""The trainer's side of data parallelism: process group and mesh, wrapping, per-micro-batch gradient
sync, metric reductions, and the full state dict for `final/`.

The mechanics live in `ditty.parallel` (layer 2); this module decides when the trainer uses them, so
`Trainer` keeps one line per concern (`build_device`, `parallelize`, `micro_batch_sync`, ...).
On one process every function here is a cheap no-op: no process group is ever created.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("ditty.train")

SHARDED_KINDS = ("fsdp", "hsdp")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def setup(config: Any, device: torch.device):
    """Join torchrun's process group (a no-op on one process) and build the mesh -> (DistInfo, mesh).

    The group and mesh are made before any model is built, so a rank that cannot join fails before
    loading weights. The collective timeout comes from $DITTY_DIST_TIMEOUT_S (tests set it short).
    """
    from ditty.parallel import build_mesh, init_distributed

    apply_allocator_policy(config, device)
    info = init_distributed(device)
    mesh = build_mesh(config.parallel, info) if info.is_distributed else None
    if info.is_distributed:
        separate_compile_caches(info.rank, info.world_size)
    return info, mesh


def apply_allocator_policy(config: Any, device: torch.device) -> bool:
    """fsdp/hsdp on several CPU processes: fix glibc's mmap threshold, so that resident memory falls
    with the world size like the shards do (costs page faults: about 1.6x the step time; measured and
    explained in `ditty.parallel.memory.apply_distributed_allocator_policy`). Other kinds keep
    glibc's defaults: DDP and DeepSpeed on the CPU have no per-step gathers to leave holes. Before
    the process group starts its threads. Returns whether it applied."""
    if device.type != "cpu" or config.parallel.kind not in SHARDED_KINDS or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    from ditty.parallel.memory import apply_distributed_allocator_policy

    return apply_distributed_allocator_policy()


def separate_compile_caches(rank: int, world_size: int) -> None:
    """One inductor cache directory per (world size, rank), unless the user chose one.

    Uneven FSDP shards differ in shape between ranks (259 rows: 130 on rank 0, 129 on rank 1), and
    inductor's FX graph cache did not tell those graphs apart for DTensor inputs: torchao's 8-bit
    AdamW (compiled per parameter) then crashed on rank 1 with "expected size 129==130" on a second
    run that found rank 0's graph in the shared cache (torch 2.13, measured here). Costs only the
    sharing of compiled graphs between ranks.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = default_cache_dir()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # Inductor writes its default into the variable on first use (an import may already have): a
    # value equal to the default was not the user's choice.
    if chosen is not None and os.path.abspath(chosen) != os.path.abspath(default):
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default, f"ditty-world{world_size}-rank{rank}")


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def parallelize(model: nn.Module, config: Any, mesh: Any, *, block_classes: Optional[list[type]] = None) -> nn.Module:
    """DDP, or FSDP2 per block then the root, as `[parallel]` says (unchanged without a mesh).

    Runs after the converters (adapters replace modules; FSDP must see the final ones) and before
    the optimizer (FSDP2 swaps every parameter for a DTensor shard, and the optimizer must hold those).
    Meta parameters (the low-memory build) are materialised and loaded by `load_meta_weights` after.
    """
    if mesh is None or config.parallel.kind == "deepspeed":  # the engine wraps it after the optimizer (build_engine)
        return model
    from ditty.parallel import apply_parallelism

    return apply_parallelism(
        model, config.parallel, mesh, precision=config.train.precision, block_classes=block_classes
    )


def micro_batch_sync(model: nn.Module, config: Any, index: int, count: int):
    """Context for one micro-batch's forward and backward: gradients are reduced across ranks on the
    last micro-batch only (unless `parallel.sync_grad_accum`); a plain context on one process."""
    if not is_distributed():
        return contextlib.nullcontext()
    from ditty.parallel import no_sync_context

    return no_sync_context(model, index == count - 1, config.parallel.sync_grad_accum)


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (the gradient norm of sharded gradients) as a plain tensor; others unchanged.
    Cost: one collective for a DTensor with a partial placement."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def mean_across_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """The loss calculator's extra metrics averaged over ranks (one all-reduce; none without extras)."""
    if not metrics or not is_distributed():
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))


def peak_memory_mb(device: torch.device) -> float:
    """This rank's peak memory in MB (CUDA: allocated by tensors; CPU: peak resident set size), then
    the maximum over ranks. Cost: one small all-reduce; call it only when a record is logged."""
    if device.type == "cuda":
        value = torch.cuda.max_memory_allocated(device)
    else:
        from ditty.parallel.memory import peak_rss_bytes

        value = peak_rss_bytes()
    t = torch.tensor([float(value) / 2**20], dtype=torch.float64)
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return round(float(t[0]), 1)


def memory_figures(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, int]:
    """Bytes this rank holds in parameters and optimizer state (local shards), max over ranks.

    For env.json: with FSDP on N ranks both fall to about 1/N of one process (acceptance: <= 0.55 on 2).
    Optimizer state exists only after the first step; `optimizer_state_bytes` then is the true figure.
    """
    from ditty.parallel.memory import optimizer_state_bytes, parameter_bytes
    from ditty.train import deepspeed_engine

    if deepspeed_engine.is_engine(model):
        params, states = deepspeed_engine.memory_figures(model)
    else:
        params, states = parameter_bytes(model), optimizer_state_bytes(optimizer)
    t = torch.tensor([params, states], dtype=torch.float64)
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"parameter_bytes_per_rank": int(t[0]), "optimizer_state_bytes_per_rank": int(t[1])}


def memory_record(trainer: Any) -> dict[str, Any]:
    """`peak_mem_mb` (max over ranks) for a metrics record. On the first record, also this rank's
    parameter and optimizer-state bytes (max over ranks, from the local tensors: shards under FSDP),
    added to env.json as "memory" by rank 0. Every rank logs the same steps, so the collectives match."""
    record: dict[str, Any] = {"peak_mem_mb": peak_memory_mb(trainer.device)}
    if getattr(trainer, "_memory_reported", False):
        return record
    trainer._memory_reported = True
    figures = memory_figures(trainer.model, trainer.optimizer)
    if dist.get_rank() == 0 if is_distributed() else True:
        _add_to_env(
            trainer.run_dir,
            {"memory": {**figures, "world_size": trainer.world_size, "parallel": trainer.config.parallel.kind}},
        )
    return record


def _add_to_env(run_dir: str, values: dict[str, Any]) -> None:
    import json

    path = os.path.join(run_dir, "env.json")
    try:
        with open(path, encoding="utf-8") as f:
            env = json.load(f)
        env.update(values)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(env, f, indent=2)
            f.write("\n")
        os.replace(path + ".tmp", path)
    except (OSError, ValueError) as exc:  # a figure must never stop training
        log.warning("could not add memory figures to env.json: %s", exc)


def full_state_dict(model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """The whole model's state dict on rank 0 (CPU), None elsewhere; None on every rank when the
    model is not sharded (rank 0 then saves its own full copy as usual).

    Every rank must call this (it gathers shard by shard). `cpu_offload` moves each gathered tensor to
    the CPU as it arrives and keeps it on rank 0 only, so no accelerator ever holds the whole model;
    the host memory is one full copy on rank 0, the same as the `final/` it is about to write.
    """
    from ditty.train import deepspeed_engine

    if deepspeed_engine.is_engine(model):
        return deepspeed_engine.full_state_dict(model)
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if dist.get_rank() == 0 else None


def load_meta_weights(
    model: nn.Module,
    model_dir: Optional[str],
    device: torch.device,
    *,
    rank0_tensors: Optional[dict[str, torch.Tensor]] = None,
    quantized: bool = False,
) -> nn.Module:
    """Fill a sharded model built on the meta device (every rank calls it, after `parallelize`).

    Full finetune: rank 0 reads the safetensors directory tensor by tensor. Quantized base
    (`quantized`, from `build_quantized_on_meta`): rank 0 sends the tensors it loaded and quantized
    (`rank0_tensors`, from `rank0_full_tensors`; None elsewhere), LoRA adapters included, then
    every `Linear4bit`'s quantization state. Each rank keeps only its shard.
    """
    from ditty.parallel.materialize import load_sharded_from_rank0_tensors, load_sharded_from_safetensors

    if not quantized:
        return load_sharded_from_safetensors(model, model_dir if dist.get_rank() == 0 else None, device=device)
    from ditty.models.quant import share_4bit_quant_states

    load_sharded_from_rank0_tensors(model, rank0_tensors if dist.get_rank() == 0 else None, device=device)
    share_4bit_quant_states(model, device)
    return model


def meta_build_source(config: Any, components: Any) -> Optional[str]:
    """The local pretrained directory to load shard by shard, when the low-memory build applies.

    It applies to fsdp/hsdp on several processes for a pretrained Hugging Face model in a local
    directory, given as a recipe (not a Python model instance), without a factory, and either
    - a full finetune (no quantization, no adapter) of safetensors weights: every rank builds on the
      meta device and rank 0 reads the checkpoint tensor by tensor; or
    - QLoRA: `quant.kind = "bnb-4bit"` with `peft.kind = "lora"` (no fp8, no remote code): rank 0
      loads and quantizes, the others build the same modules on the meta device
      (`build_quantized_on_meta`), and rank 0 sends the shards after `fully_shard`.
    Otherwise None: every rank builds the whole model and `fully_shard` drops the rest (parameter
    bytes shrink, peak memory does not). Decided on rank 0 and shared (one small broadcast), so
    ranks that see the directory differently cannot take different paths and wait on each other.
    """
    from ditty.parallel.materialize import share_from_rank0

    m = config.model
    if not is_distributed() or config.parallel.kind not in SHARDED_KINDS:
        return None
    if getattr(components, "model", None) is not None or m.factory:
        return None
    quantized = config.quant.kind != "none"
    if quantized and not _low_memory_qlora(config):
        return None
    if (
        not quantized and config.peft.kind != "none"
    ):  # peft would create the adapter on the meta device of its base layer
        return None
    if m.resolved_init != "pretrained" or not m.path:
        return None
    source = None
    if dist.get_rank() == 0 and os.path.isdir(m.path):
        # rank 0 loads a quantized base with from_pretrained (any format it reads); a full finetune
        # streams safetensors.
        has_weights = quantized or any(
            os.path.exists(os.path.join(m.path, name)) for name in ("model.safetensors", "model.safetensors.index.json")
        )
        source = m.path if has_weights else None
    return share_from_rank0(source)


def _low_memory_qlora(config: Any) -> bool:
    fp8 = getattr(config, "fp8", None)
    return (
        config.quant.kind == "bnb-4bit"
        and config.peft.kind == "lora"
        and not getattr(fp8, "enabled", False)
        and not config.model.trust_remote_code
    )


def build_on_meta(config: Any, tokenizer: Any, device: torch.device) -> Optional[nn.Module]:
    """The pretrained architecture with meta parameters (real buffers), or None when the tokenizer
    needs a larger embedding than the checkpoint's (the ordinary build resizes it).

    With a quantized base, `build_quantized_on_meta`: rank 0's model is real (loaded and quantized).
    """
    from transformers import AutoModelForCausalLM

    from ditty.models.build import _attention_kwargs, _hf_config, _resolve_dtype
    from ditty.parallel import meta_init

    if config.quant.kind != "none":
        return build_quantized_on_meta(config, tokenizer, device)
    m = config.model
    _, hf_config = _hf_config(m, {})
    if tokenizer is not None and len(tokenizer) > hf_config.vocab_size:
        return None
    dtype = _resolve_dtype(m.dtype, device, default_accelerator=None)
    if not isinstance(dtype, torch.dtype):  # "auto" on an accelerator: the checkpoint's own dtype
        dtype = getattr(hf_config, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with meta_init():
        model = AutoModelForCausalLM.from_config(
            hf_config, dtype=dtype, trust_remote_code=m.trust_remote_code, **_attention_kwargs(m)
        )
    if getattr(model.config, "pad_token_id", None) is None and getattr(tokenizer, "pad_token_id", None) is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def build_quantized_on_meta(config: Any, tokenizer: Any, device: torch.device) -> nn.Module:
    """Low-memory FSDP + QLoRA (the loading Answer.AI published): rank 0 builds and quantizes the
    model exactly as one process does; the other ranks never read a weight nor quantize.

    Rank 0 shares a skeleton (its final config, every `Linear4bit` with its packed shape and
    settings, every tensor's name, shape and dtype) and its RNG state; the others build that
    architecture with meta parameters and swap in meta `Linear4bit`s (`rebuild_quantized_on_meta`),
    and take rank 0's RNG state so the adapters peft creates next draw what rank 0's draw (they are
    sent from rank 0 anyway). An error on rank 0 (a bad checkpoint) or on any rank is raised on every
    rank. Then: converters, `parallelize`, and `load_meta_weights(..., quantized=True)`.
    """
    import copy

    from transformers import AutoModelForCausalLM

    from ditty.models import build_model
    from ditty.models.build import _attention_kwargs
    from ditty.models.quant import quantized_skeleton, rebuild_quantized_on_meta
    from ditty.parallel import meta_init
    from ditty.parallel.materialize import share_from_rank0

    rank = dist.get_rank()
    model: Optional[nn.Module] = None
    payload: Any = None
    if rank == 0:
        try:
            model = build_model(config.model, tokenizer=tokenizer, device=device, quant=config.quant)
            payload = {"skeleton": quantized_skeleton(model), "rng": torch.get_rng_state()}
        except Exception as error:  # every rank raises it: none waits for weights that never come
            payload = error
    payload = share_from_rank0(payload)
    if isinstance(payload, BaseException):
        raise payload
    error: Optional[BaseException] = None
    if rank != 0:
        try:
            skeleton = payload["skeleton"]
            hf_config = copy.deepcopy(skeleton["config"])
            for key in ("quantization_config", "_is_quantized"):  # a plain architecture first
                hf_config.__dict__.pop(key, None)
            with meta_init():
                model = AutoModelForCausalLM.from_config(
                    hf_config, dtype=skeleton["dtype"], **_attention_kwargs(config.model)
                )
            model = rebuild_quantized_on_meta(model, skeleton)
            torch.set_rng_state(payload["rng"])
        except Exception as exc:  # noqa: BLE001 - shared below, so rank 0 does not wait in fully_shard's peers
            error = exc
    _raise_on_every_rank(error)
    assert model is not None
    return model


def _raise_on_every_rank(error: Optional[BaseException]) -> None:
    """All ranks learn whether any rank failed (one all_gather_object); all raise the first failure."""
    from ditty.parallel.materialize import portable_error

    shared = None if error is None else portable_error(error)
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, shared)
    for rank, failure in enumerate(errors):
        if failure is None:
            continue
        if error is not None:
            raise error
        if isinstance(failure, BaseException):
            raise failure
        raise RuntimeError(f"rank {rank} could not build its meta-device model: {failure}")


def rank0_full_tensors(model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """On rank 0, references to every full tensor of the unsharded model (adapters included) for
    `load_meta_weights` to send after `parallelize`; None on the other ranks. Call it after the
    converters: it keeps rank 0's full copy alive until the load sends it (and frees it) tensor by tensor."""
    from ditty.parallel.materialize import full_tensor_references

    return full_tensor_references(model) if dist.get_rank() == 0 else None


def teardown() -> None:
    """Leave the process group at the end of a run (a no-op on one process)."""
    from ditty.parallel import destroy_distributed

    destroy_distributed()


@contextlib.contextmanager
def process_group_for_run() -> Iterator[None]:
    """Destroy the process group when the run ends normally. After an error it is left alone: torchrun
    stops the other ranks, and a destroy could wait on a peer that is already gone."""
    yield
    teardown()
