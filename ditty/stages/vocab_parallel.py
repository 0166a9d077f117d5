"""Cross-entropy on vocabulary-sharded logits (tensor parallel), without gathering the vocabulary.

Under tensor parallel the output head is split by vocabulary rows, so each rank computes the logits
of its share of the vocabulary: a DTensor sharded on its last dimension. torch's `loss_parallel`
computes `F.cross_entropy` on such a DTensor with two all-reduces over the tensor-parallel ranks
(the max and the sum of exponentials, and the target's logit from the rank that holds it) instead of
an all-gather of [tokens, vocab]. Two uses here:

- `sharded_cross_entropy(logits, target)`: the full-logits loss (CausalLMLoss) when the model's
  logits are a vocabulary-sharded DTensor;
- `sharded_linear_cross_entropy(hidden, weight, bias, target, chunks)`: ditty's chunked loss from the
  hidden states and the head's weight shard, chunk by chunk; each chunk's logits are recomputed in
  the backward (torch.utils.checkpoint) rather than kept, so at most one chunk of logits per rank
  exists at a time. The cost is one more [chunk, vocab / tp] matrix product per chunk in the backward
  (the replicated loss's hand-written gradient in kernels.py does not carry over to DTensor shards).

`loss_parallel` switches DTensor's handlers of log-softmax and NLL process-wide and is not
re-entrant (a nested exit would switch them off under the outer one), and its backward must run
inside it too; `vocab_parallel()` counts its entries, so the engine can hold it around a whole
micro-batch (forward and backward) while the loss also enters it for evaluation forwards.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ditty._utils.labels import IGNORE_INDEX

if TYPE_CHECKING:
    from torch import Tensor

_DEPTH = [0]


@contextlib.contextmanager
def vocab_parallel() -> Iterator[None]:
    """torch's `loss_parallel`, re-entrant (see the module doc)."""
    from torch.distributed.tensor.parallel.loss import _disable_custom_loss_ops, _enable_custom_loss_ops

    if _DEPTH[0] == 0:
        _enable_custom_loss_ops()
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if _DEPTH[0] == 0:
            _disable_custom_loss_ops()


def is_vocab_sharded(tensor: Any, dim: int) -> bool:
    """A DTensor sharded along `dim` (negative: from the end) on one of its mesh dimensions."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(tensor, DTensor):
        return False
    dim = dim % tensor.dim()
    return any(isinstance(p, Shard) and p.dim == dim for p in tensor.placements)


def tensor_parallel_rows(weight: Any) -> bool:
    """An output head's weight split by vocabulary rows over the tensor-parallel mesh dimension ("tp",
    ditty.parallel.mesh) alone, as FSDP2 hands it to the forward: the chunked loss then runs on the
    shards. A weight sharded by FSDP2 (a data-parallel dimension) is gathered instead (`replicated`)."""
    from torch.distributed.tensor import DTensor, Shard

    return (
        isinstance(weight, DTensor)
        and tuple(weight.device_mesh.mesh_dim_names or ()) == ("tp",)
        and tuple(weight.placements) == (Shard(0),)
    )


def sharded_cross_entropy(
    logits: "Tensor", target: "Tensor", ignore_index: int = IGNORE_INDEX
) -> "tuple[Tensor, Tensor]":
    """(sum of fp32 cross-entropy, count of targets) for logits [..., vocab] sharded on the vocabulary;
    the sum is a plain tensor, equal on every tensor-parallel rank."""
    import torch.nn.functional as F

    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_target = target.reshape(-1).to(flat_logits.device)
    with vocab_parallel():
        total = F.cross_entropy(flat_logits, flat_target, ignore_index=ignore_index, reduction="sum")
    return total.to_local(), (flat_target != ignore_index).sum()


def sharded_linear_cross_entropy(
    hidden: "Tensor",
    weight: "Tensor",
    bias: "Optional[Tensor]",
    target: "Tensor",
    *,
    scale: float = 1.0,
    softcap: Optional[float] = None,
    ignore_index: int = IGNORE_INDEX,
    chunks: int = 8,
) -> "tuple[Tensor, Tensor]":
    """(sum of cross-entropy, count) of softcap(scale * hidden @ weight.T + bias) against `target`,
    where `weight` (and `bias`) are DTensors sharded by vocabulary rows and `hidden` holds every token
    on every tensor-parallel rank (a replicated DTensor or a plain tensor)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate
    from torch.utils.checkpoint import checkpoint

    mesh = weight.device_mesh
    local = hidden.to_local() if isinstance(hidden, DTensor) else hidden
    local = local.reshape(-1, local.shape[-1])
    target = target.reshape(-1).to(local.device)
    keep = target != ignore_index
    count = keep.sum()
    if int(count) < target.numel():  # no matrix product for prompt or padding positions
        rows = keep.nonzero().squeeze(1)
        local, target = local.index_select(0, rows), target.index_select(0, rows)
    # Replicated on the tensor-parallel ranks: its gradient (a partial sum over the vocabulary shards)
    # is all-reduced on the way back.
    replicated = DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim, run_check=False)
    if local.shape[0] == 0:  # nothing supervised: a zero that still reaches the parameters
        zero = replicated.sum() * 0.0 + weight.sum() * 0.0
        return zero.to_local() if isinstance(zero, DTensor) else zero, count
    size = max(1, math.ceil(local.shape[0] / max(1, chunks)))
    total = torch.zeros((), dtype=torch.float32, device=local.device)
    for start in range(0, local.shape[0], size):
        part = checkpoint(
            _chunk_loss,
            replicated[start : start + size],
            weight,
            bias,
            target[start : start + size],
            scale,
            softcap,
            use_reentrant=False,
        )
        total = total + part
    return total, count


def _chunk_loss(hidden, weight, bias, target, scale, softcap):
    import torch
    import torch.nn.functional as F

    if scale != 1.0:
        hidden = hidden * scale
    logits = F.linear(hidden, weight, bias).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    with vocab_parallel():
        return F.cross_entropy(logits, target, reduction="sum").to_local()
