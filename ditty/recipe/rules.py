"""The compiler's rules. Each is small, has an id, and yields `Problem`s with a key and a fix.

Add a rule by writing a function and decorating it with `@rule("area.name")` (ditty/recipe/rule_base.py);
`compile_recipe` runs the rules in the order they were registered: the value checks of
ditty/recipe/value_rules.py, then this file's, then the other *_rules modules. `Context`, `rule`,
`error` and `warning` import from here too. Rules read the config only: no weights, no data, no
network.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from ditty.config.errors import Problem
from ditty.config.schema import walk_leaves
from ditty.config.sections import SHARDED_KINDS
from ditty.config.stopping import EXAMPLE, parse_stop_condition
from ditty.recipe import value_rules  # noqa: F401  (its rules run first)
from ditty.recipe.rule_base import ALL_RULES, Context, Rule, error, rule, value_at, warning  # noqa: F401

# --- batch and schedule -------------------------------------------------------------------------


@rule("batch.divisible")
def batch_divisible(ctx: Context) -> Iterator[Problem]:
    """The global batch splits exactly into micro-batches on every data-parallel rank."""
    train = ctx.config.train
    per_pass = train.micro_batch_size * ctx.data_parallel_size
    if per_pass <= 0 or train.global_batch_size <= 0:
        return
    if train.accumulation_steps(ctx.data_parallel_size) is None:
        options = sorted(
            {
                per_pass * k
                for k in (max(1, train.global_batch_size // per_pass), train.global_batch_size // per_pass + 1)
            }
        )
        yield error(
            "train.global_batch_size",
            f"{train.global_batch_size} is not divisible by micro_batch_size x data-parallel size "
            f"= {train.micro_batch_size} x {ctx.data_parallel_size} = {per_pass}",
            "set train.global_batch_size to "
            + " or ".join(str(o) for o in options)
            + " (or change train.micro_batch_size)",
        )


@rule("schedule.warmup")
def warmup_within_training(ctx: Context) -> Iterator[Problem]:
    """Warmup must end before training does."""
    steps = ctx.config.train.steps
    warmup = ctx.config.scheduler.warmup_steps
    if steps is not None and steps > 0 and warmup >= steps:
        yield error(
            "scheduler.warmup_steps",
            f"warmup ({warmup} steps) is not shorter than training ({steps} steps)",
            f"set scheduler.warmup_steps below {steps}, e.g. {max(0, steps // 10)}",
        )


@rule("schedule.intervals")
def intervals(ctx: Context) -> Iterator[Problem]:
    """Intervals longer than the run never fire."""
    cfg = ctx.config
    steps = cfg.train.steps
    if steps is None:
        return
    for path in ("train.eval_every", "checkpoint.every"):
        value = value_at(cfg, path)
        if steps > 0 and value > steps:
            yield warning(path, f"is {value}, longer than the run ({steps} steps): it only happens at the end")


@rule("schedule.stop_when")
def stop_condition(ctx: Context) -> Iterator[Problem]:
    """`train.stop_when` parses, and evaluations happen during the run to check it."""
    train = ctx.config.train
    try:
        condition = parse_stop_condition(train.stop_when)
    except ValueError as exc:
        yield error("train.stop_when", str(exc), f"e.g. {EXAMPLE}")
        return
    if condition is not None and train.eval_every <= 0:
        yield error(
            "train.stop_when",
            f"{str(condition)!r} is checked after each evaluation, and train.eval_every = {train.eval_every} "
            "evaluates only at the end",
            "set train.eval_every, e.g. 50",
        )
    elif condition is not None and condition.relative and not _evaluates_at_start(ctx.config):
        yield error(
            "train.stop_when",
            f"{str(condition)!r} compares with the start, and this run does not evaluate at step 0",
            "set train.eval_at_start = true, or give a number instead of start",
        )


def _evaluates_at_start(cfg: Any) -> bool:
    """As the trainer decides: `train.eval_at_start`, unset: the objectives after SFT that evaluate during the run."""
    from ditty.objectives.table import objective_for

    t = cfg.train
    return t.eval_at_start if t.eval_at_start is not None else t.eval_every > 0 and objective_for(cfg).post_training


# --- paths --------------------------------------------------------------------------------------


@rule("paths.output")
def output_directory(ctx: Context) -> Iterator[Problem]:
    """The run directory must be a directory (or creatable)."""
    output = ctx.config.run.output_dir
    if not output.strip():
        yield error("run.output_dir", "is empty", 'set run.output_dir, e.g. "runs/my-run"')
    elif os.path.isfile(output):
        yield error(
            "run.output_dir",
            f"{output} is an existing file, not a directory",
            "choose another run.output_dir; ditty never overwrites your files",
        )
    else:
        parent = os.path.dirname(os.path.abspath(output))
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and os.path.isfile(parent):
            yield error("run.output_dir", f"{parent} is a file, so {output} cannot be created")


@rule("paths.data")
def data_paths(ctx: Context) -> Iterator[Problem]:
    """Data sources name what they need, and local files exist."""
    from ditty.data.sources import file_set_problems

    data = ctx.config.data
    if data.source == "file":
        if not data.path:
            yield error(
                "data.path",
                'is required when data.source = "file"',
                "set data.path to a .jsonl/.json/.csv/.parquet/.txt file",
            )
        elif os.path.isdir(data.path):
            yield error("data.path", f"{data.path} is a directory", "name the files, e.g. data/*.jsonl")
        else:  # what the loader would refuse before reading a row: no match, a suffix, an empty file, ...
            yield from file_set_problems(data.path, "data.path")
    elif data.path and not data.sources:  # [[data.sources]] warn about it themselves
        yield error(
            "data.path",
            f'names a file, but data.source = "{data.source}" reads '
            + (f"the built-in {data.name!r} dataset" if data.source == "builtin" else f"the hub dataset {data.name!r}")
            + ", not the file",
            'set data.source = "file" to train on the file (or remove data.path)',
        )
    if data.source == "hub":
        if not data.name:
            yield error("data.name", 'is required when data.source = "hub"')
        else:
            yield warning(
                "data.name", f"hub dataset {data.name!r} cannot be verified offline; it is fetched at build time"
            )
    if data.val_path:
        yield from file_set_problems(data.val_path, "data.val_path")


@rule("paths.resume")
def resume_path(ctx: Context) -> Iterator[Problem]:
    """`checkpoint.resume` is "auto", "never" or an existing checkpoint."""
    resume = ctx.config.checkpoint.resume
    if resume not in ("auto", "never") and not os.path.exists(resume):
        yield error(
            "checkpoint.resume",
            f'{resume!r} is neither "auto", "never" nor an existing checkpoint path',
            'use "auto", "never" or the path of a checkpoints/step-N folder',
        )


@rule("model.source")
def model_source(ctx: Context) -> Iterator[Problem]:
    """The model can be found: a local directory, a cached or reachable hub id, or an architecture."""
    try:
        from ditty.models import check_model_source
    except ImportError:  # models package not present in this build: nothing to ask
        return
    yield from check_model_source(ctx.config.model)
    model = ctx.config.model
    if model.path and model.init == "random" and not model.factory:
        yield warning(
            "model.init",
            f'is "random": model.path {model.path!r} gives only its configuration, its weights are not loaded',
            'set model.init = "pretrained" (or "auto") to start from its weights',
        )


@rule("model.config")
def model_config_keys(ctx: Context) -> Iterator[Problem]:
    """Every `model.config` key is a field of the model's config class (a misspelling is not dropped)."""
    try:
        from ditty.models.build import config_key_problems
    except ImportError:  # models package not present in this build: nothing to ask
        return
    yield from config_key_problems(ctx.config.model)


@rule("model.tokenizer")
def tokenizer_source(ctx: Context) -> Iterator[Problem]:
    """The tokenizer fits the model."""
    cfg = ctx.config
    if cfg.tokenizer.kind == "byte" and cfg.model.resolved_init == "pretrained":
        yield warning(
            "tokenizer.kind",
            "the byte tokenizer replaces the pretrained model's own tokenizer: its token ids mean "
            "something else to the model",
            'use tokenizer.kind = "auto" for the model\'s tokenizer',
        )
    if cfg.tokenizer.path and os.path.sep in cfg.tokenizer.path and not os.path.isdir(cfg.tokenizer.path):
        yield error("tokenizer.path", f"{cfg.tokenizer.path} is not a directory")


# --- settings without effect, and dtypes ---------------------------------------------------------

# option path -> (the field that chooses, the choices that use the option)
_OPTION_USED_BY: dict[str, tuple[str, set]] = {
    "optimizer.momentum": ("optimizer.kind", {"sgd"}),
    "optimizer.betas": ("optimizer.kind", {"adamw", "adamw8bit", "radam", "muon", "adamw_schedulefree"}),
    "optimizer.eps": ("optimizer.kind", {"adamw", "adamw8bit", "radam", "muon", "adamw_schedulefree"}),
    **{
        f"optimizer.{name}": ("optimizer.kind", {"muon"})
        for name in ("muon_lr", "muon_weight_decay", "muon_momentum", "ns_steps", "adjust_lr_fn", "ns_dtype")
    },
    "scheduler.decay_fraction": ("scheduler.kind", {"wsd"}),
    "scheduler.min_lr_ratio": ("scheduler.kind", {"linear", "cosine", "wsd"}),
    "train.compile_scope": ("train.compile", {True}),
    "train.compile_mode": ("train.compile", {True}),
    "data.group_by_length": ("data.packing", {False}),
    "data.on_bad_rows": ("data.source", {"file", "hub"}),
    "data.max_row_bytes": ("data.source", {"file"}),
    "model.architecture": ("model.resolved_init", {"random"}),
    "model.config": ("model.resolved_init", {"random"}),
    "fp8.backend": ("fp8.enabled", {True}),
    "fp8.emulate": ("fp8.enabled", {True}),
    "hub.private": ("hub.push", {"end", "checkpoints"}),
    "logging.wandb_project": ("logging.wandb", {True}),
    **{
        f"peft.{name}": ("peft.kind", {"lora", "dora"})
        for name in ("r", "alpha", "dropout", "target_modules", "modules_to_save")
    },
    **{
        f"quant.{name}": ("quant.kind", {"bnb-4bit"})
        for name in ("quant_type", "double_quant", "compute_dtype", "storage_dtype")
    },
    **{
        f"parallel.{name}": ("parallel.kind", set(SHARDED_KINDS))
        for name in (
            "param_dtype",
            "reduce_dtype",
            "output_dtype",
            "cast_forward_inputs",
            "reshard_after_forward",
            "cpu_offload",
            "pin_memory",
            "sync_grad_accum",
        )
    },
    **{
        f"parallel.{name}": ("parallel.kind", {"ddp"})
        for name in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph")
    },
    **{
        f"parallel.{name}": ("parallel.kind", {"deepspeed"})
        for name in ("zero_stage", "offload_optimizer", "offload_params")
    },
    **{f"parallel.{name}": ("parallel.kind", {"hsdp"}) for name in ("replicate_size", "shard_size")},
    **{f"data.{name}": ("data.format", {"text", "classification", "masked_lm"}) for name in ("text_column",)},
    **{f"data.{name}": ("data.format", {"classification"}) for name in ("text_pair_column", "label_column")},
    **{f"data.{name}": ("data.format", {"token_classification"}) for name in ("words_column", "tags_column")},
    **{f"data.{name}": ("data.format", {"seq2seq"}) for name in ("source_column", "target_column", "max_target_len")},
    **{f"data.{name}": ("data.format", {"masked_lm"}) for name in ("mask_probability",)},
    "train.eval_samples": ("model.task", {"causal-lm", "seq2seq"}),  # the generation metric's sample count
    **{
        f"data.{name}": ("data.format", {"prompt_completion", "preference", "unpaired_preference"})
        for name in ("prompt_column", "completion_column")
    },
    "data.template": ("data.format", {"prompt_completion"}),
    **{f"data.{name}": ("data.format", {"chat"}) for name in ("messages_column", "chat_keys")},
    **{f"data.{name}": ("data.source", {"builtin"}) for name in ("num_samples",)},
}


SETTABLE = {"model.resolved_init": "model.init"}
"""Choosers of _OPTION_USED_BY that are derived (model.init "auto" resolves to "pretrained" with a
path): the key a user sets to change them."""


@rule("settings.no_effect")
def settings_without_effect(ctx: Context) -> Iterator[Problem]:
    """A value the user set that the chosen kind ignores is a warning, never silence."""
    for path, (chooser, users) in _OPTION_USED_BY.items():
        if ctx.is_set(path) and value_at(ctx.config, chooser) not in users:
            key = SETTABLE.get(chooser, chooser)  # a derived value is named by the key a user sets
            shown = _show(value_at(ctx.config, chooser))
            if key != chooser and value_at(ctx.config, key) != value_at(ctx.config, chooser):
                shown = f"{_show(value_at(ctx.config, key))} ({value_at(ctx.config, chooser)} here)"
            yield warning(
                path,
                f"has no effect because {key} = {shown}",
                f"remove it, or set {key} to " + " or ".join(_show(u) for u in sorted(users, key=str)),
            )
    cfg = ctx.config
    # Block classes say what FSDP shards, and also what activation checkpointing and per-block compile wrap.
    if ctx.is_set("parallel.block_classes") and not (
        cfg.parallel.kind in ("fsdp", "hsdp")
        or cfg.train.activation_checkpointing != "none"
        or (cfg.train.compile and cfg.train.compile_scope == "blocks")
    ):
        yield warning(
            "parallel.block_classes",
            f"has no effect because parallel.kind = {_show(cfg.parallel.kind)}, activation checkpointing is off "
            "and nothing is compiled per block",
            'remove it, or set parallel.kind to "fsdp" or "hsdp", or train.activation_checkpointing',
        )
    leaves = {leaf.path for leaf in walk_leaves(type(ctx.config))}
    if ctx.is_set("train.epochs") and ctx.config.train.steps is not None and "train.steps" in leaves:
        yield warning("train.epochs", "has no effect because train.steps is set", "remove one of them")


@rule("precision.dtypes")
def dtype_agreement(ctx: Context) -> Iterator[Problem]:
    """Storage dtype, compute precision and device should agree; say which wins when they do not."""
    cfg = ctx.config
    stored = cfg.model.dtype
    compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[cfg.train.precision]
    if stored not in ("auto", compute) and not (stored == "float32" and compute != "float32"):
        yield warning(
            "model.dtype",
            f"weights stored as {stored} but train.precision is {cfg.train.precision}: "
            f"the computation runs in {compute} where autocast applies, the weights and optimizer state stay {stored}",
        )
    if cfg.train.precision != "fp32" and cfg.run.device == "cpu":
        yield warning(
            "train.precision",
            f"{cfg.train.precision} on the CPU is very slow (no low-precision units on most CPUs)",
            "use fp32 for CPU training",
        )


@rule("hub.repo")
def hub_repo(ctx: Context) -> Iterator[Problem]:
    """Pushing needs a repository id."""
    hub = ctx.config.hub
    if hub.push != "never" and not hub.repo_id:
        yield error("hub.repo_id", f'is required when hub.push = "{hub.push}"', 'set hub.repo_id = "user/model-name"')


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


@rule("compat")
def compatibility(ctx: Context) -> Iterator[Problem]:
    """Every row of the compatibility table in ditty/recipe/compatibility_rules.py."""
    from ditty.recipe.compatibility_rules import COMPAT_RULES

    for row in COMPAT_RULES:
        if row.when(ctx.config):
            yield Problem(row.key, row.message, fix=row.fix, severity=row.severity, rule=row.id)


@rule("parallel.mesh")
def mesh_fits(ctx: Context) -> Iterator[Problem]:
    """The device mesh covers the world size; DeepSpeed options fit its stage."""
    from ditty.parallel.deepspeed import deepspeed_problems
    from ditty.parallel.mesh import mesh_shape

    shape = mesh_shape(ctx.config.parallel, ctx.world_size)
    if isinstance(shape, list):
        yield from shape
    yield from deepspeed_problems(ctx.config.parallel)
