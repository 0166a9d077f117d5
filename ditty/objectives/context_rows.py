"""Per-row sums over context-parallel pieces: under `parallel.cp` each rank holds a piece of every row
(ditty.data.context_shard), and a loss over whole rows (the DPO family: a completion's log-probability
is the sum over all its tokens) needs each row's sum on every rank of the group.

The reward model reads a row's score at its last token, which one rank's piece holds:
`read_scores_at_whole_rows` gives every rank each row's score (below).

`whole_row_sums(values)` all-reduces the pieces' sums over the context-parallel group that the engine
has active for the micro-batch (ditty.models.ulysses.context_parallel); outside one (one process,
evaluation of whole rows) it returns them as they are. Every rank of the group then computes the same
loss from the same sums, and returns `1 / cp` of it (`piece_share`): the trainer adds the ranks'
losses and metrics over the batch group, which holds the context ranks too. Backward, the sum's
gradient on each rank is the `1 / cp` share of that rank's loss, so it is all-reduced (summed) on the
way back: each piece gets the whole loss's gradient for its own tokens, and FSDP's reduction over
the data- and context-parallel ranks adds the pieces' parameter gradients together.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ditty.objectives.jsd_shards import sum_both_ways


def context_group() -> Optional[Any]:
    """The active context-parallel group of more than one rank, else None."""
    from ditty.models.ulysses import context_parallel_group

    group = context_parallel_group()
    return group if group is not None and dist.get_world_size(group) > 1 else None


def whole_row_sums(values: Tensor) -> Tensor:
    """Each row's sum over the context-parallel pieces (see the module doc); `values` as they are
    outside context parallel."""
    group = context_group()
    if group is None:
        return values
    if not values.requires_grad:
        total = values.clone()
        dist.all_reduce(total, group=group)
        return total
    return sum_both_ways(values, group)


def piece_share() -> float:
    """The share of a whole-row loss this context-parallel rank returns: 1 / cp (1 outside)."""
    group = context_group()
    return 1.0 if group is None else 1.0 / dist.get_world_size(group)


# --------------------------------------------------------------------------- a sequence classifier's score


def read_scores_at_whole_rows(model: torch.nn.Module, score: torch.nn.Module) -> None:
    """Under context parallel, a transformers sequence classifier (the reward model) gives each row the
    score of its last token that is not padding, wherever that token lies: transformers reads a row's
    score at its last non-padding position within the rank's piece, so the `score` head's output is
    replaced, inside `context_parallel`, by each row's whole-row score at every position of the piece
    (that token's score from the rank whose piece holds it, summed over the group as `whole_row_sums`).
    The model's inputs are noted by a hook before its forward (the piece's ids and their positions)."""
    inputs: dict[str, Any] = {}
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)

    def note_inputs(module: Any, args: tuple, kwargs: dict) -> None:
        inputs["input_ids"] = kwargs.get("input_ids", args[0] if args else None)
        inputs["position_ids"] = kwargs.get("position_ids")

    def whole_rows(module: Any, args: Any, output: Tensor) -> Tensor:
        if context_group() is None or inputs.get("input_ids") is None or inputs.get("position_ids") is None:
            return output
        return _row_scores(output, inputs["input_ids"], inputs["position_ids"], pad)

    model.register_forward_pre_hook(note_inputs, with_kwargs=True)
    score.register_forward_hook(whole_rows)


def _row_scores(scores: Tensor, input_ids: Tensor, position_ids: Tensor, pad: Optional[int]) -> Tensor:
    """[B, piece, labels]: each row's score at its last token that is not `pad` (transformers' rule: the
    rightmost one), over the whole row, repeated along the piece."""
    group = context_group()
    real = input_ids != pad if pad is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = position_ids.to(input_ids.device)
    last = torch.where(real, positions, torch.full_like(positions, -1)).amax(dim=1)
    dist.all_reduce(last, op=dist.ReduceOp.MAX, group=group)
    here = real & (positions == last[:, None])  # that token, on the one rank whose piece holds it
    mine = (scores * here[..., None].to(scores.dtype)).sum(dim=1)
    row = sum_both_ways(mine, group)
    return row[:, None, :].expand_as(scores)
