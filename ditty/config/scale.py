"""The recipe sections for what trains and how it spreads over devices: adapters (`[peft]`),
quantized bases (`[quant]`), data, tensor and context parallelism (`[parallel]`) and FP8 (`[fp8]`).

Like every section (see ditty/config/sections.py), each field's attribute docstring is its help text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union


@dataclass(frozen=True)
class PeftConfig:
    kind: Literal["none", "lora", "dora"] = "none"
    """Parameter-efficient finetuning method."""
    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """Adapter scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: Union[str, list[str]] = "all-linear"
    """Module names to adapt, or "all-linear"."""
    modules_to_save: list[str] = field(default_factory=list)
    """Modules trained fully next to the adapter, e.g. ["embed_tokens", "lm_head"]."""


@dataclass(frozen=True)
class QuantConfig:
    kind: Literal["none", "bnb-4bit", "bnb-8bit"] = "none"
    """Load the base weights quantized with bitsandbytes (needs an adapter: QLoRA)."""
    quant_type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type."""
    double_quant: bool = True
    """Quantize the 4-bit quantization constants too."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the 4-bit layers compute in."""
    storage_dtype: Literal["uint8", "float32", "bfloat16", "float16"] = "uint8"
    """Dtype the packed 4-bit weights are stored as; under FSDP it must equal the parameter dtype."""


SHARDED_KINDS = ("fsdp", "hsdp")
"""The parallel kinds that shard parameters with FSDP2 (one per-block wrapping, DTensor parameters)."""


@dataclass(frozen=True)
class ParallelConfig:
    kind: Literal["none", "ddp", "fsdp", "hsdp", "deepspeed"] = "none"
    """Data parallelism: none, DDP, FSDP2, HSDP (replicate x shard) or DeepSpeed ZeRO."""
    tp: int = 1
    """Tensor-parallel degree: each block's linear layers split over this many ranks, with sequence
    parallel for the norms and the loss on vocabulary-sharded logits (needs kind "fsdp"). The
    data-parallel degree is what is left: world size / (tp x cp)."""
    cp: int = 1
    """Context-parallel degree: each row's tokens split over this many ranks (Ulysses: an all-to-all
    over attention heads around attention; packed documents stay apart). Needs kind "fsdp"."""
    replicate_size: int = 1
    """hsdp: size of the replicate dimension of the mesh."""
    shard_size: int = -1
    """hsdp: size of the shard dimension (-1: world size / replicate_size)."""
    param_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    """fsdp/hsdp mixed precision: dtype of gathered parameters (default: from train.precision)."""
    reduce_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    """fsdp/hsdp mixed precision: dtype of gradient reduction (default: float32)."""
    output_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    """fsdp/hsdp mixed precision: dtype of module outputs."""
    cast_forward_inputs: bool = True
    """fsdp/hsdp: cast floating forward inputs to the parameter dtype."""
    reshard_after_forward: Union[bool, int] = True
    """fsdp/hsdp: free gathered parameters after forward (or reshard to a group of this size)."""
    cpu_offload: bool = False
    """fsdp/hsdp: keep sharded parameters on the CPU."""
    pin_memory: bool = True
    """fsdp/hsdp with cpu_offload: pin the offloaded memory."""
    sync_grad_accum: bool = False
    """fsdp/hsdp: reduce gradients on every micro-batch instead of only the last one."""
    block_classes: list[str] = field(default_factory=list)
    """fsdp/hsdp: class names of blocks to shard (default: the model's _no_split_modules)."""
    find_unused_parameters: bool = False
    """ddp: search for parameters that got no gradient."""
    gradient_as_bucket_view: bool = True
    """ddp: gradients as views into the communication buckets (saves memory)."""
    static_graph: bool = False
    """ddp: the graph is the same every step."""
    zero_stage: Literal[2, 3] = 2
    """deepspeed: ZeRO stage."""
    offload_optimizer: bool = False
    """deepspeed: keep optimizer state on the CPU."""
    offload_params: bool = False
    """deepspeed (stage 3): keep parameters on the CPU."""


@dataclass(frozen=True)
class Fp8Config:
    enabled: bool = False
    """Train linear layers in FP8."""
    backend: Literal["torchao", "te"] = "torchao"
    """torchao float8 training, or NVIDIA Transformer Engine."""
    emulate: bool = False
    """torchao: emulate FP8 so it runs without FP8 hardware (for tests, on CPU)."""
