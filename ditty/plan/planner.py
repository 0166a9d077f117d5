"""`make_plan`: the memory and time plan of a recipe on a target, and the knobs that make it fit.

A knob is one recipe change (or a few together) that lowers the peak: activation checkpointing,
chunked loss, a smaller micro-batch (the global batch stays, accumulation grows), 8-bit AdamW,
FSDP sharding, tensor parallel inside a node, context parallel for long rows, a 4-bit base, FSDP
CPU offload. Each is planned like the recipe itself; the caller
may pass `is_valid` (the recipe compiler, from the command line) so a knob the compiler would
refuse is never suggested.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ditty.plan.architecture import ModelShape
from ditty.plan.devices import DEFAULT_MFU, Device, reference_device
from ditty.plan.memory import MemoryPlan, plan_memory
from ditty.plan.settings import Settings, Target
from ditty.plan.source import model_shape
from ditty.plan.timing import TimePlan, plan_time

Changes = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    changes: Changes
    peak: int
    fits: bool

    def describe(self) -> str:
        return " and ".join(f"{key} = {_show(value)}" for key, value in self.changes.items())


@dataclass
class TrainingPlan:
    config: Any
    shape: ModelShape
    settings: Settings
    target: Target
    memory: MemoryPlan
    time: TimePlan
    device: Optional[Device]
    knobs: list[Knob] = field(default_factory=list)

    @property
    def fits(self) -> Optional[bool]:
        if self.target.memory is None:
            return None
        return self.memory.peak <= self.target.memory


def make_plan(
    config: Any,
    target: Target,
    *,
    shape: Optional[ModelShape] = None,
    seconds_per_micro_batch: Optional[float] = None,
    is_valid: Optional[Callable[[Any], bool]] = None,
    mfu: float = DEFAULT_MFU,
    with_knobs: bool = True,
) -> TrainingPlan:
    shape = shape or model_shape(config)
    settings = Settings.resolve(config, shape, target)
    memory = plan_memory(shape, settings)
    device = _device(target)
    time = plan_time(
        shape, settings, memory.held, config, device, mfu=mfu, seconds_per_micro_batch=seconds_per_micro_batch
    )
    plan = TrainingPlan(config, shape, settings, target, memory, time, device)
    if with_knobs and target.memory is not None and memory.peak > target.memory:
        plan.knobs = fitting_knobs(config, shape, target, memory.peak, is_valid)
    return plan


def _device(target: Target) -> Optional[Device]:
    if target.device != "cuda":
        return None
    if target.gpu:
        from ditty.plan.devices import find_device

        return find_device(target.gpu)
    return reference_device(target.memory)


def peak_of(config: Any, shape: ModelShape, target: Target) -> int:
    return plan_memory(shape, Settings.resolve(config, shape, target)).peak


def fitting_knobs(
    config: Any, shape: ModelShape, target: Target, peak: int, is_valid: Optional[Callable[[Any], bool]] = None
) -> list[Knob]:
    """Single changes that lower the peak (those that fit first), then, if none fits alone, the
    smallest set of them, added one by one in order, that does."""
    memory = target.memory or 0
    knobs: list[Knob] = []
    for changes in candidate_changes(config, target):
        changed = with_changes(config, changes)
        if is_valid is not None and not is_valid(changed):
            continue
        new_peak = peak_of(changed, shape, target)
        if new_peak < peak:
            knobs.append(Knob(changes, new_peak, new_peak <= memory))
    knobs.sort(key=lambda k: (not k.fits, k.peak))
    if knobs and not knobs[0].fits:
        combined: Changes = {}
        current = config
        for knob in sorted(knobs, key=lambda k: k.peak):
            trial = {**combined, **knob.changes}
            changed = with_changes(config, trial)
            if is_valid is not None and not is_valid(changed):
                continue
            trial_peak = peak_of(changed, shape, target)
            if trial_peak < peak_of(current, shape, target):
                combined, current = trial, changed
                if trial_peak <= memory:
                    knobs.insert(0, Knob(combined, trial_peak, True))
                    break
    return knobs[:6]


def candidate_changes(config: Any, target: Target) -> list[Changes]:
    train, parallel = config.train, config.parallel
    out: list[Changes] = []
    if train.activation_checkpointing == "none":
        out.append({"train.activation_checkpointing": "selective"})
    if train.activation_checkpointing != "full":
        out.append({"train.activation_checkpointing": "full"})
    if hasattr(train, "loss_chunks") and not train.loss_chunks:
        out.append({"train.loss_chunks": 8})
    if train.micro_batch_size > 1:
        out.append({"train.micro_batch_size": max(1, train.micro_batch_size // 2)})
    if config.optimizer.kind == "adamw" and parallel.kind != "deepspeed" and not parallel.cpu_offload:
        out.append({"optimizer.kind": "adamw8bit", "optimizer.backend": "torchao"})
    if target.world_size > 1 and parallel.kind in ("none", "ddp"):
        fsdp: Changes = {"parallel.kind": "fsdp"}
        if config.quant.kind == "bnb-4bit":
            storage = config.model.dtype if config.model.dtype != "auto" else "bfloat16"
            fsdp.update({"model.dtype": storage, "quant.storage_dtype": storage})
        out.append(fsdp)
    out += _model_parallel_changes(config, target)
    if config.peft.kind != "none" and config.quant.kind == "none":
        out.append({"quant.kind": "bnb-4bit"})
    if parallel.kind in ("fsdp", "hsdp") and not parallel.cpu_offload and config.optimizer.kind != "adamw8bit":
        out.append({"parallel.cpu_offload": True})
    return out


LONG_ROWS = 8192
"""Rows from this length on make context parallel a knob (below, activations rarely dominate)."""


def _model_parallel_changes(config: Any, target: Target) -> list[Changes]:
    """Tensor-parallel degrees inside one node, and context-parallel degrees for long rows, on the
    FSDP2 mesh; the compiler (`is_valid`) drops those the model's sizes or the world do not divide."""
    parallel, world = config.parallel, target.world_size
    if world <= 1 or parallel.kind not in ("none", "ddp", "fsdp"):
        return []
    out: list[Changes] = []
    for tp in (2, 4, 8):
        if tp > parallel.tp and tp <= target.gpus_per_node and world % (tp * parallel.cp) == 0:
            out.append({"parallel.kind": "fsdp", "parallel.tp": tp})
    if config.data.max_seq_len >= LONG_ROWS:
        for cp in (2, 4, 8):
            if cp > parallel.cp and world % (parallel.tp * cp) == 0:
                out.append({"parallel.kind": "fsdp", "parallel.cp": cp})
    return out


def with_changes(config: Any, changes: Changes) -> Any:
    """`config` with dotted-key changes applied (frozen dataclasses: replaced, never mutated)."""
    for key, value in changes.items():
        section, name = key.split(".", 1)
        part = getattr(config, section)
        config = dataclasses.replace(config, **{section: dataclasses.replace(part, **{name: value})})
    return config


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
