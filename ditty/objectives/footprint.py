"""What an objective holds beyond the policy, as the memory planner asks it before anything is built
(ditty.plan.objective): cheap to import, no torch."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

SHARDED_KINDS = ("fsdp", "hsdp")


@dataclass(frozen=True)
class Footprint:
    """What an objective adds to a rank beyond the policy's own training state (ditty.plan.objective
    turns it into memory and time rows)."""

    method: str = ""
    """The objective's row ("dpo", "grpo", ...), or "" for the policy alone."""
    reference: str = ""
    """What the reference holds (`reference_kind`): "adapter", "copy", "path", "precompute" or "" (none)."""
    reference_name: str = ""
    """The model path of a "path" reference."""
    reference_numel: Optional[int] = None
    """Its parameters, when the planner could read its config offline."""
    reference_sharded: bool = False
    rows_per_sample: int = 1
    """Rows one sample of `train.micro_batch_size` makes: 2 for pairs (chosen and rejected)."""
    rollout_sequences: int = 0
    """Completions one sampling call holds on a rank."""
    rollout_tokens: int = 0
    """Tokens of each: the prompt (at most data.max_seq_len) and the new tokens."""
    chunks: int = 0
    """The chunks the objective's loss scores tokens in (it never makes full logits); 0: the task's loss."""


def reference_kind(config: Any, setting: str) -> str:
    """What a reference `setting` holds for this recipe: "adapter", "copy", "path", "precompute", or
    "" for "none"."""
    if setting == "none":
        return ""
    if setting == "auto":
        return "adapter" if config.peft.kind != "none" else "copy"
    return setting if setting == "precompute" else "path"


def reference_footprint(config: Any, setting: str, **facts: Any) -> Footprint:
    kind = reference_kind(config, setting)
    return Footprint(
        reference=kind,
        reference_name=setting if kind == "path" else "",
        reference_sharded=kind in ("copy", "path") and config.parallel.kind in SHARDED_KINDS,
        **facts,
    )


def loaded_as_is(model: Any, path: str) -> Any:
    """`[model]` for another checkpoint at `path`: its own architecture and config (the policy's
    random-init overrides and factory do not apply), the policy's dtype and loading settings."""
    return replace(model, path=path, init="pretrained", architecture=None, config={}, factory=None, factory_kwargs={})
