"""What a post-training stream keeps in the checkpoint beside the prompt cursor: the rollouts or
pairs sampled but not yet trained on, as text for the JSON sidecar.

Those are each rank's own (sampled from its own prompts), and rank 0 alone writes the sidecar, so
`encode_by_rank` gathers every rank's entry to rank 0 (a collective, like the data stream's reader
positions) and `decode_for_rank` hands each rank its own on resume. Another world size can resume
only when no rank held anything: the ranks' samples cannot be dealt out again the way a new world
would have drawn them.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Callable, Optional

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
    """Rank 0: every rank's `value`, encoded, in rank order (a collective when there are several
    ranks). The other ranks get their own entry alone: only rank 0's sidecar is written, and
    gathering to rank 0 keeps the other ranks from holding everyone's samples."""
    mine = encode_state(value)
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    gathered: Optional[list] = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return gathered if gathered is not None else [mine]


def decode_for_rank(
    saved: Any, rank: int, world_size: int, *, empty: Optional[Callable[[Any], bool]], what: str
) -> Any:
    """This rank's entry of `encode_by_rank`'s list. From another world size every entry must be
    `empty` (None: an entry is never empty); this rank then gets the first. A single string is one
    entry of unknown origin (a checkpoint that kept rank 0's alone): one process takes it."""
    if isinstance(saved, str):
        if world_size == 1:
            return decode_state(saved)
        entries = [saved]
    else:
        entries = list(saved)
        if len(entries) == world_size:
            return decode_state(entries[rank])
    if empty is not None:
        values = [decode_state(entry) for entry in entries]
        if all(empty(value) for value in values):
            return values[0]
    if isinstance(saved, str):
        problem = f"the checkpoint holds one rank's {what}, sampled and not yet trained on"
        fix = 'start afresh (checkpoint.resume = "never"), or resume on 1 process if one process wrote it'
    else:
        problem = f"the checkpoint holds the {what} its {len(entries)} ranks sampled and had not trained on yet"
        fix = (
            f"resume on {len(entries)} processes (--nproc-per-node x --nnodes), "
            'or start afresh (checkpoint.resume = "never")'
        )
    raise RecipeError.single(
        f"{problem}; this run has {world_size} processes, and each rank's samples continue only on that rank",
        key="checkpoint.resume",
        fix=fix,
    )
