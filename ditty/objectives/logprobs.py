"""Per-token and per-sequence log-probabilities of completion tokens, from the hidden states through
the model's output head in chunks of tokens, so a 128k vocabulary never makes the full
`[tokens, vocab]` logits.

The head is taken apart exactly as for `train.loss_chunks` (ditty.stages.fused_loss: `emit_head_input`
hands the head's input through, `head_projection` gives its weight, bias, scale and softcap, LoRA,
tied and FSDP2-sharded heads included). The kernel differs from the fused cross-entropy's on
purpose: that one returns one scalar sum and so can form its gradients during the forward, while
preference and policy losses weight every sequence (every token, for GRPO) differently, so the
incoming gradient is only known in the backward. Here the forward keeps one log-sum-exp per token;
the backward recomputes each chunk's logits once (one extra matrix product per chunk, the price of
holding no logits between forward and backward).

How the trainer plugs it in:
- preference data: `concatenate_pairs(chosen, rejected, pad_id)` stacks the chosen rows over the
  rejected ones (one forward for both); run the model under `emit_head_input` (the trainer already
  does this for `loss_chunks`), then `token_logps(hidden, projection, labels)` and
  `sequence_logps(...)`; `split_pairs` cuts the result back into chosen and rejected.
  `model_token_logps(model, batch)` does the forward and the head itself (the reference forward,
  the precompute pass, tests).
- `labels` follow Hugging Face's convention: the input ids with prompt and padding set to
  IGNORE_INDEX; position t's hidden state scores label t + 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Optional

import torch
from torch import Tensor

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS
from ditty.stages.fused_loss import Projection, emit_head_input, head_projection, output_head, shifted
from ditty.stages.fused_loss.head import model_config


def token_logps(
    hidden: Tensor, projection: Projection, labels: Tensor, *, chunks: int = 8, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor]:
    """(logps [B, T] (float32, float64 for float64 inputs), scored [B, T] bool), both aligned with `labels` [B, T]:
    logps[b, t] = log p(labels[b, t] | tokens before t) where scored[b, t], else 0.

    `hidden` [B, T, H] is the output head's input; the first label of a row is never scored (no
    hidden state precedes it). Only scored positions are projected, `chunks` pieces of them at a
    time; gradients reach `hidden` and the projection's weight and bias.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    from ditty.stages.vocab_parallel import tensor_parallel_rows

    if tensor_parallel_rows(projection.weight):  # a tensor-parallel head: each rank scores on its rows
        from ditty.stages.vocab_parallel_logps import sharded_token_logps

        return sharded_token_logps(hidden, projection, labels, chunks=chunks, ignore_index=ignore_index)
    batch, width = labels.shape
    target = shifted(labels.to(hidden.device), ignore_index)  # aligned with the hidden states
    aligned_target = _position_logps(hidden, projection, target, chunks, ignore_index)
    # Hidden position t scored label t + 1: move both one place right to align them with the labels.
    logps = torch.cat([aligned_target.new_zeros(batch, 1), aligned_target[:, :-1]], dim=1)
    scored = torch.cat([torch.zeros_like(target[:, :1], dtype=torch.bool), (target != ignore_index)[:, :-1]], dim=1)
    return logps, scored


def batch_token_logps(
    hidden: Tensor, projection: Projection, batch: Mapping[str, Tensor], *, chunks: int = 8
) -> tuple[Tensor, Tensor]:
    """`token_logps` of a batch's `labels`; on a context-parallel rank's piece of the rows, whose labels
    travel already shifted (SHIFTED_LABELS, ditty.data.context_shard), (logps, scored) aligned with the
    piece's positions instead: position t's log-probability of the token at t + 1. Either way a row's
    sum is its piece's share of the row's (`ditty.objectives.context_rows.whole_row_sums` adds them)."""
    if "labels" in batch or SHIFTED_LABELS not in batch:
        return token_logps(hidden, projection, batch["labels"], chunks=chunks)
    target = batch[SHIFTED_LABELS].to(hidden.device)
    return _position_logps(hidden, projection, target, chunks, IGNORE_INDEX), target != IGNORE_INDEX


def _position_logps(hidden: Tensor, projection: Projection, target: Tensor, chunks: int, ignore_index: int) -> Tensor:
    """[B, T]: log p(target[b, t] | hidden[b, t]) where the target is not `ignore_index`, else 0."""
    batch, width = target.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_target = target.reshape(-1)
    rows = (flat_target != ignore_index).nonzero().squeeze(1)  # one host sync, as the fused loss
    picked_hidden = flat_hidden.index_select(0, rows)
    if projection.scale != 1.0:  # (s h) W^T = s (h W^T): the scale moves onto the input
        picked_hidden = picked_hidden * projection.scale
    dtype = _accumulation_dtype(hidden)
    flat = torch.zeros(batch * width, dtype=dtype, device=hidden.device)
    if rows.numel():
        chunk_size = max(1, math.ceil(rows.numel() / chunks))
        values = _ChunkedTokenLogProbs.apply(
            picked_hidden,
            projection.weight,
            projection.bias,
            flat_target.index_select(0, rows),
            chunk_size,
            projection.softcap,
        )
        flat = flat.index_put((rows,), values)
    else:  # nothing scored: zeros that still reach the parameters, so every rank runs the same backward
        flat = flat + (hidden.sum() * 0.0 + projection.weight.sum() * 0.0).to(dtype)
    return flat.reshape(batch, width)


def sequence_logps(logps: Tensor, scored: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of the scored log-probabilities per row [B], number of scored tokens per row [B])."""
    return (logps * scored).sum(-1), scored.sum(-1)


def model_token_logps(
    model: torch.nn.Module,
    batch: Mapping[str, Tensor],
    *,
    chunks: int = 8,
    temperature: float = 1.0,
    ignore_index: int = IGNORE_INDEX,
) -> tuple[Tensor, Tensor]:
    """`token_logps` of one forward of `model` (a Hugging Face causal LM, PEFT/DDP-wrapped or not)
    on `batch` (`input_ids`, `labels`, optional `attention_mask`), with no full logits made; the
    logits are divided by `temperature` (`sampling_projection`)."""
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "use_cache": False}
    if batch.get("attention_mask") is not None:
        kwargs["attention_mask"] = batch["attention_mask"]
    piece = "labels" not in batch and SHIFTED_LABELS in batch  # a context-parallel rank's piece of the rows
    if piece:
        kwargs["position_ids"] = batch["position_ids"]  # its tokens' places in their rows
    with emit_head_input(model) as head:
        model(**kwargs)
    projection = sampling_projection(
        head_projection(output_head(model), model_config(model), keep_vocab_shards=True), temperature
    )
    if piece:
        return batch_token_logps(head.hidden, projection, batch, chunks=chunks)
    return token_logps(head.hidden, projection, batch["labels"], chunks=chunks, ignore_index=ignore_index)


def sampling_projection(projection: Projection, temperature: float) -> Projection:
    """The head as samples at `temperature` were drawn from it: logits divided by the temperature (as
    TRL), so policy gradients and ratios are those of the sampling distribution. (With a softcap the
    division comes before the cap.)"""
    if temperature == 1.0:
        return projection
    return replace(projection, scale=projection.scale / temperature)


def concatenate_pairs(
    chosen: Mapping[str, Tensor], rejected: Mapping[str, Tensor], pad_id: int, ignore_index: int = IGNORE_INDEX
) -> dict[str, Tensor]:
    """One batch of 2N rows: the N chosen rows, then the N rejected ones, right-padded to one width
    (`input_ids` with `pad_id`, `labels` with `ignore_index`, `attention_mask` with 0), so a pair's
    two completions go through one forward. `split_pairs` undoes the stacking."""
    if chosen["input_ids"].shape[0] != rejected["input_ids"].shape[0]:
        raise ValueError(
            f"{chosen['input_ids'].shape[0]} chosen rows but {rejected['input_ids'].shape[0]} rejected: "
            "every pair has one of each"
        )
    width = max(chosen["input_ids"].shape[1], rejected["input_ids"].shape[1])
    fill = {"input_ids": pad_id, "labels": ignore_index, "attention_mask": 0}
    out = {}
    for key, value in fill.items():
        parts = []
        for side in (chosen, rejected):
            tensor = side.get(key)
            if tensor is None:
                if key != "attention_mask":
                    raise KeyError(f"concatenate_pairs: no {key!r} in a side of the pairs")
                tensor = torch.ones_like(side["input_ids"])
            parts.append(torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value))
        out[key] = torch.cat(parts, dim=0)
    return out


def split_pairs(values: Tensor) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) halves of a per-row tensor of a `concatenate_pairs` batch."""
    if values.shape[0] % 2:
        raise ValueError(f"a batch of pairs has an even number of rows, not {values.shape[0]}")
    chosen, rejected = values.chunk(2, dim=0)
    return chosen, rejected


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """log softmax(softcap(hidden @ weight.T + bias))[target] per row, chunk by chunk.

    Saves the inputs and one fp32 log-sum-exp per row; the backward recomputes each chunk's logits,
    d logp / d logits = onehot - softmax, scaled per row by the incoming gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, chunk_size, softcap):
        out = torch.empty(hidden.shape[0], dtype=_accumulation_dtype(hidden), device=hidden.device)
        lse = torch.empty_like(out)
        with torch.no_grad():
            for start in range(0, hidden.shape[0], chunk_size):
                end = start + chunk_size
                logits, _ = _logits(hidden[start:end], weight, bias, softcap)
                lse[start:end] = torch.logsumexp(logits, dim=-1)
                out[start:end] = logits.gather(1, target[start:end, None]).squeeze(1) - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), target, lse)
        ctx.has_bias, ctx.chunk_size, ctx.softcap = bias is not None, chunk_size, softcap
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        dtype = lse.dtype
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_bias and ctx.has_bias else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = start + ctx.chunk_size
            h, t, g = hidden[start:end], target[start:end], grad_out[start:end].to(dtype)
            logits, capped = _logits(h, weight, bias, ctx.softcap)
            # d logp / d logits = onehot - softmax, times the row's incoming gradient, in the logits buffer
            grad = logits.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])
            grad[torch.arange(t.shape[0], device=t.device), t] += g
            if capped is not None:
                grad.mul_(1.0 - capped.square_())
            grad = grad.to(h.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad @ weight
            if grad_weight is not None:
                grad_weight += grad.t() @ h
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
        )


def _logits(h: Tensor, weight: Tensor, bias: Optional[Tensor], softcap: Optional[float]):
    """(fp32 logits of one chunk after the softcap, tanh(logits / cap) or None)."""
    logits = torch.nn.functional.linear(h, weight, bias).to(_accumulation_dtype(h))
    if not softcap:
        return logits, None
    capped = torch.tanh(logits / softcap)
    return capped * softcap, capped


def _accumulation_dtype(tensor: Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs (as the fused cross-entropy), fp64 for fp64 ones (exact checks)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32
