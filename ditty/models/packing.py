"""Packed rows without a T x T tensor: which attention path keeps packed samples apart, per kernel.

A packed batch (ditty/data/collate.py) carries position ids that restart per sample and the
cumulative sample lengths over the flattened rows, `cu_seq_lens_q/k` with `max_length_q/k`
(transformers' names, as its DataCollatorWithFlattening writes them). `packed_inputs` turns that
into the forward's arguments for the model's attention kernel:

- flash_attention_2/3 (CUDA): the cumulative lengths go to the varlen kernel as they are; so do they
  to ditty's context-parallel attention (ULYSSES, ditty.models.ulysses), over the whole rows.
- flex_attention: position ids and no mask; transformers derives a block-sparse BlockMask from
  where the positions restart (O((T/128)^2) blocks, not T^2 elements).
- "auto" on CUDA, for the model types in MASK_FREE_MODEL_TYPES: the model is built with
  flex_attention (`packed_kernel`), as above.
- sdpa or eager, for the model types in MASK_FREE_MODEL_TYPES, rows up to DENSE_MASK_MAX_WIDTH
  (`model.packed_attention = "auto"`, or "dense"): the dense block mask below, which is faster than a
  loop of SDPA calls where T x T is small (`isolation_path`).
- sdpa or eager, for the model types in MASK_FREE_MODEL_TYPES, wider rows (or "per-sample"): the
  model is switched once to PACKED_SDPA, an attention function registered with transformers'
  AttentionInterface that runs causal SDPA within each sample (samples of equal length batched into
  one call). Its memory grows with the row length, not its square; without cumulative lengths
  (evaluation, generation) it is transformers' own sdpa, with sdpa's masks.
- sdpa or eager for the other types in PACKED_MASK_MODEL_TYPES (their attention has something
  SDPA cannot do, e.g. gemma2's logit softcapping): the [B, 1, T, T] block-diagonal additive mask,
  built here from the cumulative lengths, as before.

How the tables were verified (transformers 5.23, torch 2.13 CPU): for each model type a 2-layer,
64-wide random model ran one row of three packed samples (lengths 5, 7, 4) and its logits matched
the samples run one by one to within 6e-7, with the dense mask under both "sdpa" and "eager" and,
for MASK_FREE_MODEL_TYPES, through PACKED_SDPA (within 5e-7). Position ids with an all-ones 2D mask
leaked (logits off by 0.2-0.8), and bloom (ALiBi) rejected the 4D mask outright.
tests/models/test_packing.py repeats the checks for every entry, so a transformers upgrade that
breaks one shows up as a failing test rather than as silently contaminated training.

Importing this module is cheap (no torch): the recipe compiler reads the tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ditty.models.ulysses import ULYSSES
from ditty.stages.verified import VERIFIED_MODEL_TYPES

if TYPE_CHECKING:
    import torch

# The same model types as the chunked loss's (ditty/stages/fused_loss): one table, each use tested on its own.
PACKED_MASK_MODEL_TYPES = VERIFIED_MODEL_TYPES
"""Model types whose packed samples stay isolated with the dense block-diagonal mask."""

MASK_FREE_MODEL_TYPES = PACKED_MASK_MODEL_TYPES - {"falcon", "gemma2", "stablelm"}
"""Model types isolated without any T x T tensor (PACKED_SDPA on sdpa/eager, varlen flash kernels,
flex attention). Left out, they keep the dense mask: gemma2 softcaps its attention logits (SDPA
cannot); falcon's attention does not go through transformers' AttentionInterface; stablelm's
decoder layer does not hand the cumulative lengths on to its attention (packed logits off by 0.44)."""

PACKED_SDPA = "ditty_packed_sdpa"
"""The attention implementation name registered by `register_packed_attention`."""
VARLEN_KERNELS = ("flash_attention_2", "flash_attention_3", PACKED_SDPA, ULYSSES)
"""Kernels handed the cumulative sample lengths (ULYSSES: context parallel, ditty.models.ulysses)."""
MASK_TAKING_ATTENTION = (None, "sdpa", "eager")
"""Kernels that take the dense 4D mask as is (None: transformers' default, sdpa)."""
PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
BLOCKED = -3.4028234663852886e38  # finfo(float32).min: see dense_block_mask


def supports_packed_attention(model_or_config: Any, *, max_seq_len: Optional[int] = None) -> bool:
    """Whether packed rows stay isolated for this model and attention kernel.

    Takes a model (anything with `.config`, PEFT wrappers included), a transformers config, or a
    `model_type` string (what the recipe compiler knows without building anything). With a config,
    the kernel is checked too (flash and flex kernels need a MASK_FREE type), and a sliding window
    shorter than `max_seq_len` makes the answer False: the per-sample (and dense-mask) attention
    replaces the model's own sliding-window mask (measured on mistral with sliding_window = 3:
    packed logits off by 0.3), so longer rows would attend further back than the model was built for.
    """
    if isinstance(model_or_config, str):
        return model_or_config in PACKED_MASK_MODEL_TYPES
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKED_MASK_MODEL_TYPES:
        return False
    kernel = getattr(config, "_attn_implementation", None)
    if kernel not in MASK_TAKING_ATTENTION and not (
        model_type in MASK_FREE_MODEL_TYPES and (kernel in VARLEN_KERNELS or kernel == "flex_attention")
    ):
        return False
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:  # qwen2 keeps a window it does not use
        window = None
    return not (window and max_seq_len and max_seq_len > window)


def packed_kernel(model_type: Optional[str], attn_implementation: str, device_type: str) -> Optional[str]:
    """The kernel a packed run builds its model with when the recipe leaves `model.attn_implementation`
    at "auto"; None keeps transformers' default (sdpa: the dense mask or PACKED_SDPA, see isolation_path).

    On CUDA a MASK_FREE type gets flex_attention: its block-sparse mask costs one kernel per layer,
    where PACKED_SDPA's loop over sample lengths costs several small launches per distinct length
    (measured on an H100 with a ~1B Llama and instruction-length samples: 30,181 vs 3,286 tokens/s,
    BENCHMARKS.md). On the CPU sdpa is the fast path (no compile, no block-mask overhead).
    """
    if attn_implementation != "auto" or device_type != "cuda" or model_type not in MASK_FREE_MODEL_TYPES:
        return None
    return "flex_attention"


PACKED_ATTENTION = ("auto", "dense", "per-sample")
"""`model.packed_attention`: how sdpa/eager models isolate packed samples ("auto": by row width)."""
DENSE_MASK_MAX_WIDTH = {"cpu": 256}
"""Widest packed row (tokens) for which "auto" builds the dense block mask instead of attending sample
by sample, per device type. On the CPU (one thread, the 3.4M-parameter Llama of tools/bench.py,
forward + backward) the dense mask took 0.83-0.99x the per-sample path's time at 128 and 256 tokens
per row, 0.98-1.08x at 512 (a tie: the per-sample path keeps no [T, T] tensor) and more from 1,024,
for rows of 1, 4 and 16 samples (`python tools/bench_packed.py crossover`, BENCHMARKS.md). Not
measured on CUDA, where "auto" takes flex_attention; an explicit sdpa/eager there stays per-sample."""
CHOICE_ATTRIBUTE = "_ditty_packed_attention"
"""Set by the trainer on the built model (a Python attribute, so the saved config never records it)."""


def isolation_path(
    model_type: Optional[str], kernel: Optional[str], device_type: str, width: int, choice: str = "auto"
) -> str:
    """How packed rows of `width` tokens reach attention: "dense" (the [B, 1, T, T] block mask), "kernel"
    (flash varlen or flex attention take the samples themselves) or "per-sample" (PACKED_SDPA).

    The one rule for the runtime (packed_inputs, with the batch's width) and the planner (planned_path,
    with data.max_seq_len): model types outside MASK_FREE_MODEL_TYPES need the mask; the flash and flex
    kernels isolate by themselves; otherwise `choice`, where "auto" takes the dense mask for rows up to
    DENSE_MASK_MAX_WIDTH (a T x T mask costs less than a loop of SDPA calls there) and the per-sample
    path for wider rows (the mask grows with T^2: 1 GiB per row at 16,384)."""
    if model_type not in MASK_FREE_MODEL_TYPES:
        return "dense"
    if kernel in ("flash_attention_2", "flash_attention_3", "flex_attention", ULYSSES):
        return "kernel"
    if choice != "auto":
        return choice
    return "dense" if width <= DENSE_MASK_MAX_WIDTH.get(device_type, 0) else "per-sample"


def planned_path(
    model_type: Optional[str], attn_implementation: str, device_type: str, seq_len: int, choice: str = "auto"
) -> str:
    """From the recipe alone (the memory planner's question, and `ditty check`'s), how `packed_inputs`
    will treat packed rows of `seq_len` tokens (see isolation_path)."""
    kernel = packed_kernel(model_type, attn_implementation, device_type) or attn_implementation
    return isolation_path(model_type, kernel, device_type, seq_len, choice)


PATH_DESCRIPTIONS = {
    "dense": "a block-diagonal [T, T] mask",
    "per-sample": "causal SDPA sample by sample (no [T, T] mask)",
    "kernel": "the kernel's own varlen/block-sparse masking (no [T, T] mask)",
}


def packed_inputs(model: "torch.nn.Module", batch: dict, choice: Optional[str] = None) -> dict:
    """The forward's keyword arguments for a packed batch (see the module docstring), for a model
    that may be wrapped (DDP, compile, PEFT). `choice` (one of PACKED_ATTENTION) overrides the one the
    trainer set on the model (CHOICE_ATTRIBUTE; "auto" when none). On the per-sample path, a model on
    sdpa/eager is switched to PACKED_SDPA here, once (the saved config does not record the switch)."""
    import torch

    base = _hf_model(model)
    config = base.config
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKED_MASK_MODEL_TYPES:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            f"{model_type or type(base).__name__} models cannot isolate packed samples",
            key="data.packing",
            fix="set data.packing = false (data.group_by_length = true cuts padding instead)",
        )
    ids = batch["input_ids"]
    kernel = config._attn_implementation
    choice = choice or getattr(base, CHOICE_ATTRIBUTE, "auto")
    path = isolation_path(model_type, kernel, ids.device.type, ids.shape[1], choice)
    if path == "per-sample" and kernel != PACKED_SDPA:
        if kernel not in MASK_TAKING_ATTENTION:  # a kernel ditty cannot switch: only the mask is safe
            path = "dense"
        else:
            register_packed_attention()
            base.set_attn_implementation(PACKED_SDPA)
            if config._attn_implementation != PACKED_SDPA:  # the model refused the switch
                path = "dense"
    kwargs = {"input_ids": ids, "position_ids": batch["position_ids"]}
    if path == "dense":
        kwargs["attention_mask"] = dense_block_mask(batch["cu_seq_lens_q"], *ids.shape).to(ids.device)
    elif config._attn_implementation in VARLEN_KERNELS:
        kwargs.update({key: batch[key] for key in PACKED_KEYS})
        if config._attn_implementation in (PACKED_SDPA, ULYSSES):
            # An all-ones 2D mask stops transformers from building its own [B, 1, T, T] packed mask
            # from the position ids; sdpa's mask function then returns None (plain causal).
            kwargs["attention_mask"] = torch.ones_like(ids)
    return kwargs  # flex: no mask, transformers finds the samples from the position ids


def _hf_model(model: "torch.nn.Module") -> Any:
    """The transformers PreTrainedModel inside DDP/compile/PEFT wrappers."""
    import torch

    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def dense_block_mask(cu_seq_lens: "torch.Tensor", rows: int, width: int) -> "torch.Tensor":
    """[rows, 1, width, width] additive float mask of the samples delimited by `cu_seq_lens` (over
    the flattened rows): a query sees keys of its own sample at or before it.

    The blocked value is finfo(float32).min, not -inf: it may round to -inf when cast to bf16/fp16,
    and a row blocked entirely would make softmax NaN (every position, padding included, belongs to
    a segment and sees at least itself). Cost: rows x width^2 x 4 bytes (1 GiB per row at 16,384).
    """
    import torch

    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).long().cpu()
    segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths).view(rows, width)
    allowed = (segment[:, :, None] == segment[:, None, :]).tril_()  # same sample, and causal
    return torch.where(allowed, 0.0, BLOCKED)[:, None, :, :]


# ---------------------------------------------------------------------------------- PACKED_SDPA


def register_packed_attention() -> None:
    """Register PACKED_SDPA with transformers (idempotent): the per-sample attention function, and
    sdpa's own mask function for the calls that carry a padding mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if PACKED_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
        AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def packed_sdpa_forward(
    module: "torch.nn.Module",
    query: "torch.Tensor",
    key: "torch.Tensor",
    value: "torch.Tensor",
    attention_mask: "Optional[torch.Tensor]",
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    **kwargs: Any,
) -> "tuple[torch.Tensor, None]":
    """transformers' attention signature (query [B, H, T, D], key/value [B, H_kv, T, D]; returns
    [B, T, H, D]). With `cu_seq_lens_q` and no mask: causal attention within each sample; else sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None or attention_mask is not None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    for unsupported in ("softcap", "s_aux", "sinks"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"{PACKED_SDPA}: {unsupported} is not supported (use the dense packed mask)")
    window = kwargs.get("sliding_window")
    if window and int(kwargs.get("max_length_q") or 0) > window:
        raise NotImplementedError(f"{PACKED_SDPA}: a sample longer than the sliding window ({window})")
    return per_sample_attention(query, key, value, cu_seq_lens, scaling=scaling, dropout=dropout), None


_GROUPS: dict = {"cu": None, "groups": None}  # the last batch's grouping: every layer reuses it


def per_sample_attention(
    query: "torch.Tensor",
    key: "torch.Tensor",
    value: "torch.Tensor",
    cu_seq_lens: "torch.Tensor",
    *,
    scaling: Optional[float] = None,
    dropout: float = 0.0,
) -> "torch.Tensor":
    """Causal SDPA within each sample of the flattened rows; [B, T, H, D] out.

    Samples of the same length are gathered into one batched call (a row of 64 samples of 256 is one
    SDPA call of batch 64), so the work is that of the samples run alone and the memory is a few
    copies of q, k and v. Cost: one host read of the lengths per batch (cached across layers).
    """
    import torch
    import torch.nn.functional as F

    rows, heads, width, dim = query.shape
    kv_heads, value_dim = key.shape[1], value.shape[-1]
    q = query.transpose(1, 2).reshape(rows * width, heads, dim)
    k = key.transpose(1, 2).reshape(rows * width, kv_heads, dim)
    v = value.transpose(1, 2).reshape(rows * width, kv_heads, value_dim)
    outputs, order = [], []
    for length, positions in _length_groups(cu_seq_lens, query.device):
        count = positions.numel() // length
        grouped = [x.index_select(0, positions).view(count, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(
            *grouped, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=kv_heads != heads
        )
        outputs.append(out.transpose(1, 2).reshape(count * length, heads, value_dim))
        order.append(positions)
    flat = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if len(order) > 1:  # back from grouped order to row order
        inverse = torch.empty_like(torch.cat(order))
        inverse[torch.cat(order)] = torch.arange(inverse.numel(), device=inverse.device)
        flat = flat.index_select(0, inverse)
    return flat.view(rows, width, heads, value_dim)


def _length_groups(cu_seq_lens: "torch.Tensor", device: "torch.device") -> list:
    """[(length, flat positions of every sample of that length)], cached for the same tensor."""
    import torch

    if _GROUPS["cu"] is cu_seq_lens:
        return _GROUPS["groups"]
    bounds = cu_seq_lens.tolist()
    starts: dict[int, list[int]] = {}
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            starts.setdefault(end - start, []).append(start)
    groups = [
        (length, (torch.tensor(first)[:, None] + torch.arange(length)).reshape(-1).to(device))
        for length, first in sorted(starts.items())
    ]
    _GROUPS.update(cu=cu_seq_lens, groups=groups)
    return groups
