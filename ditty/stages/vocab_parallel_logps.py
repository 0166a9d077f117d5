"""Per-token log-probabilities and entropy on vocabulary shards (tensor parallel), with autograd, and
no [tokens, vocabulary] tensor beyond one chunk of one rank's shard.

Under tensor parallel the output head is split by vocabulary rows: each rank of the group holds the
rows [start, start + local) of the weight (ditty.parallel.tensor: a DTensor `Shard(0)` on the "tp"
mesh, cut as `torch.chunk` cuts, so the last ranks hold fewer rows when tp does not divide the
vocabulary). Every rank holds the same hidden states h (all the tokens) and global target ids y.
Per chunk of tokens, each rank computes its own logits and the group sums what the softmax needs:

    z   = softcap(scale * h @ W_local.T + b_local)                 this rank's logits [n, local]
    m   = all-reduce MAX of max_j z_j                              the global max, per token
    S, Z_y, A = all-reduce SUM of (sum_j exp(z_j - m),             one all-reduce of [n, 2 or 3]
                                   z_y - m where y is in this shard (else 0),
                                   sum_j exp(z_j - m) (z_j - m))   (the last only for entropy)
    log p(y) = Z_y - log S                      entropy = log S - A / S

The forward keeps one log-sum-exp per token (and E[z] for entropy); the backward recomputes each
chunk's logits on each rank (one matrix product per chunk: no logits are held between forward and
backward) and forms the local gradient of the logits, d log p(y) / dz = onehot_local(y) - softmax_local
and d entropy / dz = -softmax_local (z - E[z]). The weight's and bias's gradients stay on their rank
(its rows); the hidden states' gradient is a partial sum over the vocabulary, all-reduced over the
group (the hidden states are the same on every rank, Megatron's "copy to tensor-parallel region").

Entry points:
- `vocab_parallel_token_logps(hidden, weight, targets, group)` and `vocab_parallel_entropy(hidden,
  weight, group)`, and both in one pass, `vocab_parallel_logps_and_entropy`: flat tokens [N, H],
  the weight a vocabulary-sharded DTensor (the group and the shard's offset come from it) or this
  rank's plain rows with `group` and `vocab_start`;
- `logit_shard_logps(logits, targets, group)`: the same from logits already computed on the shards
  ([N, local], or a DTensor sharded on its last dimension);
- `sharded_token_logps(hidden, projection, labels)`: the drop-in for
  `ditty.objectives.logprobs.token_logps` when `tensor_parallel_rows(projection.weight)`: the same
  arguments (the head's input [B, T, H], its `Projection`, Hugging Face labels) and the same
  (logps [B, T], scored [B, T]) aligned with the labels.

Targets equal to `ignore_index` (masked rows) score 0 and pass no gradient; a call with no tokens
returns zeros that still reach the parameters, so every rank runs the same backward. Accumulation is
fp32 (fp64 for fp64 inputs, for exact checks), as in ditty.objectives.logprobs. The autograd function
is ditty.stages.vocab_parallel_kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ditty._utils.labels import IGNORE_INDEX

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
    from torch.distributed import ProcessGroup

    from ditty.stages.fused_loss.head import Projection


@dataclass(frozen=True)
class VocabShard:
    """This rank's rows of a vocabulary split over a tensor-parallel group."""

    group: "Optional[ProcessGroup]"
    """The ranks that together hold the vocabulary; None: this rank holds all of it."""
    start: int
    """The global id of this rank's first row."""


def vocab_parallel_token_logps(
    hidden: "Tensor",
    weight: "Tensor",
    targets: "Tensor",
    group: "Optional[ProcessGroup]" = None,
    *,
    bias: "Optional[Tensor]" = None,
    vocab_start: Optional[int] = None,
    temperature: float = 1.0,
    scale: float = 1.0,
    softcap: Optional[float] = None,
    chunks: int = 8,
    ignore_index: int = IGNORE_INDEX,
) -> "Tensor":
    """log p(targets[i] | hidden[i]) [N] under the logits softcap(scale / temperature * hidden @ W.T + b),
    the vocabulary split over `group` (see the module doc); 0 where the target is `ignore_index`.

    `hidden` [N, H] (or [..., H] with `targets` [...]): every token, the same on every rank of the group
    (a plain tensor or a DTensor). `weight` [rows, H]: a DTensor sharded by rows on a one-dimensional
    mesh (group and offset from it), or this rank's plain rows with `group` and `vocab_start`.
    """
    head = dict(bias=bias, vocab_start=vocab_start, temperature=temperature, scale=scale, softcap=softcap)
    return _run(
        hidden,
        weight,
        targets,
        group,
        want_logps=True,
        want_entropy=False,
        chunks=chunks,
        ignore_index=ignore_index,
        **head,
    )[0]


def vocab_parallel_entropy(
    hidden: "Tensor",
    weight: "Tensor",
    group: "Optional[ProcessGroup]" = None,
    *,
    bias: "Optional[Tensor]" = None,
    vocab_start: Optional[int] = None,
    temperature: float = 1.0,
    scale: float = 1.0,
    softcap: Optional[float] = None,
    chunks: int = 8,
    mask: "Optional[Tensor]" = None,
) -> "Tensor":
    """The entropy of each token's next-token distribution [N] (arguments as
    `vocab_parallel_token_logps`); 0 where `mask` (bool, like the tokens) is False."""
    head = dict(bias=bias, vocab_start=vocab_start, temperature=temperature, scale=scale, softcap=softcap)
    return _run(hidden, weight, None, group, want_logps=False, want_entropy=True, chunks=chunks, mask=mask, **head)[1]


def vocab_parallel_logps_and_entropy(
    hidden: "Tensor",
    weight: "Tensor",
    targets: "Tensor",
    group: "Optional[ProcessGroup]" = None,
    *,
    bias: "Optional[Tensor]" = None,
    vocab_start: Optional[int] = None,
    temperature: float = 1.0,
    scale: float = 1.0,
    softcap: Optional[float] = None,
    chunks: int = 8,
    ignore_index: int = IGNORE_INDEX,
) -> "tuple[Tensor, Tensor]":
    """(log-probabilities, entropies) [N] in one pass over the chunks (one matrix product each way);
    both 0 where the target is `ignore_index`."""
    head = dict(bias=bias, vocab_start=vocab_start, temperature=temperature, scale=scale, softcap=softcap)
    return _run(
        hidden,
        weight,
        targets,
        group,
        want_logps=True,
        want_entropy=True,
        chunks=chunks,
        ignore_index=ignore_index,
        **head,
    )


def logit_shard_logps(
    logits: "Tensor",
    targets: "Tensor",
    group: "Optional[ProcessGroup]" = None,
    *,
    vocab_start: Optional[int] = None,
    temperature: float = 1.0,
    ignore_index: int = IGNORE_INDEX,
    entropy: bool = False,
) -> "Any":
    """log p(targets) [...] from this rank's logits [..., local] (or a DTensor sharded on its last
    dimension over a one-dimensional mesh: group and offset from it); with `entropy`, (logps,
    entropies). Gradients reach `logits`."""
    import torch

    from ditty.stages.vocab_parallel_kernel import ShardedLogProbs, accumulation_dtype

    local, shard = _local_rows(logits, group, vocab_start, dim=-1)
    flat = local.reshape(-1, local.shape[-1])
    if temperature != 1.0:
        flat = flat / temperature
    flat_targets = _plain(targets).reshape(-1).to(flat.device)
    keep = flat_targets != ignore_index
    rows = keep.nonzero().squeeze(1)
    dtype = accumulation_dtype(flat)
    logps = torch.zeros(flat.shape[0], dtype=dtype, device=flat.device)
    entropies = torch.zeros_like(logps)
    if rows.numel():
        picked = flat.index_select(0, rows)
        lp, ent = ShardedLogProbs.apply(
            picked,
            None,
            None,
            flat_targets.index_select(0, rows),
            shard.group,
            shard.start,
            rows.numel(),
            None,
            entropy,
        )
        logps = logps.index_put((rows,), lp)
        if entropy:
            entropies = entropies.index_put((rows,), ent)
    else:
        logps = logps + (flat.sum() * 0.0).to(dtype)
    shape = local.shape[:-1]
    return (logps.reshape(shape), entropies.reshape(shape)) if entropy else logps.reshape(shape)


def sharded_token_logps(
    hidden: "Tensor",
    projection: "Projection",
    labels: "Tensor",
    *,
    chunks: int = 8,
    ignore_index: int = IGNORE_INDEX,
    entropy: bool = False,
) -> "Any":
    """`ditty.objectives.logprobs.token_logps` on a vocabulary-sharded head: (logps [B, T], scored [B, T])
    aligned with `labels` [B, T] (position t's label scored by the hidden state at t - 1), and with
    `entropy`, (logps, scored, entropies [B, T]: the entropy of the distribution that scored label t).

    `hidden` [B, T, H]: the head's input on every tensor-parallel rank (`emit_head_input` under tensor
    parallel gives a replicated DTensor); `projection`: `head_projection(head, config,
    keep_vocab_shards=True)`, its weight a vocabulary-sharded DTensor (and its bias); the temperature
    is the projection's scale (`sampling_projection`)."""
    import torch

    from ditty.stages.fused_loss import shifted
    from ditty.stages.vocab_parallel_kernel import accumulation_dtype

    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    batch, width = labels.shape
    hidden = _plain(hidden)
    target = shifted(_plain(labels).to(hidden.device), ignore_index)  # aligned with the hidden states
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_target = target.reshape(-1)
    rows = (flat_target != ignore_index).nonzero().squeeze(1)
    dtype = accumulation_dtype(hidden)
    flat = torch.zeros(batch * width, dtype=dtype, device=hidden.device)
    flat_entropy = torch.zeros_like(flat)
    if rows.numel():
        logps, entropies = _run(
            flat_hidden.index_select(0, rows),
            projection.weight,
            flat_target.index_select(0, rows),
            want_logps=True,
            want_entropy=entropy,
            bias=projection.bias,
            scale=projection.scale,
            softcap=projection.softcap,
            chunks=chunks,
            ignore_index=ignore_index,
        )
        flat = flat.index_put((rows,), logps)
        if entropy:
            flat_entropy = flat_entropy.index_put((rows,), entropies)
    else:  # nothing scored: zeros that still reach the parameters, so every rank runs the same backward
        # This rank's own rows of the head: gathering them (as _plain would) leaves a DTensor in the backward.
        local_weight = local_vocab_rows(projection.weight)[0]
        flat = flat + (flat_hidden.sum() * 0.0 + local_weight.sum() * 0.0).to(dtype)

    def aligned(values: "Tensor") -> "Tensor":
        # Hidden position t scored label t + 1: move one place right to align with the labels.
        values = values.reshape(batch, width)
        return torch.cat([values.new_zeros(batch, 1), values[:, :-1]], dim=1)

    valid = target != ignore_index
    scored = torch.cat([torch.zeros_like(valid[:, :1]), valid[:, :-1]], dim=1)
    if entropy:
        return aligned(flat), scored, aligned(flat_entropy)
    return aligned(flat), scored


# --------------------------------------------------------------------------- the shared pass


def _run(
    hidden,
    weight,
    targets,
    group=None,
    *,
    want_logps: bool,
    want_entropy: bool,
    bias=None,
    vocab_start=None,
    temperature=1.0,
    scale=1.0,
    softcap=None,
    chunks=8,
    ignore_index=IGNORE_INDEX,
    mask=None,
):
    """The pass every entry point runs: (logps or None, entropies or None) as asked."""
    import torch

    from ditty.stages.vocab_parallel_kernel import ShardedLogProbs, accumulation_dtype

    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    local_weight, shard = _local_rows(weight, group, vocab_start, dim=0)
    local_bias = _local_rows(bias, shard.group, shard.start, dim=0)[0] if bias is not None else None
    hidden = _plain(hidden)
    shape = hidden.shape[:-1]
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    n = flat_hidden.shape[0]
    if targets is not None:
        flat_targets = _plain(targets).reshape(-1).to(flat_hidden.device)
        keep = flat_targets != ignore_index
    else:
        flat_targets = torch.zeros(n, dtype=torch.long, device=flat_hidden.device)
        keep = torch.ones(n, dtype=torch.bool, device=flat_hidden.device)
    if mask is not None:
        keep = keep & _plain(mask).reshape(-1).to(keep.device).bool()
    rows = keep.nonzero().squeeze(1)  # the same on every rank of the group: the tokens are shared
    dtype = accumulation_dtype(flat_hidden)
    logps = torch.zeros(n, dtype=dtype, device=flat_hidden.device)
    entropies = torch.zeros_like(logps)
    factor = scale / temperature
    if rows.numel():
        picked = flat_hidden.index_select(0, rows)
        if factor != 1.0:  # (s h) W^T = s (h W^T): the scale moves onto the input
            picked = picked * factor
        size = max(1, math.ceil(rows.numel() / chunks))
        lp, ent = ShardedLogProbs.apply(
            picked,
            local_weight,
            local_bias,
            flat_targets.index_select(0, rows),
            shard.group,
            shard.start,
            size,
            softcap,
            want_entropy,
        )
        if want_logps:
            logps = logps.index_put((rows,), lp)
        if want_entropy:
            entropies = entropies.index_put((rows,), ent)
    else:  # no tokens: zeros that still reach the parameters
        zero = flat_hidden.sum() * 0.0 + local_weight.sum() * 0.0
        if local_bias is not None:
            zero = zero + local_bias.sum() * 0.0
        logps, entropies = logps + zero.to(dtype), entropies + zero.to(dtype)
    return logps.reshape(shape), entropies.reshape(shape)


# --------------------------------------------------------------------------- shards and DTensors


def local_vocab_rows(tensor: "Tensor") -> "tuple[Tensor, VocabShard]":
    """This rank's plain rows of a vocabulary-sharded DTensor (a head's weight or bias split by rows on
    the "tp" mesh), and where they start."""
    return _local_rows(tensor, None, None, dim=0)


def _local_rows(tensor: "Tensor", group: "Optional[ProcessGroup]", start: Optional[int], *, dim: int):
    """(this rank's plain rows of `tensor` along `dim`, its VocabShard). A DTensor sharded along `dim`
    on a one-dimensional mesh names its group and offset itself (torch.chunk's split); a plain tensor
    is this rank's rows, at `start` (0 when there is no group)."""
    from torch.distributed.tensor import DTensor, Shard

    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        axis = dim % tensor.dim()
        sharded = [i for i, p in enumerate(tensor.placements) if isinstance(p, Shard) and p.dim == axis]
        if mesh.ndim != 1 or not sharded:
            raise ValueError(
                f"a vocabulary-sharded tensor is a DTensor sharded on dimension {axis} of a one-dimensional mesh, "
                f"not placements {tensor.placements} on a {mesh.ndim}-dimensional mesh"
            )
        total = tensor.shape[axis]
        size = mesh.size()
        chunk = -(-total // size)  # torch.chunk: equal pieces of ceil(total / size), the last ones shorter
        begin = min(mesh.get_local_rank() * chunk, total)
        local = tensor.to_local()
        if local.shape[axis] != max(0, min(chunk, total - begin)):
            raise ValueError(f"a shard of {local.shape[axis]} rows is not torch.chunk's piece at row {begin}")
        return local, VocabShard(mesh.get_group(), begin)
    if group is not None and start is None:
        raise ValueError("a plain tensor of vocabulary rows needs vocab_start: the global id of its first row")
    return tensor, VocabShard(group, start or 0)


def _plain(tensor: "Any") -> "Any":
    """A DTensor's value on this rank, whole (replicated first); plain tensors as they are."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(tensor, DTensor):
        if any(not p.is_replicate() for p in tensor.placements):
            tensor = tensor.redistribute(placements=[Replicate()] * tensor.device_mesh.ndim)
        return tensor.to_local()
    return tensor
