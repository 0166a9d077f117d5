"""One context-parallel rank's slice of a causal-LM batch (`parallel.cp`): every row cut into cp equal
pieces along the sequence, piece r for rank r.

The labels are shifted first, on the whole rows, and travel as SHIFTED_LABELS (position t is scored
on the token at t + 1): cut after the shift, the last position of each piece is scored on the first
token of the next piece, which the piece itself does not hold. Rows are right-padded to a multiple of
cp (pad ids, ignored labels, positions counting on; a packed row's padding is one more sample), so
every rank holds the same number of tokens, as the all-to-all of Ulysses attention needs. Position
ids are kept per token, so rotary embeddings see each token's place in its row (or, packed, in its
sample). A packed batch keeps its cumulative sample lengths over the WHOLE rows (recomputed for the
padded width): the attention gathers whole rows and keeps the samples apart with them.

Counting (`supervised_count`, `input_count`, the loss's `count_tokens`) then sees each rank's own
tokens, and the sum over the context ranks is the count of the uncut batch. A loss over whole rows
(the DPO family's pairs) counts SCORED_ROWS on the first piece only, and sums each row's pieces over
the context ranks itself (ditty.objectives.context_rows). Rows without position ids (preference
pairs) get them before the cut.
"""

from __future__ import annotations

from typing import Any

import torch

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS

PER_TOKEN = ("input_ids", SHIFTED_LABELS, "position_ids", "attention_mask")
PACKED_LENGTHS = ("cu_seq_lens_q", "cu_seq_lens_k")
SCORED_ROWS = "context_scored_rows"
"""[B] bool: which WHOLE rows have a scored label (a row's piece may hold none); what a loss over rows
(pairs) counts, and counts on the first piece only (`FIRST_PIECE`), so a row is one unit."""
FIRST_PIECE = "context_first_piece"
"""A bool scalar: this slice is piece 0 of its rows."""


def shard_batch(batch: dict[str, Any], rank: int, size: int, pad_token_id: int) -> dict[str, Any]:
    """Rank `rank`'s piece of every row of `batch` (see the module doc)."""
    if "labels" not in batch or "input_ids" not in batch:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            f"context parallel cuts causal-LM batches (input_ids, labels); this batch has {sorted(batch)}",
            key="parallel.cp",
            fix="use cp = 1 with this data",
        )
    labels = batch["labels"]
    out = {key: value for key, value in batch.items() if key != "labels"}
    if "position_ids" not in out:  # a collator that gives none (preference pairs): each token's place in its row
        rows, width = labels.shape
        out["position_ids"] = torch.arange(width, device=labels.device).expand(rows, width).clone()
    out[SCORED_ROWS] = (labels[:, 1:] != IGNORE_INDEX).any(dim=1)
    out[FIRST_PIECE] = torch.tensor(rank == 0)
    out[SHIFTED_LABELS] = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    rows, width = batch["input_ids"].shape
    padded = -(-width // size) * size
    if padded != width:
        out = _pad(out, rows, width, padded, pad_token_id)
    piece = padded // size
    start = rank * piece
    for key in PER_TOKEN:
        if key in out:
            out[key] = out[key][:, start : start + piece].contiguous()
    return out


def _pad(batch: dict[str, Any], rows: int, width: int, padded: int, pad_token_id: int) -> dict[str, Any]:
    extra = padded - width
    fills = {"input_ids": pad_token_id, SHIFTED_LABELS: IGNORE_INDEX, "attention_mask": 0}
    out = dict(batch)
    for key, fill in fills.items():
        if key in out:
            out[key] = torch.cat([out[key], out[key].new_full((rows, extra), fill)], dim=1)
    if "position_ids" in out:
        positions = out["position_ids"]
        tail = positions[:, -1:] + torch.arange(1, extra + 1, dtype=positions.dtype, device=positions.device)
        if PACKED_LENGTHS[0] in out:  # a sample of its own: positions from 0
            tail = torch.arange(extra, dtype=positions.dtype, device=positions.device).expand(rows, extra)
        out["position_ids"] = torch.cat([positions, tail], dim=1)
    if PACKED_LENGTHS[0] in out:
        cu = _padded_lengths(out[PACKED_LENGTHS[0]], rows, width, extra)
        longest = int((cu[1:] - cu[:-1]).max())
        out.update({name: cu for name in PACKED_LENGTHS})
        out.update(max_length_q=longest, max_length_k=longest)
    return out


def _padded_lengths(cu: torch.Tensor, rows: int, width: int, extra: int) -> torch.Tensor:
    """The cumulative sample lengths of rows widened by `extra` positions, each row's padding one more
    sample. Every row's samples end at its end (a packed row's own padding tail is a sample)."""
    ends = cu[1:].long().tolist()
    lengths: list[int] = []
    start = 0
    for row in range(rows):
        row_end = (row + 1) * width
        while start < row_end:
            end = ends.pop(0)
            lengths.append(end - start)
            start = end
        lengths.append(extra)
    out = torch.zeros(len(lengths) + 1, dtype=cu.dtype, device=cu.device)
    out[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return out
