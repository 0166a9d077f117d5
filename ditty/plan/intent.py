"""`ditty init --model ID --method full|lora|qlora --gpus N --gpu-memory 24GB`: a recipe from intent.

`choose_recipe` walks the choices in order of preference (less communication, more precision,
less recomputation, larger micro-batches first) and keeps the first whose plan fits the device
with HEADROOM to spare and in which the caller's `problems` (the recipe compiler) finds no error.
Each choice comes back with the reason `ditty init` writes above it in the recipe.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from ditty.config.errors import RecipeError
from ditty.config.root import TrainerConfig
from ditty.config.sections import (
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PeftConfig,
    QuantConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)
from ditty.plan.planner import TrainingPlan, make_plan, with_changes
from ditty.plan.report import gib
from ditty.plan.settings import Target
from ditty.plan.source import model_shape

Method = Literal["full", "lora", "qlora"]
METHODS = ("full", "lora", "qlora")
HEADROOM = 0.90
"""A plan fits when its peak is at most this share of the device memory: the rest absorbs the
caching allocator's fragmentation and batches longer than the planned average."""
MICRO_BATCHES = (8, 4, 2, 1)
REFUSALS_BEFORE_GIVING_UP = 3
PLACEHOLDER_DATA = "trl-lib/tldr"


@dataclass
class Choice:
    config: TrainerConfig
    plan: TrainingPlan
    reasons: dict[str, str]
    """Dotted key -> why this value was chosen (written as a comment above it)."""


def choose_recipe(
    model: str,
    method: str,
    target: Target,
    *,
    data: Optional[str] = None,
    seq_len: Optional[int] = None,
    global_batch: int = 32,
    problems: Optional[Callable[[TrainerConfig], list]] = None,
) -> Choice:
    if method not in METHODS:
        raise RecipeError.single(f"--method {method!r} is not one of {', '.join(METHODS)}", fix="--method lora")
    if target.memory is None:
        raise RecipeError.single("`ditty init --method` needs --gpu-memory", fix="e.g. --gpu-memory 24GB")
    base = _base_config(model, method, target, data, seq_len, global_batch)
    shape = model_shape(base)
    limit = int(HEADROOM * target.memory)
    smallest: Optional[tuple[int, dict]] = None
    refused: list[list] = []
    for changes in _candidates(base, method, target):
        config = with_changes(base, changes)
        plan = make_plan(config, target, shape=shape, with_knobs=False)
        if smallest is None or plan.memory.peak < smallest[0]:
            smallest = (plan.memory.peak, changes)
        if plan.memory.peak > limit:
            continue
        errors = problems(config) if problems is not None else []
        if not errors:
            return Choice(config, plan, _reasons(config, plan, method, target, shape))
        refused.append(errors)
        if len(refused) == REFUSALS_BEFORE_GIVING_UP:  # the flags, not the choices, are at fault
            raise RecipeError(refused[0])
    if refused:
        raise RecipeError(refused[0])
    peak, changes = smallest if smallest else (0, {})
    raise RecipeError.single(
        f"no {method} set-up of {model} fits {target.world_size} GPU(s) of {gib(target.memory)} GiB: the smallest "
        f"plan needs {gib(peak)} GiB per GPU ({', '.join(f'{k} = {v}' for k, v in changes.items())})",
        fix="add GPUs (--gpus), use --method qlora, or a shorter --seq-len",
    )


def _base_config(
    model: str, method: str, target: Target, data: Optional[str], seq_len: Optional[int], global_batch: int
) -> TrainerConfig:
    name = re.sub(r"[^a-z0-9]+", "-", os.path.basename(model.rstrip("/")).lower()).strip("-") + f"-{method}"
    data_config = DataConfig(source="hub", name=PLACEHOLDER_DATA, format="prompt_completion", val_fraction=0.01)
    if data:
        data_config = DataConfig(source="file", path=data, val_fraction=0.01, **detect_data(data))
    data_config = dataclasses.replace(data_config, max_seq_len=seq_len or 2048)
    adapter = method in ("lora", "qlora")
    return TrainerConfig(
        run=RunConfig(name=name, output_dir=f"runs/{name}", device="cuda"),
        model=ModelConfig(path=model, dtype="bfloat16"),
        data=data_config,
        train=TrainConfig(global_batch_size=global_batch, precision="bf16", log_every=10, eval_every=200),
        optimizer=OptimizerConfig(lr=2e-4 if adapter else 2e-5, weight_decay=0.0 if adapter else 0.01),
        scheduler=SchedulerConfig(kind="cosine", warmup_steps=20, min_lr_ratio=0.1),
        peft=PeftConfig(kind="lora", r=16, alpha=32.0, dropout=0.05) if adapter else PeftConfig(),
        quant=QuantConfig(kind="bnb-4bit", compute_dtype="bfloat16") if method == "qlora" else QuantConfig(),
        parallel=ParallelConfig(),
    )


def detect_format(path: str) -> str:
    """The data format a local file's first row suggests: chat, prompt_completion, or text."""
    return detect_data(path)["format"]


def detect_data(path: str) -> dict:
    """The [data] keys a local file's first row suggests: chat ("messages" or ShareGPT's
    "conversations"), prompt_completion ("prompt"/"completion", or Alpaca's "instruction"/"output"
    through its template), or text."""
    if not os.path.isfile(path):
        raise RecipeError.single(f"--data {path!r} is not a file", fix="name a .jsonl/.json/.csv/.parquet/.txt file")
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "{}")
        try:
            row = json.loads(first)
        except ValueError:
            raise RecipeError.single(f"the first line of {path} is not JSON", fix="check the file") from None
        if "messages" in row or "conversations" in row:
            return {"format": "chat"}
        if "prompt" in row and "completion" in row:
            return {"format": "prompt_completion"}
        if "instruction" in row and "output" in row:
            return {"format": "prompt_completion", "template": "alpaca"}
    return {"format": "text"}


def _candidates(base: TrainerConfig, method: str, target: Target):
    """Choices in order of preference; each a dict of dotted-key changes."""
    world = target.world_size
    if world == 1:
        layouts: list[dict] = [{"parallel.kind": "none"}]
    else:
        layouts = [{"parallel.kind": "ddp"}, {"parallel.kind": "fsdp"}]
    if method == "qlora":
        layouts = [
            {**layout, "quant.storage_dtype": "bfloat16"} if layout["parallel.kind"] == "fsdp" else layout
            for layout in layouts
        ]
    if method == "full":
        # fp32 master weights with bf16 compute first (exact AdamW updates), pure bf16 second.
        weights = [{"model.dtype": "float32"}, {"model.dtype": "bfloat16"}]
        layouts = [{**w, **layout} for w in weights for layout in layouts]
    optimizers = [{"optimizer.kind": "adamw"}, {"optimizer.kind": "adamw8bit", "optimizer.backend": "torchao"}]
    offloads = [{}] + ([{"parallel.cpu_offload": True}] if method == "full" and world > 1 else [])
    checkpointing = ["none", "selective", "full"]
    chunks = [0, 8] if hasattr(base.train, "loss_chunks") else [0]
    micros = [m for m in MICRO_BATCHES if base.train.global_batch_size % (m * world) == 0] or [1]
    for layout, optimizer, offload in itertools.product(layouts, optimizers, offloads):
        if offload and (layout.get("parallel.kind") != "fsdp" or optimizer["optimizer.kind"] == "adamw8bit"):
            continue
        for ac, micro, chunk in itertools.product(checkpointing, micros, chunks):
            changes = {
                **layout,
                **optimizer,
                **offload,
                "train.activation_checkpointing": ac,
                "train.micro_batch_size": micro,
            }
            if chunk:
                changes["train.loss_chunks"] = chunk
            yield changes


def _reasons(config: TrainerConfig, plan: TrainingPlan, method: str, target: Target, shape) -> dict[str, str]:
    s, mem = plan.settings, target.memory or 0
    peak = gib(plan.memory.peak)
    reasons = {
        "model.path": f"{shape.parameter_count / 1e9:.3g}B parameters ({shape.source})",
        "train.micro_batch_size": (
            f"chosen by `ditty init`: the largest of {'/'.join(map(str, MICRO_BATCHES))} whose plan fits "
            f"{int(HEADROOM * 100)}% of {gib(mem)} GiB with the choices below; accumulation {s.accumulation} x "
            f"{target.world_size} GPU(s) make the global batch of {config.train.global_batch_size}"
        ),
        "train.activation_checkpointing": _ac_reason(config, plan, target, shape),
        "parallel.kind": _parallel_reason(config, plan, target, shape),
        "optimizer.kind": (
            "chosen by `ditty init`: AdamW (two moments in the parameter dtype) fits"
            if config.optimizer.kind == "adamw"
            else "chosen by `ditty init`: 8-bit AdamW (torchao; 2 bytes of state per parameter instead of 8) "
            "because AdamW did not fit"
        ),
        "train.precision": "chosen by `ditty init`: bf16 autocast (GPUs since Ampere compute bf16 at full speed)",
    }
    if method == "full":
        reasons["model.dtype"] = (
            "chosen by `ditty init`: fp32 weights and AdamW state (exact updates), bf16 compute"
            if config.model.dtype == "float32"
            else "chosen by `ditty init`: bf16 weights and optimizer state (fp32 master weights did not fit)"
        )
    else:
        reasons["model.dtype"] = "chosen by `ditty init`: the frozen base in bf16 (LoRA adapters train in fp32)"
    if method == "qlora":
        four_bit = sum(
            r.bytes
            for r in plan.memory.kinds[0].rows
            if r.label.startswith("4-bit weights") or r.label == "4-bit quantization state"
        )
        reasons["quant.kind"] = (
            "chosen by `ditty init` (--method qlora): the base in 4-bit NF4 with double quantization "
            f"({gib(four_bit)} GiB)"
        )
        if config.parallel.kind == "fsdp":
            reasons["quant.storage_dtype"] = (
                "chosen by `ditty init`: FSDP flattens a block in one dtype, so the 4-bit storage is bf16 like the rest"
            )
    if getattr(config.train, "loss_chunks", 0):
        reasons["train.loss_chunks"] = "chosen by `ditty init`: the full [tokens, vocabulary] logits did not fit"
    if config.parallel.cpu_offload:
        reasons["parallel.cpu_offload"] = (
            "chosen by `ditty init`: sharded state on the GPUs did not fit; it lives in host memory"
        )
    if config.data.source == "hub" and config.data.name == PLACEHOLDER_DATA:
        reasons["data.name"] = (
            "a placeholder (Reddit TL;DR summaries): replace with your data (--data PATH, or data.source/path)"
        )
    reasons["data.max_seq_len"] = (
        f"the plan assumes every micro-batch is {config.data.max_seq_len} tokens long; peak {peak} GiB per GPU"
    )
    return reasons


def _ac_reason(config, plan, target, shape) -> str:
    ac = config.train.activation_checkpointing
    if ac == "none":
        return "chosen by `ditty init`: nothing is recomputed; the activations fit"
    lighter = "none" if ac == "selective" else "selective"
    other = make_plan(
        with_changes(config, {"train.activation_checkpointing": lighter}), target, shape=shape, with_knobs=False
    )
    return f'chosen by `ditty init`: with "{lighter}" the plan needs {gib(other.memory.peak)} GiB per GPU'


def _parallel_reason(config, plan, target, shape) -> str:
    kind = config.parallel.kind
    if kind == "none":
        return "chosen by `ditty init`: one GPU"
    if kind == "ddp":
        return (
            f"chosen by `ditty init`: a whole replica fits on each GPU ({gib(plan.memory.peak)} GiB), so DDP "
            "(one all-reduce of the gradients per step)"
        )
    ddp = make_plan(with_changes(config, {"parallel.kind": "ddp"}), target, shape=shape, with_knobs=False)
    return (
        f"chosen by `ditty init`: a DDP replica would need {gib(ddp.memory.peak)} GiB per GPU; FSDP shards parameters, "
        f"gradients and optimizer state over {target.world_size} GPUs"
    )


def annotate(text: str, reasons: dict[str, str], width: int = 96) -> str:
    """Write each chosen value's reason as a comment line right above it in a recipe's TOML."""
    import textwrap

    out, section = [], ""
    for line in text.splitlines():
        header = re.fullmatch(r"\[([^\[\]]+)\]", line.strip())
        if header:
            section = header.group(1)
        key = re.match(r"^(?:# )?([A-Za-z0-9_]+) = ", line)
        reason = reasons.get(f"{section}.{key.group(1)}") if key and section else None
        if reason:
            out += ["# >> " + part for part in textwrap.wrap(reason, width - 5)]
        out.append(line)
    return "\n".join(out) + "\n"
