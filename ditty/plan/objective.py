"""The memory and time an objective adds to a rank beyond the policy's own training state.

The objective's row (ditty.objectives.table) says what it holds, its `footprint`
(ditty.objectives.reference.Footprint): the reference model ("adapter": the base with the adapter
disabled, nothing more; "copy": a frozen copy of the starting weights; "path": that checkpoint's
parameters, both sharded like the policy under fsdp/hsdp; "precompute": nothing while training), the
rows a sample makes (a pair is 2 rows through one forward) and, for the RL rows, the rollouts' KV
cache: completions in flight on a rank x (prompt + new tokens) x layers x 2 (keys and values) x
kv_heads x head_dim x bytes. This module turns it into rows of the memory plan and the reference's
FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

from ditty.objectives.footprint import Footprint, loaded_as_is


def resolve_objective(config: Any, world_size: int) -> Footprint:
    """The objective row's footprint, with the parameter count of a reference named by a path."""
    from ditty.objectives.table import OBJECTIVES, objective_name

    row = OBJECTIVES.get(objective_name(config))
    footprint = row.footprint(config, world_size) if row is not None and row.footprint is not None else Footprint()
    if footprint.reference != "path":
        return footprint
    return replace(footprint, reference_numel=_parameters_of(config, footprint.reference_name))


def objective_chunks(config: Any, objective: Footprint) -> int:
    """The chunks the objective's loss scores tokens in (it never makes full logits); 0 for the task's loss."""
    return objective.chunks


def _parameters_of(config: Any, path: str) -> Optional[int]:
    from ditty.config.errors import RecipeError
    from ditty.plan.source import model_shape

    try:
        return model_shape(replace(config, model=loaded_as_is(config.model, path))).parameter_count
    except (RecipeError, KeyError, OSError, ValueError):
        return None


def objective_rows(shape: Any, s: Any, held: list, rank: int) -> list:
    """The memory rows (ditty.plan.memory.Row) `s.objective` adds on `rank`."""
    from ditty.plan.memory import Row
    from ditty.plan.parameters import local_numel
    from ditty.plan.settings import DTYPE_BYTES, SHARDED

    o: Footprint = s.objective
    rows: list = []
    # A reference or teacher sharded like the policy is also split by tensor parallel (the same plan).
    split = s.shard_size * s.tp if s.parallel in SHARDED else 1
    where = f"sharded over {split} ranks like the policy" if o.reference_sharded else "whole on every rank"
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
            shards = split if o.reference_sharded else 1
            size = math.ceil(numel / shards) * DTYPE_BYTES[s.weight_dtype]
            rows.append(Row("reference model", size, f"{o.reference_name}, frozen, {where}"))
    if o.rollout_sequences:
        dtype = s.gather_dtype if s.parallel in SHARDED else (s.compute_dtype or s.weight_dtype)
        # Under tp a rank samples with its own attention heads: its share of the cache.
        kv = rollout_kv_bytes(shape, o.rollout_sequences, o.rollout_tokens, DTYPE_BYTES[dtype]) // max(1, s.tp)
        heads = f"{shape.num_kv_heads} kv heads" if s.tp <= 1 else f"{shape.num_kv_heads} / tp {s.tp} kv heads"
        note = (
            f"{o.rollout_sequences} completions in flight x {o.rollout_tokens} tokens x {shape.num_layers} layers"
            f" x 2 x {heads} x {shape.head_dim} x {DTYPE_BYTES[dtype]} bytes"
        )
        rows.append(Row("rollouts' KV cache", kv, note, "transient"))
    return rows


def reference_flops_per_token(shape: Any, s: Any, held: list) -> float:
    """The preference reference's forward per token (no backward): the base's matrix products and
    attention, or a reference path's parameters. Nothing for "precompute" or the policy alone; the RL
    rows' time (their rollouts dominate) is not modelled."""
    o = s.objective
    if o is None or o.rollout_sequences or o.reference not in ("adapter", "copy", "path"):
        return 0.0
    attention = 2 * s.seq_len * shape.q_dim * shape.num_layers
    if o.reference == "path":
        return 2.0 * (o.reference_numel or 0) + attention
    base = sum(t.numel for t in held if t.matmul and t.group not in ("LoRA adapters", "modules_to_save copies"))
    return 2.0 * base + attention


def rollout_kv_bytes(shape: Any, sequences: int, tokens: int, dtype_bytes: int) -> int:
    return sequences * tokens * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * dtype_bytes
