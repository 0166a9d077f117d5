"""Bytes kept for the backward pass: activations per micro-batch, and the logits and loss.

The model is the list of tensors autograd saves in a Hugging Face Llama-style decoder layer under
SDPA attention, as `torch.autograd.graph.saved_tensors_hooks` shows them (tests/plan compare this
model with the saved tensors of real layers, full finetune and LoRA, fp32 and bf16 autocast):

- each RMSNorm saves its input upcast to fp32, the fp32 reciprocal RMS per token, and (when its
  weight trains) the normalised input;
- a linear layer keeps its input for its weight gradient: once, shared by the layers that read
  the same tensor, or as its own copy when autocast casts fp32 inputs to 16 bits, and always for a
  LoRA-adapted layer under autocast (peft casts the input to the adapter's fp32 and autocast casts
  it back) or with adapter dropout; a frozen, unadapted layer keeps nothing;
- attention (SDPA flash or memory-efficient kernels) keeps q, k, v, its output and a fp32
  log-sum-exp per head; with a mask (padding, or packing on the dense block mask) k and v are kept
  expanded to all heads and the mask is copied per layer; packed rows of the mask-free model types
  (ditty.models.packing) keep what an unmasked row keeps, and under the per-sample SDPA also the
  output gathered back into row order and its int64 index;
- the SwiGLU MLP keeps the gate and up projections and the activation's output.

Activation checkpointing "full" keeps each block's input and recomputes one block at a time in
the backward; "selective" keeps, per block, the outputs of the matrix products and attention
(ditty.parallel.speed's policy) and recomputes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ditty.plan.architecture import ModelShape
from ditty.plan.parameters import HeldTensor
from ditty.plan.settings import DTYPE_BYTES, SHARDED, Settings

FP32 = 4


@dataclass(frozen=True)
class Activations:
    """What autograd keeps for one micro-batch, tensor by tensor: each entry is the bytes per token of
    one [tokens, width] tensor (so a tensor's size is `tokens` times its entry)."""

    kept_per_block: tuple[int, ...]
    """The tensors one block keeps until the backward under the recipe's checkpointing."""
    once: tuple[int, ...]
    """The tensors kept once per micro-batch: outside the blocks (inputs, the final norm, the head's
    input) and, under checkpointing, the one block recomputed in the backward."""
    tokens: int
    layers: int
    weight_copies: int
    """Per step: 16-bit copies of fp32 weights that autocast casts and saves (not per token)."""
    detail: str

    @property
    def total(self) -> int:
        """Bytes held at the start of the backward."""
        return self.in_tensors_below(None)

    def in_tensors_below(self, nbytes: int | None) -> int:
        """Bytes held in tensors smaller than `nbytes` (None: every tensor). A host allocator serves
        smaller tensors from its heap and maps larger ones. The weight copies count in full (an
        upper bound: a copy above `nbytes` is mapped too)."""

        def held(sizes: tuple[int, ...]) -> int:
            return sum(x for x in sizes if nbytes is None or self.tokens * x < nbytes)

        return self.tokens * (self.layers * held(self.kept_per_block) + held(self.once)) + self.weight_copies


def plan_activations(shape: ModelShape, s: Settings, held: list[HeldTensor], ac: str | None = None) -> Activations:
    """Activations of one micro-batch of `s.tokens` tokens, under checkpointing `ac` (the recipe's by default)."""
    ac = ac or s.activation_checkpointing
    a = s.activation_bytes
    w = _norm_bytes(s, held)
    h, i, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    # Tensor parallel with sequence parallel (ditty.parallel.tensor): norms and the residual stream hold
    # 1/tp of the tokens, attention and the MLP 1/tp of the heads and width; the inputs the q/k/v,
    # gate/up and head projections keep are the gathered sequence, whole.
    t = s.tp

    def split(x: int) -> int:
        return -(-x // t)

    # A mask reaches attention with padding (micro-batches of several rows) or packed rows on the
    # dense block mask; packed rows of a mask-free type attend within each sample (no mask), and
    # packed rows carry no padding.
    masked = s.packed_attention == "dense" if s.packing else s.micro_batch > 1
    kv_saved = q if masked else kv
    adapted = _adapted_modules(held)
    trains_base = s.peft == "none"
    norm_trains = trains_base

    def norm() -> list[int]:
        # fp32 input, fp32 reciprocal RMS per token, and the normalised input for the weight's gradient
        return [split(FP32 * h), split(FP32)] + ([split(w * h)] if norm_trains else [])

    def group(x_bytes: int, dim: int, consumers: list[str], already_saved: bool = False) -> list[int]:
        """Inputs the linear layers reading one tensor keep (see the module docstring)."""
        tensors, shared = [], False
        for name in consumers:
            is_adapted = name in adapted
            if not (trains_base or is_adapted):
                continue
            if s.autocast and (x_bytes != a or is_adapted):
                tensors.append(a * dim)  # its own 16-bit copy
            elif is_adapted and (x_bytes != FP32 or s.lora_dropout > 0):
                tensors.append(FP32 * dim)  # peft's fp32 copy (or dropout's output)
            else:
                shared = True
            if is_adapted and s.lora_dropout > 0:
                tensors.append(dim)  # dropout's mask, one byte per element
        if shared and not already_saved:
            tensors.append(x_bytes * dim)
        return tensors

    lora_out = [(a if s.autocast else FP32) * s.lora_r for m in _block_linears() if m in adapted]
    # q, k, v, the output and the log-sum-exp per head; a mask is [B, 1, T, T] (T bytes x a per token)
    attention = [split(a * q), split(a * kv_saved), split(a * kv_saved), split(FP32 * shape.num_heads), split(a * q)]
    attention += [a * s.seq_len] if masked else []
    if s.packed_attention == "per-sample":
        # samples of several lengths: the output is gathered back into row order (o_proj's input is
        # its own copy) through an int64 index per token. Counted always (rows of one sample length
        # skip the gather): an upper bound.
        attention += [split(a * q), 8]
    # bitsandbytes' 4-bit layers return their input's dtype, not autocast's: with an fp32 residual
    # stream (a one-process QLoRA upcasts the norms) the MLP's gate, activation and up stay fp32.
    m = w if s.quant == "bnb-4bit" else a
    mlp = [split(m * i)] * 3
    block = (
        norm()
        + norm()
        + group(w, h, ["q_proj", "k_proj", "v_proj"])
        + group(a, split(q), ["o_proj"], already_saved=True)
        + group(w, h, ["gate_proj", "up_proj"])
        + group(m, split(i), ["down_proj"])
        + attention
        + mlp
        + lora_out
    )
    if not shape.llama_block:
        block = _generic_block(shape, a)
    head_trains = trains_base or "lm_head" in s.modules_to_save
    # ids, labels, mask, positions (int64); the final norm
    outside = [8] * 4 + [split(FP32 * h), split(FP32)] + ([split(w * h)] if norm_trains else [])
    if head_trains:
        outside.append(a * h if (s.autocast and w != a) else w * h)
    weight_copies = _autocast_weight_copies(s, held) if ac == "none" else 0
    resid = [split(w * h)]  # the block input a checkpoint keeps
    if ac == "full":
        kept = resid
        detail = f"{shape.num_layers} block inputs + 1 block recomputed in the backward"
    elif ac == "selective":
        kept = (
            resid
            + [split(x) for x in _matmul_outputs(shape, s, adapted)]
            + [split(a * q), split(FP32 * shape.num_heads)]
        )
        detail = f"{shape.num_layers} blocks' matrix-product outputs + 1 block recomputed"
    else:
        kept = block
        detail = f"{shape.num_layers} blocks"
    recompute = block if ac in ("full", "selective") else []
    return Activations(tuple(kept), tuple(recompute + outside), s.tokens, shape.num_layers, int(weight_copies), detail)


def _norm_bytes(s: Settings, held: list[HeldTensor]) -> int:
    """Bytes of the residual stream and the norms' outputs: the dtype the norm weights compute in."""
    if s.parallel in SHARDED and s.compute_dtype:
        return DTYPE_BYTES[s.gather_dtype]
    norms = [t for t in held if t.name.endswith("layernorm.weight")]
    return DTYPE_BYTES[norms[0].dtype] if norms else DTYPE_BYTES[s.weight_dtype]


def _block_linears() -> list[str]:
    return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapted_modules(held: list[HeldTensor]) -> set[str]:
    """Short names of the block linears that carry an adapter (from the first block)."""
    names = set()
    for tensor in held:
        if tensor.group == "LoRA adapters" and tensor.block == 0:
            names.add(tensor.name.rsplit(".", 1)[0].rsplit(".", 1)[-1])
    return names


def _matmul_outputs(shape: ModelShape, s: Settings, adapted: set[str]) -> list[int]:
    a, h, i, q, kv = s.activation_bytes, shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    outputs = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": h, "gate_proj": i, "up_proj": i, "down_proj": h}
    tensors = [a * width for width in outputs.values()]
    for name in adapted:
        tensors += [a * s.lora_r, a * outputs[name]]  # lora_A's and lora_B's outputs
    return tensors


def _autocast_weight_copies(s: Settings, held: list[HeldTensor]) -> int:
    """fp32 weights of matrix products under 16-bit autocast, trainable or frozen: each is cast once
    per forward and the copy is saved for the backward (the input gradient needs it too). FSDP
    mixed precision gathers them in 16 bits instead, so nothing is cast there."""
    if not s.autocast or (s.parallel in SHARDED and DTYPE_BYTES[s.gather_dtype] == 2):
        return 0
    return sum(t.numel * DTYPE_BYTES[s.compute_dtype] for t in held if t.matmul and t.dtype == "float32")


def _generic_block(shape: ModelShape, a: int) -> list[int]:
    """A rough figure for architectures the model does not cover: a Llama-like block of the same sizes."""
    h, i = shape.hidden_size, shape.intermediate_size
    return [FP32 * h] * 4 + [a * h] * 8 + [a * i] * 4


# --- logits and loss ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossMemory:
    bytes: int
    detail: str
    tensor_bytes: int
    """The size of its largest tensor (fp32 logits or their gradient, of the whole micro-batch or of
    a chunk): a host allocator maps tensors above its threshold rather than keep them in its heap."""


CLASSIFIER_TASKS = ("seq-classification", "token-classification", "reward-model")
CLASSIFIER_LABELS = 128
"""Labels assumed for a classifier's logits in the plan: more than most label sets, still negligible."""


def plan_loss(shape: ModelShape, s: Settings, chunks: int | None = None, head_trains: bool = False) -> LossMemory:
    """Peak bytes of the output projection and the cross-entropy for one micro-batch.

    Full logits (`chunks` 0), the larger of two moments (ditty.loss): the forward holds the logits,
    the shifted copy the loss takes (micro-batches > 1), their fp32 upcast (16-bit logits) and the
    fp32 log-softmax the cross-entropy keeps; the backward holds the logits, that log-softmax, the
    dense fp32 gradient the negative log-likelihood hands it, and the fp32 gradient it returns.
    Chunked (`train.loss_chunks` > 0, ditty.fused_loss): one chunk's logits in fp32 (and in 16
    bits), the gradient of the hidden states, and an fp32 gradient of the head when it trains.
    """
    chunks = s.loss_chunks if chunks is None else chunks
    a = s.activation_bytes
    tokens, vocab = s.tokens, -(-shape.vocab_size // s.tp)  # tensor parallel: each rank's vocabulary shard
    if s.task in CLASSIFIER_TASKS:
        # No vocabulary head: a score per label, per sample (or per token when tagging). The label count
        # is the data's, unknown offline; CLASSIFIER_LABELS bounds it for the plan.
        rows = tokens if s.task == "token-classification" else s.micro_batch
        size = rows * CLASSIFIER_LABELS * 4 * FP32
        return LossMemory(size, f"{rows:,} rows of label scores (no vocabulary head)", size)
    if chunks <= 0:
        shifted = a if s.micro_batch > 1 else 0
        forward = a + shifted + (FP32 if a != FP32 else 0) + FP32
        backward = a + 3 * FP32
        per = max(forward, backward)
        detail = f"{tokens:,} tokens x {vocab:,} vocabulary x {per} bytes"
        return LossMemory(tokens * vocab * per, detail, tokens * vocab * FP32)
    chunk = -(-tokens // chunks)
    per = FP32 + (2 * a if a != FP32 else 0)
    total = (
        chunk * vocab * per + tokens * shape.hidden_size * a + (vocab * shape.hidden_size * FP32 if head_trains else 0)
    )
    return LossMemory(total, f"{chunks} chunks of {chunk:,} tokens x {vocab:,} vocabulary", chunk * vocab * FP32)
