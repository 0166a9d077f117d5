"""The recipe as the planner sees it: the target machine, and every dtype and kind resolved once.

`Target` is what `ditty check --plan` is asked about (device type, GPUs per node, nodes, memory per
device). `Settings.resolve(config, shape, target)` turns the recipe's "auto"s and defaults into
the concrete choices the trainer will make, using the same rules (model.dtype "auto", the FSDP
mixed-precision policy, the optimizer's default backend, the upcast of a quantized base).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from ditty.config.errors import RecipeError
from ditty.models.packing import planned_path
from ditty.plan.architecture import ModelShape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int8": 1}
PRECISION_DTYPE = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
SHARDED = ("fsdp", "hsdp")
GiB = 2**30
_UNITS = {"": GiB, "g": GiB, "gb": GiB, "gib": GiB, "m": 2**20, "mb": 2**20, "mib": 2**20, "t": 2**40, "tb": 2**40}


def parse_memory(text: str) -> int:
    """Bytes of a memory size such as "80GB", "24 GiB", "16384MB". GB means GiB: an "80GB" GPU
    reports 80 GiB less what the driver keeps, so GPU makers' GB are binary."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise RecipeError.single(
            f"cannot read the memory size {text!r}", fix="write it like 80GB, 24GB or 16384MB (GB = GiB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Target:
    device: Literal["cuda", "cpu"] = "cuda"
    gpus_per_node: int = 1
    nodes: int = 1
    memory: Optional[int] = None
    """Bytes of memory per device; None when not stated (no fit verdict then)."""
    gpu: Optional[str] = None
    """A GPU name from ditty/plan/devices.py (its peak FLOPs time the run)."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Settings:
    """Everything the byte and FLOP models need, with no "auto" left."""

    device: str
    world_size: int
    weight_dtype: str
    """How weights are stored (model.dtype resolved)."""
    compute_dtype: Optional[str]
    """train.precision's autocast dtype; None for fp32 (no autocast)."""
    parallel: str
    shard_size: int
    """Ranks a parameter is split over: fsdp world, hsdp shard group, deepspeed world; 1 otherwise."""
    gather_dtype: str
    """Dtype FSDP gathers parameters in for compute (its mixed-precision param dtype)."""
    quant: str
    quant_storage: str
    double_quant: bool
    upcast_unquantized: bool
    """A quantized base's other floating parameters upcast to fp32 (one process, DDP)."""
    peft: str
    lora_r: int
    lora_targets: Any
    lora_dropout: float
    modules_to_save: tuple[str, ...]
    optimizer: str
    optimizer_backend: str
    momentum: float
    micro_batch: int
    seq_len: int
    accumulation: int
    activation_checkpointing: str
    loss_chunks: int
    packing: bool
    packed_attention: str
    """How packed rows reach attention (ditty.models.packing): "dense" (the [B, 1, T, T] block mask:
    model types outside MASK_FREE_MODEL_TYPES, and rows up to DENSE_MASK_MAX_WIDTH on the CPU),
    "per-sample" (ditty's per-sample SDPA: wider rows on the CPU, or sdpa/eager on CUDA), "kernel"
    (flash varlen or flex attention on CUDA); "" without packing. See packing.isolation_path."""
    reshard_after_forward: Any
    cpu_offload: bool
    zero_stage: int
    offload_optimizer: bool
    offload_params: bool
    gradient_as_bucket_view: bool
    low_memory_load: bool
    """fsdp/hsdp from a local directory: rank 0 streams (or quantizes) and the others build on meta."""
    task: str = "causal-lm"
    """`model.task`: a classifier's logits are label scores, not a vocabulary per token."""
    tp: int = 1
    """Tensor-parallel degree: block linears, the embedding and the head split tp ways (ditty.plan.tensor_parallel)."""
    cp: int = 1
    """Context-parallel degree: each rank holds 1/cp of every row's tokens."""
    objective: Any = None
    """What the objective adds (ditty.objectives.reference.Footprint): the reference, the rollouts."""

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank (padded or packed to at most max_seq_len; under
        context parallel the rank's slice of every row)."""
        return self.micro_batch * -(-self.seq_len // self.cp)

    @property
    def autocast(self) -> bool:
        return self.compute_dtype is not None

    @property
    def activation_bytes(self) -> int:
        """Bytes per element of the matrix products' outputs."""
        if self.compute_dtype:
            return DTYPE_BYTES[self.compute_dtype]
        return DTYPE_BYTES[self.gather_dtype if self.parallel in SHARDED else self.weight_dtype]

    @classmethod
    def resolve(cls, config: Any, shape: ModelShape, target: Target) -> "Settings":
        train, parallel, quant, peft = config.train, config.parallel, config.quant, config.peft
        world = target.world_size
        weight_dtype = _weight_dtype(config, shape, target)
        compute = PRECISION_DTYPE[train.precision]
        tp, cp = max(1, getattr(parallel, "tp", 1)), max(1, getattr(parallel, "cp", 1))
        if parallel.kind in SHARDED:
            # FSDP2 shards over the ranks that tensor parallel leaves (data x context parallel).
            shard = world // tp if parallel.kind == "fsdp" else _hsdp_shard(parallel, world)
            gather = parallel.param_dtype or compute or weight_dtype
        else:
            shard = world if parallel.kind == "deepspeed" else 1
            gather = weight_dtype
        if parallel.kind == "deepspeed" and compute:
            weight_dtype = gather = compute  # the engine casts the module to its 16-bit dtype
        dp = max(1, world // (tp * cp))  # ranks that take different rows
        accumulation = max(1, train.global_batch_size // max(1, train.micro_batch_size * dp))
        backend = config.optimizer.backend
        if backend == "default":
            backend = {"adamw8bit": "torchao", "adamw_schedulefree": "schedulefree"}.get(config.optimizer.kind, "torch")
        local_dir = bool(config.model.path) and _is_local(config.model.path)
        from ditty.plan.objective import objective_chunks, resolve_objective

        objective = resolve_objective(config, world)
        return cls(
            device=target.device,
            world_size=world,
            weight_dtype=weight_dtype,
            compute_dtype=compute,
            parallel=parallel.kind,
            shard_size=shard,
            gather_dtype=gather,
            quant=quant.kind,
            quant_storage=quant.storage_dtype,
            double_quant=quant.double_quant,
            upcast_unquantized=quant.kind != "none" and parallel.kind not in SHARDED,
            peft=peft.kind,
            lora_r=peft.r,
            lora_targets=peft.target_modules,
            lora_dropout=peft.dropout,
            modules_to_save=tuple(peft.modules_to_save),
            optimizer=config.optimizer.kind,
            optimizer_backend=backend,
            momentum=config.optimizer.momentum,
            micro_batch=train.micro_batch_size * objective.rows_per_sample,
            seq_len=config.data.max_seq_len,
            accumulation=accumulation,
            activation_checkpointing=train.activation_checkpointing,
            loss_chunks=objective_chunks(config, objective) or int(getattr(train, "loss_chunks", 0) or 0),
            packing=config.data.packing,
            packed_attention=_packed_attention(config, shape, target),
            reshard_after_forward=parallel.reshard_after_forward,
            cpu_offload=parallel.cpu_offload and parallel.kind in SHARDED,
            zero_stage=parallel.zero_stage,
            offload_optimizer=parallel.offload_optimizer and parallel.kind == "deepspeed",
            offload_params=parallel.offload_params and parallel.kind == "deepspeed",
            gradient_as_bucket_view=parallel.gradient_as_bucket_view,
            low_memory_load=(
                parallel.kind in SHARDED
                and world > 1
                and local_dir
                and config.model.resolved_init == "pretrained"
                and not config.model.factory
                and (
                    (quant.kind == "none" and peft.kind == "none")
                    or (quant.kind == "bnb-4bit" and peft.kind == "lora" and not config.fp8.enabled)
                )
            ),
            task=getattr(config.model, "task", "causal-lm"),
            objective=objective,
            tp=tp,
            cp=cp,
        )


def _weight_dtype(config: Any, shape: ModelShape, target: Target) -> str:
    """`model.dtype` as the model builder resolves it: "auto" is fp32 on the CPU, else the
    checkpoint's dtype (pretrained) or the config's (random init), fp32 when neither says."""
    dtype = config.model.dtype
    if dtype != "auto":
        return dtype
    if target.device == "cpu":
        return "float32"
    stated = shape.checkpoint_dtype
    return stated if stated in DTYPE_BYTES else "float32"


def _hsdp_shard(parallel: Any, world: int) -> int:
    if parallel.shard_size and parallel.shard_size > 0:
        return parallel.shard_size
    return max(1, world // max(1, parallel.replicate_size))


def _is_local(path: str) -> bool:
    import os

    return os.path.isdir(os.path.expanduser(path))


def _packed_attention(config: Any, shape: ModelShape, target: Target) -> str:
    """Settings.packed_attention: the path ditty.models.packing.packed_inputs will take."""
    if not config.data.packing:
        return ""
    model = config.model
    return planned_path(
        shape.model_type, model.attn_implementation, target.device, config.data.max_seq_len, model.packed_attention
    )
