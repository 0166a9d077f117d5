"""Rules for data: packing isolation, and data at scale ([[data.sources]], data.streaming, [data.eval],
[eval]). Whether a stream's saved position can resume is ditty/recipe/resume_rules.py's.

Registered after the core rules (imported by the compiler). Like every rule they read the config
and the file system only.
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os
from typing import Any, Iterator

from ditty.config.errors import Problem
from ditty.recipe.rules import Context, error, rule, warning


@rule("data.packing")
def packing_isolation(ctx: Context) -> Iterator[Problem]:
    """Packing needs a model that can keep packed samples from attending to each other."""
    cfg = ctx.config
    if not cfg.data.packing:
        return
    if cfg.model.factory:
        yield error(
            "data.packing",
            "a custom model (model.factory) gets no block-diagonal attention mask, so packed samples would "
            "see each other",
            "set data.packing = false",
        )
        return
    try:
        from ditty.models import read_model_type, supports_packed_attention
        from ditty.models.packing import MASK_FREE_MODEL_TYPES
    except ImportError:
        return
    model_type = read_model_type(cfg.model)
    kernel = cfg.model.attn_implementation
    if model_type is None:
        yield warning(
            "data.packing", "cannot tell offline whether this model isolates packed samples; checked when it loads"
        )
    elif not supports_packed_attention(model_type):
        yield error(
            "data.packing",
            f"{model_type} models cannot isolate packed samples (attention would leak across samples)",
            "set data.packing = false (data.group_by_length = true cuts padding instead)",
        )
    elif kernel in ("flash_attention_2", "flex_attention") and model_type not in MASK_FREE_MODEL_TYPES:
        # Flash and flex kernels isolate samples from the cumulative lengths / position ids, which
        # this model's attention does not take (ditty/models/packing.py); only its dense mask works.
        yield error(
            "data.packing",
            f"{kernel} takes no 4-D mask, and {model_type} isolates packed samples only with one",
            'use model.attn_implementation = "sdpa" (or "eager") with packing for this model',
        )
    elif cfg.model.packed_attention == "per-sample" and model_type not in MASK_FREE_MODEL_TYPES:
        yield warning(
            "model.packed_attention",
            f"{model_type} attention isolates packed samples only with the dense mask; it gets the mask",
            'leave model.packed_attention = "auto"',
        )
    elif cfg.model.packed_attention != "auto" and kernel in ("flash_attention_2", "flex_attention"):
        yield warning(
            "model.packed_attention",
            f"{kernel} keeps packed samples apart by itself; model.packed_attention applies to sdpa and eager",
            'leave model.packed_attention = "auto"',
        )
    elif kernel in ("sdpa", "eager") and model_type in MASK_FREE_MODEL_TYPES and _runs_on_cuda(cfg):
        yield warning(
            "model.attn_implementation",
            f"packed rows on {kernel} attend sample by sample on CUDA, about 9x slower than flex_attention"
            " (BENCHMARKS.md, H100)",
            'leave model.attn_implementation = "auto" (flex_attention for packed rows on CUDA)'
            ' or set it to "flex_attention"',
        )


def packed_attention_text(cfg: Any) -> str:
    """For `ditty check`: how packed rows will keep samples apart (ditty.models.packing.planned_path,
    the rule packed_inputs applies to full rows), e.g. "attention: a block-diagonal [T, T] mask"."""
    try:
        from ditty.models import read_model_type
        from ditty.models.packing import PATH_DESCRIPTIONS, planned_path
    except ImportError:
        return ""
    model_type = read_model_type(cfg.model)
    if model_type is None:
        return "attention path chosen when the model loads"
    device = "cuda" if _runs_on_cuda(cfg) else "cpu"
    path = planned_path(
        model_type, cfg.model.attn_implementation, device, cfg.data.max_seq_len, cfg.model.packed_attention
    )
    how = "" if cfg.model.packed_attention == "auto" else f" (model.packed_attention = {cfg.model.packed_attention!r})"
    return f"attention on {device}: {PATH_DESCRIPTIONS[path]}{how}"


def _runs_on_cuda(cfg: Any) -> bool:
    if cfg.run.device == "cpu":
        return False
    import torch  # only for packed recipes that name sdpa/eager: the answer needs the device

    return torch.cuda.is_available()


_SINGLE_SOURCE_KEYS = ("source", "name", "path", "split", "val_path", "num_samples")
_SHARDED_OR_ENGINE = ("fsdp", "hsdp", "deepspeed")


def _files_problem(key: str, pattern: str) -> Problem | None:
    if os.path.isdir(os.path.expanduser(pattern)):
        return error(key, f"{pattern} is a directory", "name the files, e.g. data/*.jsonl")
    if not glob.glob(os.path.expanduser(pattern)):
        return error(key, f"no file matches {pattern}", "check the path (globs like data/*.jsonl work)")
    return None


@rule("data.sources")
def sources(ctx: Context) -> Iterator[Problem]:
    """Each [[data.sources]] entry names what it needs, with a positive weight and a unique name."""
    from ditty.data.builtin import GENERATORS
    from ditty.recipe.pipeline_rules import IMAGE_BUILTINS

    data = ctx.config.data
    labels: dict[str, str] = {}
    for index, source in enumerate(data.sources):
        key = f"data.sources.{index}"
        if not (source.weight > 0 and math.isfinite(source.weight)):
            yield error(f"{key}.weight", f"must be a positive number, got {source.weight}", "e.g. weight = 0.3")
        if source.source == "file":
            if not source.path:
                yield error(f"{key}.path", 'is required when source = "file"', "set path to a .jsonl/.csv/... file")
            elif (problem := _files_problem(f"{key}.path", source.path)) is not None:
                yield problem
        elif not source.dataset:
            yield error(f"{key}.dataset", f'is required when source = "{source.source}"', "name the dataset")
        elif source.source == "hub":
            yield warning(f"{key}.dataset", f"hub dataset {source.dataset!r} cannot be verified offline")
        elif source.dataset in IMAGE_BUILTINS or source.dataset not in GENERATORS:
            yield error(
                f"{key}.dataset",
                f"{source.dataset!r} is not a built-in text dataset",
                f"use one of {', '.join(GENERATORS)}",
            )
        elif ctx.config.train.eval_samples > 0:
            yield warning(
                f"{key}.dataset",
                "a built-in dataset's exact-match score runs only when it is the single [data] source; "
                "in a mix it reports its val_loss/NAME",
                "set train.eval_samples = 0 to silence this, or train on it alone",
            )
        unused = {"path": source.source != "file", "dataset": source.source == "file"}
        unused["num_samples"] = source.source != "builtin"
        for field, ignored in unused.items():
            if ignored and getattr(source, field) is not None:
                yield warning(f"{key}.{field}", f'has no effect with source = "{source.source}"', "remove it")
        if source.val_fraction is not None and not 0 <= source.val_fraction < 1:
            yield error(f"{key}.val_fraction", f"must be in [0, 1), got {source.val_fraction}")
        if source.val_path and (problem := _files_problem(f"{key}.val_path", source.val_path)) is not None:
            yield problem
        label = source.name or str(index)
        if not label.strip():
            yield error(f"{key}.name", "is empty", "name the source, or leave name out to use its index")
        elif label in labels:
            yield error(f"{key}.name", f"{label!r} also names {labels[label]}", "give every source its own name")
        labels[label] = key
    if data.sources and data.eval.source != "none" and data.eval.name in labels:
        yield error("data.eval.name", f"{data.eval.name!r} also names {labels[data.eval.name]}", "rename one")
    if data.sources:
        for field in _SINGLE_SOURCE_KEYS:
            if ctx.is_set(f"data.{field}"):
                yield warning(
                    f"data.{field}",
                    "has no effect with [[data.sources]]: each source names its own data",
                    "move it into the [[data.sources]] entries, or remove it",
                )
    if (data.sources or data.streaming) and ctx.is_set("data.group_by_length"):
        yield warning("data.group_by_length", "has no effect with [[data.sources]] or data.streaming", "remove it")


@rule("data.streaming")
def streaming(ctx: Context) -> Iterator[Problem]:
    """A stream has no length and reads files or hub datasets; its buffer and workers fit."""
    cfg = ctx.config
    data = cfg.data
    for path in ("data.shuffle_buffer_size", "data.prefetch_factor"):
        if _value(cfg, path) < 1:
            yield error(path, f"must be at least 1, got {_value(cfg, path)}")
    if data.num_workers < 0:
        yield error("data.num_workers", f"must not be negative, got {data.num_workers}", "0 reads in the trainer")
    if data.num_workers == 0 and ctx.is_set("data.prefetch_factor"):
        yield warning("data.prefetch_factor", "has no effect with data.num_workers = 0", "set data.num_workers")
    if not data.streaming:
        if ctx.is_set("data.shuffle_buffer_size"):
            yield warning(
                "data.shuffle_buffer_size",
                "has no effect because data.streaming = false (data read up front is shuffled whole)",
                "remove it, or set data.streaming = true",
            )
        return
    if cfg.train.steps is None:
        yield error(
            "data.streaming",
            "a stream's length is unknown until it is read, so train.epochs cannot be counted",
            "set train.steps",
        )
    kinds = [(f"data.sources.{i}.source", s.source) for i, s in enumerate(data.sources)] or [
        ("data.source", data.source)
    ]
    for key, kind in kinds:
        if kind == "builtin":
            yield error(
                key,
                "built-in datasets are generated in memory; data.streaming reads files or hub datasets",
                "use a file or hub source, or data.streaming = false",
            )
    fractions = [f"data.sources.{i}.val_fraction" for i, s in enumerate(data.sources) if s.val_fraction is not None]
    if ctx.is_set("data.val_fraction"):
        fractions.insert(0, "data.val_fraction")
    for key in fractions:
        yield warning(
            key,
            "has no effect with data.streaming: a stream cannot be split before it is read",
            "give a val_path per source, or a [data.eval] source",
        )


@rule("data.eval")
def eval_source(ctx: Context) -> Iterator[Problem]:
    """[data.eval] names the held-out data it reads."""
    spec = ctx.config.data.eval
    if spec.source == "none":
        for field in ("path", "dataset"):
            if getattr(spec, field) is not None:
                yield warning(f"data.eval.{field}", 'has no effect with data.eval.source = "none"', "set source")
        return
    if not spec.name.strip():
        yield error("data.eval.name", "is empty", 'name it, e.g. "eval"')
    if spec.source == "file":
        if not spec.path:
            yield error("data.eval.path", 'is required when data.eval.source = "file"')
        elif (problem := _files_problem("data.eval.path", spec.path)) is not None:
            yield problem
    elif not spec.dataset:
        yield error("data.eval.dataset", 'is required when data.eval.source = "hub"')
    else:
        yield warning("data.eval.dataset", f"hub dataset {spec.dataset!r} cannot be verified offline")


@rule("data.val_exact_match")
def exact_match_has_answers(ctx: Context) -> Iterator[Problem]:
    """Greedy exact match needs one reference answer per held-out row, from one source."""
    data = ctx.config.data
    if not data.val_exact_match or data.source == "builtin":
        return
    from ditty.data.formats import format_of

    if not format_of(data).answers:
        yield warning(
            "data.val_exact_match",
            f'has no effect: data.format = "{data.format}" holds no reference answer per row',
            'score rows with answers: "prompt_completion", "chat" (its last assistant turn), "preference" '
            '(the chosen answer) or "prompt" (an `answer` column); or remove it',
        )
    elif data.sources:
        yield warning(
            "data.val_exact_match",
            "has no effect with [[data.sources]]: each source is held out on its own, by val_loss/NAME",
            "remove it, or train on one source",
        )


@rule("data.chat_keys")
def chat_keys(ctx: Context) -> Iterator[Problem]:
    """data.chat_keys names only message keys and roles, as text."""
    from ditty.data.chat_layouts import CHAT_KEY_NAMES, chat_keys_problems

    for problem in chat_keys_problems(ctx.config.data.chat_keys or {}):
        yield error("data.chat_keys", problem, f"use {{{', '.join(f'{name} = ...' for name in CHAT_KEY_NAMES)}}}")


@rule("data.template")
def template_columns(ctx: Context) -> Iterator[Problem]:
    """A prompt template reads its own columns from files or hub data."""
    data = ctx.config.data
    if data.template is None or data.format != "prompt_completion":
        return
    if data.source == "builtin" and not data.sources:
        yield error(
            "data.template",
            f"reads instruction rows from files or hub data, and the built-in {data.name!r} dataset has none",
            'set data.source = "file" and data.path, or remove data.template',
        )
    for key in ("data.prompt_column", "data.completion_column"):
        if ctx.is_set(key):
            yield warning(key, f"has no effect with data.template = {data.template!r}", "remove it")


@rule("tokenizer.chat_template")
def chat_template(ctx: Context) -> Iterator[Problem]:
    """tokenizer.chat_template names a known template or a file that exists."""
    from ditty.data.chat_templates import CHAT_TEMPLATES, chat_template_problem

    choice = ctx.config.tokenizer.chat_template
    if choice and (problem := chat_template_problem(choice)) is not None:
        yield error(
            "tokenizer.chat_template", problem, f"use {' or '.join(map(repr, CHAT_TEMPLATES))}, or a .jinja file's path"
        )


@rule("eval.harness")
def harness(ctx: Context) -> Iterator[Problem]:
    """lm-evaluation-harness tasks need the extra, a Hugging Face model, and a whole model to run on."""
    cfg = ctx.config
    spec = cfg.eval
    if not spec.harness_tasks:
        options = ("harness_every", "harness_include_path", "harness_limit", "harness_num_fewshot")
        for path in (f"eval.{name}" for name in options):
            if ctx.is_set(path):
                yield warning(path, "has no effect because eval.harness_tasks is empty", "name the tasks to run")
        return
    if importlib.util.find_spec("lm_eval") is None:
        yield error(
            "eval.harness_tasks",
            "lm-evaluation-harness is not installed",
            "pip install 'ditty[eval]' (or pip install lm-eval)",
        )
    if cfg.model.factory:
        yield error("eval.harness_tasks", "the harness loads Hugging Face models; model.factory builds a custom one")
    if spec.harness_every < 0:
        yield error("eval.harness_every", f"must not be negative, got {spec.harness_every}")
    if spec.harness_every > 0 and cfg.parallel.kind in _SHARDED_OR_ENGINE:
        yield error(
            "eval.harness_every",
            f'with parallel.kind = "{cfg.parallel.kind}" no rank holds the whole model during training',
            "set eval.harness_every = 0: the tasks then run on the final model",
        )
    if spec.harness_include_path and not os.path.isdir(os.path.expanduser(spec.harness_include_path)):
        yield error("eval.harness_include_path", f"{spec.harness_include_path} is not a directory")
    for path, low in (("eval.harness_limit", 1), ("eval.harness_num_fewshot", 0), ("eval.harness_batch_size", 1)):
        value = _value(cfg, path)
        if value is not None and value < low:
            yield error(path, f"must be at least {low}, got {value}")


def _value(config, path: str):
    for part in path.split("."):
        config = getattr(config, part)
    return config
