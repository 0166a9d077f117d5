"""Ulysses context parallel: attention over whole rows while each rank holds a slice of every row.

Under `parallel.cp = N` each of N ranks holds 1/N of every row's tokens (ditty.data.context_shard cuts
the batch). Everything but attention is per token, so it runs on the slice as is; attention needs the
whole row. Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023) trades the split: an all-to-all before
attention gives each rank all the row's tokens for 1/N of the heads, attention runs as usual
(causal SDPA, or ditty's per-sample SDPA for packed rows, whose sample boundaries are given over
the whole row, so packed documents stay apart), and a second all-to-all gives the heads back for
the rank's own tokens. Activations outside attention shrink N times; attention's own q, k, v and
output are each the size of the local tokens' (heads / N x whole row).

Why written here: torch's context parallel (torch.distributed.tensor.experimental.context_parallel)
is ring attention that intercepts only the CUDA SDPA kernels (flash, efficient, cudnn); it does not
run on the CPU or with a custom mask. The collective itself is torch's differentiable
`all_to_all_single` (functional collectives; gloo and nccl both implement it); what is written here is
the layout around it.

The attention is registered with transformers' AttentionInterface as ULYSSES and the model switched
to it once (`use_ulysses_attention`). It is active only inside `context_parallel(group)`, which the
engine enters for each training micro-batch; outside (evaluation of whole rows, generation) it is
ditty's packed SDPA, i.e. transformers' sdpa for unpacked batches. Key/value heads fewer than N are
repeated up to the query heads before the all-to-all (the cost of grouped-query attention here).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

if TYPE_CHECKING:
    import torch

ULYSSES = "ditty_ulysses"
"""The attention implementation name registered by `register_ulysses_attention`."""

_ACTIVE: dict[str, Any] = {"group": None}


@contextlib.contextmanager
def context_parallel(group: Any) -> Iterator[None]:
    """Run the model's attention as Ulysses over `group` (a ProcessGroup or a 1-D DeviceMesh of the
    context-parallel ranks) for the forwards and backwards inside."""
    if hasattr(group, "get_group"):
        group = group.get_group()
    previous = _ACTIVE["group"]
    _ACTIVE["group"] = group
    try:
        yield
    finally:
        _ACTIVE["group"] = previous


def context_parallel_active() -> bool:
    return _ACTIVE["group"] is not None


def context_parallel_group() -> Any:
    """The context-parallel ranks' ProcessGroup inside `context_parallel`, else None."""
    return _ACTIVE["group"]


def register_ulysses_attention() -> None:
    """Register ULYSSES with transformers (idempotent): the attention function, and a mask function that
    builds no mask under context parallel (causality and packed samples are the attention's own) and
    sdpa's mask otherwise."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if ULYSSES not in AttentionInterface._global_mapping:
        AttentionInterface.register(ULYSSES, ulysses_attention_forward)
        AttentionMaskInterface.register(ULYSSES, _ulysses_mask)


def use_ulysses_attention(model: "torch.nn.Module") -> None:
    """Switch a transformers model's attention to ULYSSES (the saved config does not keep the switch:
    `final/` loads with the model's default attention)."""
    register_ulysses_attention()
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    base.set_attn_implementation(ULYSSES)
    if base.config._attn_implementation != ULYSSES:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            f"{type(base).__name__} did not take ditty's context-parallel attention",
            key="parallel.cp",
            fix="use cp = 1 with this model",
        )


def _ulysses_mask(*args: Any, **kwargs: Any) -> Any:
    if context_parallel_active():
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def ulysses_attention_forward(
    module: "torch.nn.Module",
    query: "torch.Tensor",
    key: "torch.Tensor",
    value: "torch.Tensor",
    attention_mask: "Optional[torch.Tensor]",
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    **kwargs: Any,
) -> "tuple[torch.Tensor, None]":
    """transformers' attention signature: query [B, H, s, D], key/value [B, H_kv, s, D] of this rank's
    s tokens; returns [B, s, H, D]. `cu_seq_lens_q` (packed rows) delimits the samples over the whole
    rows. Outside `context_parallel`, ditty's packed SDPA (sdpa for unpacked batches)."""
    group = _ACTIVE["group"]
    if group is None:
        from ditty.models.packing import packed_sdpa_forward

        return packed_sdpa_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    import torch.distributed as dist
    import torch.nn.functional as F

    for unsupported in ("softcap", "s_aux", "sinks"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"{ULYSSES}: {unsupported} is not supported")
    size = dist.get_world_size(group)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % size:  # fewer key/value heads than ranks to spread them over: repeat them
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q, k, v = (_heads_to_sequence(x, size, group) for x in (query, key, value))
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        from ditty.models.packing import per_sample_attention

        out = per_sample_attention(q, k, v, cu_seq_lens, scaling=scaling, dropout=dropout)  # [B, S, h, D]
        out = out.transpose(1, 2)
    else:
        # Right-padded rows: causal attention alone keeps every real token from the padding after it.
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=k.shape[1] != q.shape[1]
        )
    return _sequence_to_heads(out, size, group).transpose(1, 2), None


def _all_to_all(tensor: "torch.Tensor", group: Any) -> "torch.Tensor":
    """Chunk i of dim 0 goes to rank i; the result's chunk j came from rank j (differentiable: the
    backward is the all-to-all the other way)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(tensor.contiguous(), None, None, group))


def _heads_to_sequence(x: "torch.Tensor", size: int, group: Any) -> "torch.Tensor":
    """[B, H, s, D] (all heads, this rank's tokens) -> [B, H / size, size * s, D] (this rank's heads,
    the whole row, in rank order: rank r holds the r-th slice of every row)."""
    b, h, s, d = x.shape
    sent = x.reshape(b, size, h // size, s, d).permute(1, 0, 2, 3, 4)  # [size, B, h, s, D]: chunk i -> rank i
    got = _all_to_all(sent, group)  # chunk j: my heads, rank j's tokens
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * s, d)


def _sequence_to_heads(x: "torch.Tensor", size: int, group: Any) -> "torch.Tensor":
    """The inverse: [B, h, S, D] (my heads, the whole row) -> [B, h * size, S / size, D]."""
    b, h, total, d = x.shape
    s = total // size
    sent = x.reshape(b, h, size, s, d).permute(2, 0, 1, 3, 4)  # chunk i: rank i's tokens
    got = _all_to_all(sent, group)  # chunk j: rank j's heads, my tokens
    return got.permute(1, 0, 2, 3, 4).reshape(b, size * h, s, d)
