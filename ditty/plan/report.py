"""The plan as text: what `ditty check --plan` and `ditty init --method` print.

One memory table with a column per kind of rank (sizes in GiB, 2^30 bytes), the load phase when it
differs, host memory that offload moves off the device, the verdict against the stated device
memory with the knobs that would make it fit, then the time estimate.
"""

from __future__ import annotations

from typing import Optional

from ditty.plan.activations import plan_loss
from ditty.plan.planner import TrainingPlan
from ditty.plan.settings import GiB
from ditty.plan.tensor_parallel import traffic

LOGITS_SHARE_WORTH_CHUNKING = 0.05


def gib(value: float) -> str:
    return f"{value / GiB:.2f}"


def render(plan: TrainingPlan) -> str:
    return "\n".join(header(plan) + memory_table(plan) + verdict(plan) + time_lines(plan))


def header(plan: TrainingPlan) -> list[str]:
    s, shape, target = plan.settings, plan.shape, plan.target
    where = "the CPU" if target.device == "cpu" else f"{target.world_size} GPU(s)"
    if target.nodes > 1:
        where += f" ({target.nodes} nodes x {target.gpus_per_node})"
    if target.memory is not None:
        where += f" with {gib(target.memory)} GiB each"
    if plan.device is not None and target.device == "cuda":
        where += f" (timed as {plan.device.name})"
    parallel = (
        s.parallel
        if s.parallel == "none"
        else f"{s.parallel} over {s.shard_size if s.shard_size > 1 else s.world_size} rank(s)"
    )
    if s.tp > 1 or s.cp > 1:  # the mesh ("dp", "cp", "tp"): FSDP2 shards over dp x cp
        dp = s.world_size // (s.tp * s.cp)
        parallel = f"{s.parallel} over dp {dp} x cp {s.cp} = {s.shard_size} rank(s), tensor parallel {s.tp}"
    lines = [
        f"plan: {shape.parameter_count / 1e9:.3g}B-parameter {shape.model_type} ({shape.source})",
        f"  on {where}; weights {s.weight_dtype}, compute {s.compute_dtype or s.weight_dtype}, parallel {parallel}"
        + (f", quantization {s.quant}" if s.quant != "none" else "")
        + (f", {s.peft} r={s.lora_r}" if s.peft != "none" else "")
        + f", optimizer {s.optimizer}"
        + (f" ({s.optimizer_backend})" if s.optimizer != "sgd" else ""),
    ]
    if not shape.llama_block:
        lines.append("  note: activations estimated as for a Llama-style block (this architecture is not modelled)")
    return lines


def memory_table(plan: TrainingPlan) -> list[str]:
    kinds = plan.memory.kinds
    labels: list[str] = []
    for kind in kinds:
        for row in kind.rows:
            if row.label not in labels:
                labels.append(row.label)
    width = max([len(label) for label in labels] + [28])
    columns = [kind.describe_ranks() for kind in kinds]
    col = max([len(c) for c in columns] + [10])
    lines = ["", "memory per rank (GiB)".ljust(width + 2) + "".join(c.rjust(col + 2) for c in columns)]
    notes: dict[str, str] = {}
    for label in labels:
        cells = []
        for kind in kinds:
            row = next((r for r in kind.rows if r.label == label), None)
            cells.append(gib(row.bytes) if row else "-")
            if row and row.note:
                notes.setdefault(label, row.note)
        note = notes.get(label, "")
        lines.append(
            f"  {label.ljust(width)}" + "".join(c.rjust(col + 2) for c in cells) + (f"   {note}" if note else "")
        )
    lines.append("  " + "-" * (width + len(kinds) * (col + 2)))
    lines.append(f"  {'total while training'.ljust(width)}" + "".join(gib(k.total).rjust(col + 2) for k in kinds))
    if any(k.load_bytes > k.total for k in kinds):
        lines.append(
            f"  {'while loading the model'.ljust(width)}"
            + "".join(gib(k.load_bytes).rjust(col + 2) for k in kinds)
            + f"   {kinds[0].load_note or kinds[-1].load_note}"
        )
    hosts = [k for k in kinds if k.host_rows]
    if hosts:
        host = hosts[0]
        total = sum(r.bytes for r in host.host_rows)
        lines.append(
            f"  host memory per rank (offloaded): {gib(total)} GiB ({', '.join(r.label for r in host.host_rows)})"
        )
    chunk_note = _chunked_alternative(plan)
    if chunk_note:
        lines.append(f"  {chunk_note}")
    return lines


def _chunked_alternative(plan: TrainingPlan) -> Optional[str]:
    s = plan.settings
    if s.loss_chunks or not hasattr(plan.config.train, "loss_chunks"):
        return None
    kind = plan.memory.kinds[0]
    logits = next((r.bytes for r in kind.rows if r.label == "logits and loss"), 0)
    if logits < LOGITS_SHARE_WORTH_CHUNKING * kind.total:
        return None
    head_trains = s.peft == "none" or "lm_head" in s.modules_to_save
    chunked = plan_loss(plan.shape, s, chunks=8, head_trains=head_trains).bytes
    total = gib(kind.total - logits + chunked)
    return f"with train.loss_chunks = 8: logits and loss {gib(chunked)} GiB, total {total} GiB"


def verdict(plan: TrainingPlan) -> list[str]:
    target = plan.target
    if target.memory is None:
        hint = "pass --gpu-memory 80GB (or a GPU name) for a fit verdict" if target.device == "cuda" else ""
        return [f"  peak {gib(plan.memory.peak)} GiB per rank" + (f"; {hint}" if hint else "")]
    lines = []
    for kind in plan.memory.kinds:
        share = kind.peak / target.memory
        if kind.peak <= target.memory:
            lines.append(
                f"  fits: {kind.describe_ranks()} peaks at {gib(kind.peak)} of {gib(target.memory)} GiB ({share:.0%})"
            )
        else:
            lines.append(
                f"warning: {kind.describe_ranks()} needs {gib(kind.peak)} GiB, more than the "
                f"{gib(target.memory)} GiB of the device"
            )
    s = plan.settings
    if any(k.load_bytes > target.memory for k in plan.memory.kinds) and not s.low_memory_load:
        lines.append(
            "    while loading, every rank holds the whole model before FSDP shards it: with model.path a local "
            "directory (`hf download ID --local-dir DIR`), rank 0 streams the checkpoint tensor by tensor instead"
        )
    for knob in plan.knobs:
        state = "fits" if knob.fits else "does not fit yet"
        lines.append(f"    with {knob.describe()}: {gib(knob.peak)} GiB ({state})")
    return lines


def time_lines(plan: TrainingPlan) -> list[str]:
    t = plan.time
    lines = ["", "time"]
    pairs = plan.settings.objective is not None and plan.settings.objective.rows_per_sample == 2
    basis = "global batch x 2 rows a pair x max_seq_len" if pairs else "global batch x max_seq_len"
    lines.append(f"  tokens per step     {t.tokens_per_step:,} (at most: {basis})")
    lines.append(f"  FLOPs per step      {t.flops_per_step:.3g}")
    if t.samples is not None:
        per_epoch = f"{t.steps_per_epoch:,}" if t.steps_per_epoch is not None else "? (packing: counted once packed)"
        lines.append(f"  training samples    {t.samples:,}; steps per epoch {per_epoch}")
    lines.append(
        f"  steps               {t.steps:,}"
        if t.steps is not None
        else "  steps               ? (counted once the data is read)"
    )
    lines += _traffic_lines(plan)
    if t.seconds_per_step is not None:
        lines.append(f"  time per step       {_duration(t.seconds_per_step)} ({t.basis})")
        if t.total_seconds is not None:
            lines.append(f"  estimated total     {_duration(t.total_seconds)}")
    else:
        lines.append(f"  time                {t.basis}")
    return lines


def _traffic_lines(plan: TrainingPlan) -> list[str]:
    """Tensor- and context-parallel collectives per rank and step (ditty.plan.tensor_parallel), and a
    warning when their groups span nodes."""
    s, target = plan.settings, plan.target
    if s.tp == 1 and s.cp == 1:
        return []
    moved = traffic(plan.shape, s)
    parts = []
    if s.tp > 1:
        parts.append(f"tp {gib(moved.tensor_parallel)}")
    if s.cp > 1:
        parts.append(f"cp {gib(moved.context_parallel)}")
    lines = [
        f"  tp/cp traffic       {gib(moved.tensor_parallel + moved.context_parallel)} GiB per rank per step "
        f"({', '.join(parts)}); {_duration(moved.seconds_at_nvlink)} at NVLink's 450 GB/s if none overlaps compute"
    ]
    if target.device == "cuda" and s.tp * s.cp > target.gpus_per_node:
        lines.append(
            f"  warning: tp x cp = {s.tp * s.cp} ranks span nodes ({target.gpus_per_node} GPUs per node): their "
            "collectives, every layer, cross the network; keep tp x cp within a node"
        )
    return lines


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes = seconds / 60
    if minutes < 120:
        return f"{minutes:.1f} min"
    return f"{minutes / 60:.1f} h"
