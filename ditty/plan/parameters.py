"""Bytes of parameters, gradients and optimizer state on each rank, tensor by tensor.

The model's tensors (ditty/plan/architecture.py) become the tensors the trainer will hold: the
base weights in their storage dtype or bitsandbytes-packed, the LoRA/DoRA adapters peft adds
(fp32), the trainable copies of `peft.modules_to_save`; each split into the local shard a rank
keeps (FSDP2 chunks dim 0 like `torch.chunk`; DeepSpeed ZeRO-3 pads every tensor to the world
size). Optimizer state follows each implementation's own rules (which tensors torchao and
bitsandbytes keep in 8 bits). These counts are meant to be exact: tests compare them with the
bytes of a real run (`ditty.parallel.memory`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from ditty.optim.groups import ParamInfo, takes_muon
from ditty.plan.architecture import ModelShape, TensorSpec
from ditty.plan.mtp import is_head_tensor
from ditty.plan.settings import DTYPE_BYTES, SHARDED, Settings
from ditty.plan.tensor_parallel import tp_local

# bitsandbytes: 4-bit weights quantize in blocks of 64 values, the nested (double) quantization
# of their absmax in blocks of 256; the 4-bit code book has 16 fp32 entries, the nested one 256.
BNB_4BIT_BLOCK, BNB_NESTED_BLOCK = 64, 256
# Both 8-bit AdamW implementations keep tensors under 4096 elements in 32 bits, quantize the rest
# in blocks of 256 values with an fp32 scale each, and map codes through a 256-entry fp32 table.
EIGHT_BIT_MIN, EIGHT_BIT_BLOCK, QMAP = 4096, 256, 256 * 4


@dataclass(frozen=True)
class HeldTensor:
    """A tensor the trainer holds: its local size on a rank, storage, and whether it trains."""

    name: str
    numel: int
    """Logical elements (the full tensor)."""
    rows: int
    """Size of dim 0 as FSDP shards it (a packed 4-bit weight is flattened to (bytes, 1))."""
    storage_numel: int
    """Elements as stored (a packed 4-bit weight holds two values per byte)."""
    dtype: str
    trainable: bool
    group: str
    """The memory row it belongs to ("base weights", "4-bit weights", "LoRA adapters", ...)."""
    block: Optional[int]
    quant_state_bytes: int = 0
    matmul: bool = False
    """Used in a matrix product (linear layers, the head, a tied embedding, adapters)."""
    shape: tuple[int, ...] = ()
    role: str = "other"
    """The parameter's role for the optimizer's groups (ditty.optim.groups): linear, embedding, head, norm, bias."""

    @property
    def bytes(self) -> int:
        return self.storage_numel * DTYPE_BYTES[self.dtype]

    @property
    def param_info(self) -> ParamInfo:
        return ParamInfo(self.name, self.shape, self.role)

    @property
    def muon(self) -> bool:
        """Whether optimizer.kind = "muon" gives this tensor to Muon (else to AdamW)."""
        return takes_muon(self.param_info)


def held_tensors(shape: ModelShape, s: Settings) -> list[HeldTensor]:
    """Every parameter the trainer's model holds, in named_parameters order (adapters after their base)."""
    held: list[HeldTensor] = []
    full = s.peft == "none"
    base_dtype = s.weight_dtype
    for tensor in shape.tensors:
        if is_head_tensor(tensor.name):  # [mtp] heads: new weights, trained in full, never quantized
            dtype = "float32" if s.upcast_unquantized and base_dtype != "float32" else base_dtype
            held.append(
                HeldTensor(
                    tensor.name,
                    tensor.numel,
                    tensor.shape[0],
                    tensor.numel,
                    dtype,
                    True,
                    "MTP heads",
                    tensor.block,
                    0,
                    tensor.kind == "linear",
                    tensor.shape,
                    tensor.kind,
                )
            )
            continue
        quantized = s.quant != "none" and tensor.kind == "linear"
        adapted = not full and _is_target(tensor, s.lora_targets)
        if quantized:
            held.append(_quantized(tensor, s))
        else:
            dtype = "float32" if s.upcast_unquantized and base_dtype != "float32" else base_dtype
            label = "trainable weights" if full else "frozen weights"
            matmul = tensor.kind in ("linear", "head") or (tensor.kind == "embedding" and shape.tie_word_embeddings)
            held.append(
                HeldTensor(
                    tensor.name,
                    tensor.numel,
                    tensor.shape[0],
                    tensor.numel,
                    dtype,
                    full,
                    label,
                    tensor.block,
                    0,
                    matmul,
                    tensor.shape,
                    tensor.kind,
                )
            )
        if adapted and tensor.kind == "linear":
            out_features, in_features = tensor.shape
            r = s.lora_r
            for name, adapter_shape in (("lora_A", (r, in_features)), ("lora_B", (out_features, r))):
                size, rows = adapter_shape[0] * adapter_shape[1], adapter_shape[0]
                held.append(
                    HeldTensor(
                        f"{tensor.module}.{name}",
                        size,
                        rows,
                        size,
                        "float32",
                        True,
                        "LoRA adapters",
                        tensor.block,
                        0,
                        True,
                        adapter_shape,
                        "linear",
                    )
                )
            if s.peft == "dora":
                held.append(
                    HeldTensor(
                        f"{tensor.module}.magnitude",
                        out_features,
                        out_features,
                        out_features,
                        "float32",
                        True,
                        "LoRA adapters",
                        tensor.block,
                        shape=(out_features,),
                        role="norm",
                    )
                )
        if not full and _saved_module(tensor, s.modules_to_save):
            dtype = "float32" if s.upcast_unquantized and base_dtype != "float32" else base_dtype
            held.append(
                HeldTensor(
                    f"{tensor.name} (trained copy)",
                    tensor.numel,
                    tensor.shape[0],
                    tensor.numel,
                    dtype,
                    True,
                    "modules_to_save copies",
                    tensor.block,
                    0,
                    tensor.kind in ("linear", "head"),
                    tensor.shape,
                    tensor.kind,
                )
            )
    if not full and "lm_head" in s.modules_to_save and shape.tie_word_embeddings:
        # A tied head is not its own parameter, but peft's trainable copy of it is.
        embed = shape.tensors[0]
        held.append(
            HeldTensor(
                "lm_head.weight (trained copy)",
                embed.numel,
                embed.shape[0],
                embed.numel,
                base_dtype,
                True,
                "modules_to_save copies",
                None,
                0,
                True,
                embed.shape,
                "head",
            )
        )
    return held


def _quantized(tensor: TensorSpec, s: Settings) -> HeldTensor:
    n = tensor.numel
    if s.quant == "bnb-8bit":
        # LLM.int8: one int8 per value; the per-row fp32 scales live beside the weight.
        out_rows = tensor.shape[0]
        return HeldTensor(tensor.name, n, out_rows, n, "int8", False, "8-bit weights", tensor.block, 4 * out_rows, True)
    packed_bytes = (n + 1) // 2
    storage = s.quant_storage
    storage_numel = packed_bytes // DTYPE_BYTES[storage]
    return HeldTensor(
        tensor.name,
        n,
        storage_numel,
        storage_numel,
        storage,
        False,
        "4-bit weights",
        tensor.block,
        quant_state_bytes(n, s.double_quant),
        True,
    )


def quant_state_bytes(numel: int, double_quant: bool) -> int:
    """The bitsandbytes 4-bit quantization state of one weight: absmax per block of 64 (uint8 when
    double-quantized, with its own fp32 absmax per 256 blocks and a 256-entry code book, else
    fp32), the 16-entry fp32 code book, and the nested offset."""
    blocks = math.ceil(numel / BNB_4BIT_BLOCK)
    if double_quant:
        return blocks + 4 * math.ceil(blocks / BNB_NESTED_BLOCK) + 4 * 256 + 4 * 16 + 4
    return 4 * blocks + 4 * 16


def _is_target(tensor: TensorSpec, targets) -> bool:
    """peft's matching: "all-linear" (every linear but the output head), a list of module names
    (a module matches its own name or a ".name" suffix), or a regular expression (full match)."""
    if tensor.kind != "linear":
        return False
    module = tensor.module
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def _saved_module(tensor: TensorSpec, names: Iterable[str]) -> bool:
    module = tensor.module
    return any(module == n or module.endswith("." + n) for n in names)


# --- what one rank keeps ---------------------------------------------------------------------------


def local_rows(rows: int, shards: int, index: int) -> int:
    """Rows of dim 0 the `index`-th of `shards` keeps, as torch.chunk (FSDP2's sharding) splits them."""
    if shards <= 1:
        return rows
    chunk = math.ceil(rows / shards)
    return max(0, min(chunk, rows - index * chunk))


def local_numel(tensor: HeldTensor, s: Settings, rank: int) -> int:
    """Stored elements of `tensor` on `rank`: its tensor-parallel piece (ditty.plan.tensor_parallel),
    then FSDP2's chunk of that piece's rows."""
    if s.parallel in SHARDED:
        # hsdp: the shard dimension is the inner one of the mesh; with tp, "tp" is innermost and FSDP2
        # shards over the ("dp", "cp") ranks outside it
        index = (rank // s.tp) % s.shard_size
        per_row = tensor.storage_numel // max(tensor.rows, 1)
        rows, per_row = tp_local(tensor.name, tensor.rows, per_row, s.tp, rank % s.tp)
        return local_rows(rows, s.shard_size, index) * per_row
    if s.parallel == "deepspeed" and s.zero_stage == 3:
        return math.ceil(tensor.storage_numel / s.world_size)
    return tensor.storage_numel


@dataclass
class StateBytes:
    """Parameter, gradient and optimizer-state bytes one rank holds, by row label."""

    parameters: dict[str, int]
    quant_states: int
    gradients: int
    optimizer: int
    optimizer_label: str
    master_weights: int = 0

    @property
    def parameter_total(self) -> int:
        return sum(self.parameters.values())


def _alike(held: list[HeldTensor]) -> list[tuple[int, HeldTensor]]:
    """Tensors that differ only in name and block, counted: every layer of a model repeats the same
    shapes, so a 70B model's thousand tensors are a dozen kinds (planning 16 ranks stays fast)."""
    counts: dict[tuple, list] = {}
    for tensor in held:
        key = (tensor.numel, tensor.rows, tensor.storage_numel, tensor.dtype, tensor.trainable, tensor.group)
        key += (tensor.quant_state_bytes, tensor.shape, tensor.role, tensor.muon)
        entry = counts.setdefault(key, [0, tensor])
        entry[0] += 1
    return [(count, tensor) for count, tensor in counts.values()]


def rank_state(held: list[HeldTensor], s: Settings, rank: int) -> StateBytes:
    parameters: dict[str, int] = {}
    gradients = optimizer = quant_states = master = 0
    shared_tables = 0
    deepspeed = s.parallel == "deepspeed"
    for count, tensor in _alike(held):
        local = local_numel(tensor, s, rank)
        label = row_label(tensor, s)
        parameters[label] = parameters.get(label, 0) + count * local * DTYPE_BYTES[tensor.dtype]
        quant_states += count * tensor.quant_state_bytes
        if not tensor.trainable:
            continue
        if deepspeed:
            # ZeRO: 16-bit gradients for the whole model (stage 2) or the partition (stage 3), and
            # fp32 partitions of the gradients, master weights and optimizer state.
            part = math.ceil(tensor.numel / s.world_size)
            gradients += count * (local if s.zero_stage == 3 else tensor.numel) * DTYPE_BYTES[tensor.dtype]
            gradients += count * 4 * part if DTYPE_BYTES[tensor.dtype] != 4 else 0
            master += count * 4 * part if DTYPE_BYTES[tensor.dtype] != 4 else 0
            optimizer += count * _optimizer_bytes(part, "float32", s, tensor)
            continue
        gradients += count * local * DTYPE_BYTES[tensor.dtype]
        optimizer += count * _optimizer_bytes(local, tensor.dtype, s, tensor)
        if s.optimizer == "adamw8bit" and s.optimizer_backend == "bnb" and local >= EIGHT_BIT_MIN:
            shared_tables = 2 * QMAP  # one pair of code tables for the whole optimizer
    label = {
        "adamw": "AdamW: 2 moments in the parameter dtype + a step counter per tensor",
        "radam": "RAdam: 2 moments in the parameter dtype + a step counter per tensor",
        "adamw8bit": f"8-bit AdamW ({s.optimizer_backend}): 2 moments of 1 byte + block scales",
        "sgd": "SGD momentum buffer" if s.momentum else "SGD without momentum: no state",
        "muon": "Muon: 1 momentum buffer on the hidden matrices; AdamW (2 moments + step) on the rest",
        "adafactor": "Adafactor: factored second moments (a row and a column per matrix) + a step counter",
        "adamw_schedulefree": "schedule-free AdamW: z and the second moment in the parameter dtype",
    }[s.optimizer]
    return StateBytes(parameters, quant_states, gradients, optimizer + shared_tables, label, master)


def row_label(tensor: HeldTensor, s: Settings) -> str:
    if tensor.group == "4-bit weights":
        return f"4-bit weights (stored as {tensor.dtype})"
    return f"{tensor.group} ({tensor.dtype})"


def _optimizer_bytes(n: int, dtype: str, s: Settings, tensor: HeldTensor) -> int:
    """Optimizer state of one (local) tensor of `n` elements."""
    size = DTYPE_BYTES[dtype]
    if s.optimizer == "muon":
        # torch.optim.Muon: a momentum buffer like the gradient; AdamW (fused): 2 moments and an fp32 step.
        return n * size if tensor.muon else 2 * n * size + 4
    if s.optimizer == "adamw_schedulefree":
        return 2 * n * size  # z and exp_avg_sq, made for every parameter when the optimizer is built
    if s.optimizer == "adafactor":
        # torch.optim.Adafactor: an fp32 step; a matrix keeps its row means (shape[:-1] + [1]) and
        # column means (shape with dim -2 = 1), a vector its full second moment.
        shape = tensor.shape
        if len(shape) < 2:
            return n * size + 4
        rows, cols = math.prod(shape[:-1]), math.prod(shape[:-2]) * shape[-1]
        return (rows + cols) * size + 4
    if n == 0:
        adam = s.optimizer in ("adamw", "radam") or (s.optimizer == "adamw8bit" and s.optimizer_backend == "torchao")
        return 4 if adam else 0
    if s.optimizer == "sgd":
        return n * size if s.momentum else 0
    if s.optimizer in ("adamw", "radam"):
        return 2 * n * size + 4  # exp_avg, exp_avg_sq, and the fp32 scalar `step`
    if s.optimizer_backend == "torchao":
        # torchao quantizes a tensor whose (local) size is >= 4096 and divisible by the block.
        if n >= EIGHT_BIT_MIN and n % EIGHT_BIT_BLOCK == 0:
            return 2 * (n + 4 * (n // EIGHT_BIT_BLOCK) + QMAP) + 4
        return 2 * n * size + 4
    # bitsandbytes: state1/state2 in uint8 with fp32 absmax per block (32-bit below 4096 values).
    if n >= EIGHT_BIT_MIN:
        return 2 * (n + 4 * math.ceil(n / EIGHT_BIT_BLOCK))
    return 2 * n * 4
