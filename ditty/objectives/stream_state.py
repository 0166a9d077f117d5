"""What a post-training stream keeps in the checkpoint beside the prompt cursor: the rollouts or
pairs sampled but not yet trained on, as text for the JSON sidecar.

Those are each rank's own (sampled from its own prompts), and rank 0 alone writes the sidecar, so
`encode_by_rank` gathers every rank's entry (a collective, like the data stream's reader positions)
and `decode_for_rank` hands each rank its own on resume. Another world size can resume only when no
rank held anything: the ranks' samples cannot be dealt out again the way a new world would have
drawn them.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Callable

import torch
import torch.distributed as dist

from ditty.config.errors import RecipeError


def encode_state(value: Any) -> str:
    """Tensors and lists of a stream's state as text for the checkpoint's JSON sidecar."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_state(text: str) -> Any:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=False)


def encode_by_rank(value: Any, world_size: int) -> list[str]:
    """Every rank's `value`, encoded, in rank order (a collective when there are several ranks)."""
    mine = encode_state(value)
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    out: list = [None] * world_size
    dist.all_gather_object(out, mine)
    return out


def decode_for_rank(saved: Any, rank: int, world_size: int, *, empty: Callable[[Any], bool], what: str) -> Any:
    """This rank's entry of `encode_by_rank`'s list (a single entry: a one-rank checkpoint). From
    another world size, every entry must be `empty`; then this rank gets the first (empty) one."""
    entries = [saved] if isinstance(saved, str) else list(saved)
    if len(entries) == world_size:
        return decode_state(entries[rank])
    values = [decode_state(entry) for entry in entries]
    if all(empty(value) for value in values):
        return values[0]
    raise RecipeError.single(
        f"the checkpoint holds {what} that its {len(entries)} rank(s) sampled and had not trained on yet; this run "
        f"has {world_size}, and each rank's samples continue only on that rank",
        key="checkpoint.resume",
        fix=f'resume with --nproc-per-node {len(entries)}, or start afresh (checkpoint.resume = "never")',
    )
