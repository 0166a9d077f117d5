"""What a post-training stream keeps in the checkpoint beside the prompt cursor: the rollouts or
pairs sampled but not yet trained on, as text for the JSON sidecar.

Those are each rank's own (sampled from its own prompts), and rank 0 alone writes the sidecar, so
`encode_by_rank` gathers every rank's entry to rank 0 (a collective, like the data stream's reader
positions) and `decode_for_rank` hands each rank its own on resume. Another world size can resume
only when no rank held anything: the ranks' samples cannot be dealt out again the way a new world
would have drawn them. The compiler reads these states too (the rule checkpoint.resume.samples),
so torch is imported only when one is encoded or decoded.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Callable, Optional

from ditty.config.errors import RecipeError


def encode_state(value: Any) -> str:
    """Tensors and lists of a stream's state as text for the checkpoint's JSON sidecar."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_state(text: str) -> Any:
    import torch

    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=False)


def encode_by_rank(value: Any, world_size: int, group: Any = None) -> list[str]:
    """Rank 0: every rank's `value`, encoded, in rank order (a collective when there are several
    ranks). The other ranks get their own entry alone: only rank 0's sidecar is written, and
    gathering to rank 0 keeps the other ranks from holding everyone's samples. `group`: the ranks
    that hold different samples (the data-parallel ones under tensor parallel; None: the world),
    gathered to the first of them."""
    import torch.distributed as dist

    mine = encode_state(value)
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    first = dist.get_rank(group) == 0 if group is not None else dist.get_rank() == 0
    gathered: Optional[list] = [None] * world_size if first else None
    dist.gather_object(mine, gathered, group=group, group_dst=0)
    return gathered if gathered is not None else [mine]


# The entries of a stream's checkpointed state that hold each rank's own samples: what they hold, and
# when an entry holds nothing (None: never; such an entry is saved only while it holds some).
PER_RANK: dict[str, tuple[str, Optional[Callable[[Any], bool]]]] = {
    "buffer": ("rollouts", None),  # RL: reused over rl.updates_per_rollout steps
    "ahead": ("rollouts", lambda drawn: not drawn),  # RL: sampled ahead (rollout.max_staleness)
    "pending": ("preference pairs", lambda saved: not saved["pairs"]),  # online pairs: the next steps'
}


def decode_for_rank(saved: Any, key: str, rank: int, world_size: int) -> Any:
    """This rank's entry of `encode_by_rank`'s list, saved under `key` of PER_RANK. From another world
    size every entry must hold nothing; this rank then gets the first. A single string is one entry
    (a checkpoint that kept rank 0's alone): one process takes it."""
    entries = _entries(saved)
    if resumes_on(saved, world_size):
        return decode_state(entries[rank])
    if _holds_samples(entries, key):
        message, fix = resume_refusal(saved, PER_RANK[key][0], world_size)
        raise RecipeError.single(message, key="checkpoint.resume", fix=fix)
    return decode_state(entries[0])


def resumes_on(saved: Any, world_size: int) -> bool:
    """Whether each of `world_size` processes has its own entry in `saved` (a single string: one process's)."""
    return len(_entries(saved)) == world_size


def ranks_holding_samples(state: Any) -> Optional[tuple[Any, str]]:
    """(the saved entries, what they hold) of the first PER_RANK entry of a stream's checkpointed
    `state` that holds samples; None when none does. Reads the sidecar only: no weights."""
    if not isinstance(state, dict):
        return None
    for key, (what, _) in PER_RANK.items():
        saved = state.get(key)
        if saved and _holds_samples(_entries(saved), key):
            return saved, what
    return None


def resume_refusal(saved: Any, what: str, world_size: int) -> tuple[str, str]:
    """(message, fix) of resuming `saved` (per-rank entries that hold samples) on `world_size` processes."""
    if isinstance(saved, str):
        problem = f"the checkpoint holds one rank's {what}, sampled and not yet trained on"
        fix = 'start afresh (checkpoint.resume = "never"), or resume on 1 process if one process wrote it'
    else:
        problem = f"the checkpoint holds the {what} its {len(saved)} ranks sampled and had not trained on yet"
        fix = (
            f"resume on {len(saved)} processes (--nproc-per-node x --nnodes), "
            'or start afresh (checkpoint.resume = "never")'
        )
    return f"{problem}; this run has {world_size} processes, and each rank's samples continue only on that rank", fix


def _entries(saved: Any) -> list:
    return [saved] if isinstance(saved, str) else list(saved)


def _holds_samples(entries: list, key: str) -> bool:
    """Whether any entry holds samples (an entry that is never empty is not decoded)."""
    empty = PER_RANK[key][1]
    return empty is None or not all(empty(decode_state(entry)) for entry in entries)
