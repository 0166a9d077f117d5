"""The memory an objective adds to a rank beyond the policy's own training state.

- Preference optimisation (the DPO family): the reference model. `reference = "auto"` with an
  adapter is the base with the adapter disabled (nothing more); "auto" on a full finetune keeps a
  frozen copy of the weights, and a model path holds that checkpoint's parameters, both sharded like
  the policy under fsdp/hsdp (ditty.train.preference); "precompute" holds no reference while
  training (the log-probabilities are scored once before, a few bytes per sample); SimPO and ORPO
  read none. A micro-batch of N pairs is 2N rows through one forward (the activations count rows).
- GRPO (`[rl]`): the rollouts' KV cache, completions in flight on a rank x (prompt + max_new_tokens)
  x layers x 2 (keys and values) x kv_heads x head_dim x bytes, and the KL reference when
  `rl.beta > 0`: the base with the adapter disabled, or a whole frozen copy on every rank
  (ditty.train.rl builds it unsharded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

PAIRED_FORMATS = ("preference",)


@dataclass(frozen=True)
class Objective:
    """What `Settings.resolve` reads of `[preference]` and `[rl]` for the memory rows."""

    method: str = ""
    """"dpo", "ipo", ..., "grpo", or "" (the policy alone)."""
    reference: str = ""
    """"adapter", "copy", "path", "precompute", or "" (none)."""
    reference_name: str = ""
    reference_numel: Optional[int] = None
    """Parameters of a reference path (None when its config cannot be read offline)."""
    reference_sharded: bool = False
    rows_per_sample: int = 1
    """Rows one sample of `train.micro_batch_size` makes: 2 for pairs (chosen and rejected)."""
    rollout_sequences: int = 0
    """Completions one `generate` call holds on a rank."""
    rollout_tokens: int = 0
    """Tokens of each: the prompt (at most data.max_seq_len) and max_new_tokens."""


def resolve_objective(config: Any, world_size: int) -> Objective:
    from ditty.config.sections import SHARDED_KINDS

    sharded = config.parallel.kind in SHARDED_KINDS
    rl = config.rl
    if rl.kind != "none":
        prompts = max(1, config.train.global_batch_size // max(1, rl.group_size) // max(1, world_size))
        in_flight = min(rl.generation_batch_size or prompts, prompts) * rl.group_size
        reference = "" if rl.beta <= 0 else ("adapter" if config.peft.kind != "none" else "copy")
        return Objective(
            method=rl.kind,
            reference=reference,
            reference_sharded=False,
            rollout_sequences=in_flight,
            rollout_tokens=config.data.max_seq_len + rl.max_new_tokens,
        )
    preference_data = config.data.format in ("preference", "unpaired_preference")
    if not preference_data or config.model.task != "causal-lm":
        return Objective()  # (a reward model trains on preference data with its own loss)
    from ditty.config.preference import REFERENCE_FREE

    pref = config.preference
    rows = 2 if config.data.format in PAIRED_FORMATS else 1
    if pref.kind in REFERENCE_FREE:
        return Objective(method=pref.kind, rows_per_sample=rows)
    if pref.reference == "precompute":
        return Objective(method=pref.kind, reference="precompute", rows_per_sample=rows)
    if pref.reference == "auto":
        kind = "adapter" if config.peft.kind != "none" else "copy"
        return Objective(method=pref.kind, reference=kind, reference_sharded=sharded, rows_per_sample=rows)
    return Objective(
        method=pref.kind,
        reference="path",
        reference_name=pref.reference,
        reference_numel=_parameters_of(config, pref.reference),
        reference_sharded=sharded,
        rows_per_sample=rows,
    )


def objective_chunks(config: Any, objective: Objective) -> int:
    """The chunks the objective's loss scores tokens in (it never makes full logits); 0 for the policy alone."""
    if objective.method == "grpo":
        return config.train.loss_chunks or 8
    return config.preference.chunks if objective.method else 0


def _parameters_of(config: Any, path: str) -> Optional[int]:
    from dataclasses import replace

    from ditty.config.errors import RecipeError
    from ditty.plan.source import model_shape

    try:
        return model_shape(replace(config, model=replace(config.model, path=path, init="pretrained"))).parameter_count
    except (RecipeError, KeyError, OSError, ValueError):
        return None


def objective_rows(shape: Any, s: Any, held: list, rank: int) -> list:
    """The memory rows (ditty.plan.memory.Row) `s.objective` adds on `rank`."""
    from ditty.plan.memory import Row
    from ditty.plan.parameters import local_numel
    from ditty.plan.settings import DTYPE_BYTES, SHARDED

    o: Objective = s.objective
    rows: list = []
    where = f"sharded over {s.shard_size} ranks like the policy" if o.reference_sharded else "whole on every rank"
    if o.reference == "adapter":
        rows.append(Row("reference model", 0, "the base with the adapter disabled: no second copy"))
    elif o.reference == "precompute":
        rows.append(Row("reference model", 0, "none while training: its log-probabilities are scored before"))
    elif o.reference == "copy":
        if o.reference_sharded:
            size = sum(local_numel(t, s, rank) * DTYPE_BYTES[t.dtype] for t in held)
        else:
            size = sum(t.bytes for t in held)
        rows.append(Row("reference model", size, f"a frozen copy of the starting weights, {where}"))
    elif o.reference == "path":
        numel = o.reference_numel
        if numel is None:
            rows.append(Row("reference model", 0, f"{o.reference_name}: its config cannot be read offline"))
        else:
            shards = s.shard_size if o.reference_sharded and s.parallel in SHARDED else 1
            size = math.ceil(numel / shards) * DTYPE_BYTES[s.weight_dtype]
            rows.append(Row("reference model", size, f"{o.reference_name}, frozen, {where}"))
    if o.rollout_sequences:
        dtype = s.gather_dtype if s.parallel in SHARDED else (s.compute_dtype or s.weight_dtype)
        kv = rollout_kv_bytes(shape, o.rollout_sequences, o.rollout_tokens, DTYPE_BYTES[dtype])
        note = (
            f"{o.rollout_sequences} completions in flight x {o.rollout_tokens} tokens x {shape.num_layers} layers"
            f" x 2 x {shape.num_kv_heads} kv heads x {shape.head_dim} x {DTYPE_BYTES[dtype]} bytes"
        )
        rows.append(Row("rollouts' KV cache", kv, note, "transient"))
    return rows


def reference_flops_per_token(shape: Any, s: Any, held: list) -> float:
    """The preference reference's forward per token (no backward): the base's matrix products and
    attention, or a reference path's parameters. Nothing for "precompute" or the policy alone; GRPO's
    time (its rollouts dominate) is not modelled."""
    o = s.objective
    if o is None or o.method == "grpo" or o.reference not in ("adapter", "copy", "path"):
        return 0.0
    attention = 2 * s.seq_len * shape.q_dim * shape.num_layers
    if o.reference == "path":
        return 2.0 * (o.reference_numel or 0) + attention
    base = sum(t.numel for t in held if t.matmul and t.group not in ("LoRA adapters", "modules_to_save copies"))
    return 2.0 * base + attention


def rollout_kv_bytes(shape: Any, sequences: int, tokens: int, dtype_bytes: int) -> int:
    return sequences * tokens * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * dtype_bytes
