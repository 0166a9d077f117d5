"""Running the rules over a recipe and deriving the plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ditty.config.aliases import moved_key_message
from ditty.config.coerce import type_problems
from ditty.config.errors import warning
from ditty.config.loader import LoadedRecipe, from_config
from ditty.parallel.mesh import mesh_shape
from ditty.recipe import (  # noqa: F401  (register their rules after the core ones)
    data_rules,
    loss_rules,
    mtp_rules,
    optimizer_rules,
    pipeline_rules,
    position_rules,
    resume_rules,
    scale_rules,
    start_rules,
    task_rules,
)
from ditty.recipe.compiled import Plan
from ditty.recipe.first_stage import first_stage_command
from ditty.recipe.objective_rules import objective_problems
from ditty.recipe.pipeline_rules import IMAGE_BUILTINS
from ditty.recipe.rules import ALL_RULES, Context


def compile_config(config: Any, *, world_size: int = 1, replaced: tuple[str, ...] = ()) -> Plan:
    """`compile_recipe` for a config built in code (a `Trainer(config)`, the Python API): every value
    counts as a default, so no line numbers and no "set but ignored" warnings."""
    return compile_recipe(from_config(config), world_size=world_size, replaced=replaced)


def compile_recipe(loaded: LoadedRecipe, world_size: int = 1, *, replaced: tuple[str, ...] = ()) -> Plan:
    """Check everything at once; a rule that raises is a bug in ditty, so it propagates.

    `replaced`: sections ("model.", "data.", ...) that Python objects stand in for (the Python API):
    their problems describe defaults nobody chose, so they are left out."""
    config = loaded.config
    plan = Plan(config=config, world_size=world_size, source=loaded.source)
    # A config built in code may hold a value of the wrong type, which every rule below would trip
    # over: those are the only problems then. (A TOML recipe was held to the types as it loaded.)
    mistyped = [p for p in type_problems(config) if not (replaced and p.key.startswith(replaced))]
    if mistyped:
        plan.problems = [_locate(replace(p, rule="value.types"), loaded) for p in mistyped]
        return plan
    context = Context(config=config, provenance=loaded.provenance, world_size=world_size)
    plan.data_parallel_size = context.data_parallel_size
    plan.accumulation_steps = config.train.accumulation_steps(context.data_parallel_size)
    plan.steps = _steps(config)
    plan.tokens_per_step = config.train.global_batch_size * config.data.max_seq_len
    plan.builds = _builds(config)
    shape = mesh_shape(config.parallel, world_size)
    if not isinstance(shape, list) and world_size > 1:
        plan.builds.insert(0, ("mesh", shape.describe()))
    found = [replace(problem, rule=problem.rule or rule.id) for rule in ALL_RULES for problem in rule.check(context)]
    for problem in found + list(objective_problems(context)):  # the objective table's rows last
        if replaced and problem.key.startswith(replaced):
            continue
        plan.problems.append(_locate(problem, loaded))
    plan.problems += list(moved_key_warnings(loaded))  # located already: at the old key's line, or its flag
    plan.problems = [_with_first_stage(problem, loaded) for problem in plan.problems]
    return plan


def moved_key_warnings(loaded: LoadedRecipe):
    """A warning for each key written by its old name (ditty.config.aliases), at the line it was written
    on, or naming the flag."""
    for new, old in loaded.moved.items():
        message, fix = moved_key_message(old.removeprefix("--"), new)
        problem = warning(old.removeprefix("--"), message, fix)
        if old.startswith("--"):
            problem = replace(problem, message=f"{message} (set by {old})")
        else:
            problem = replace(problem, line=loaded.lines.line_of(new))
        yield replace(problem, rule="config.moved-key")


def _with_first_stage(problem, loaded: LoadedRecipe):
    """A missing model directory (model.path, distill.teacher, ...) that is a first stage's final/: the
    fix names the command that makes it (ditty.recipe.first_stage), read from the recipe's header comment."""
    if "does not exist" not in problem.message or not loaded.source:
        return problem
    value = _value_at(loaded.config, problem.key)
    if not isinstance(value, str):
        return problem
    try:
        text = Path(loaded.source).read_text(encoding="utf-8")
    except OSError:
        return problem
    command = first_stage_command(text, value)
    if command is None:
        return problem
    return replace(problem, fix=f"it is the final model of a first stage: make it with `{command}`, then this recipe")


def _value_at(config, key: str):
    """The recipe's value at a dotted key, or None where the key names no field."""
    value = config
    for name in key.split("."):
        value = getattr(value, name, None)
    return value


def _locate(problem, loaded: LoadedRecipe):
    """Point a problem at its TOML line, or say it came from a flag (by the name it was given: a key
    that moved is named as the flag wrote it)."""
    field_key = problem.key.split("[", 1)[0]  # "rl.tools[0]": an entry of the list a flag set
    if loaded.provenance.get(field_key) == "flag":
        written = loaded.moved.get(field_key, f"--{field_key}")
        return replace(problem, line=None, message=f"{problem.message} (set by {written})")
    return replace(problem, line=problem.line or loaded.lines.line_of(problem.key))


def _steps(config) -> int | None:
    if config.train.steps is not None:
        return config.train.steps
    data = config.data
    if data.source == "builtin" and not data.sources and config.train.global_batch_size > 0:
        train_samples = int(data.num_samples * (1 - data.val_fraction))
        return max(1, int(train_samples * config.train.epochs) // config.train.global_batch_size)
    return None


def _optimizer_text(opt) -> str:
    if opt.kind == "muon":
        return f"muon: Muon lr {opt.muon_lr:g} on the hidden matrices, AdamW lr {opt.lr:g} on the rest"
    return f"{opt.kind} ({opt.backend}), lr {opt.lr:g}"


def _packed(config) -> str:
    if config.model.factory:
        return "packed"
    text = data_rules.packed_attention_text(config)
    return f"packed ({text})" if text else "packed"


def _builds(config) -> list[tuple[str, str]]:
    model = config.model
    if model.factory:
        model_text = f"custom model from {model.factory}"
    elif model.resolved_init == "random":
        model_text = f"random {model.architecture or 'architecture of ' + str(model.path)}" + (
            f" with {model.config}" if model.config else ""
        )
    else:
        model_text = f"pretrained {model.path}"
    if model.task != "causal-lm":
        model_text += f" for {model.task}"
    data = config.data
    source = {"builtin": f"built-in {data.name!r}", "hub": f"hub dataset {data.name!r}", "file": f"file {data.path}"}[
        data.source
    ]
    images = data.source == "builtin" and data.name in IMAGE_BUILTINS and not data.sources
    if data.sources:
        total = sum(s.weight for s in data.sources) or 1.0
        source = "mix of " + ", ".join(
            f"{s.name or i} {s.weight / total:.0%} ({s.path or s.dataset})" for i, s in enumerate(data.sources)
        )
    if data.streaming:
        source += (
            f", streamed by world size x {max(1, data.num_workers)} reader(s) (a resume needs the same world size"
            " and data.num_workers)"
        )
    rows = [
        ("model", f"{model_text} ({model.dtype})"),
        ("tokenizer", config.tokenizer.source(model) or ("none (non-text data)" if images else "built-in byte-level")),
        (
            "data",
            f"{source} images, samples collated as tensors"
            if images
            else f"{source}, {data.format}, max_seq_len {data.max_seq_len}, "
            + (_packed(config) if data.packing else "padded"),
        ),
        ("optimizer", _optimizer_text(config.optimizer)),
        ("scheduler", f"{config.scheduler.kind}, warmup {config.scheduler.warmup_steps}"),
    ]
    if config.peft.kind != "none":
        rows.append(
            (
                "adapter",
                f"{config.peft.kind} r={config.peft.r} alpha={config.peft.alpha:g} on {config.peft.target_modules}",
            )
        )
    if config.quant.kind != "none":
        rows.append(("quantization", config.quant.kind))
    if config.fp8.enabled:
        rows.append(("fp8", config.fp8.backend + (" (emulated)" if config.fp8.emulate else "")))
    if config.train.compile:
        rows.append(("compile", f"torch.compile per {config.train.compile_scope}"))
    train = config.train
    if train.loss_chunks > 0 and not config.pipeline.loss:
        rows.append(("loss", f"cross-entropy from hidden states in {train.loss_chunks} chunks ({train.loss_backend})"))
    rows += _objective_rows(config)
    if config.mtp.depth > 0:
        m = config.mtp
        rows.append(("mtp", f"{m.depth} MTP head(s), loss weight {m.weight:g}, decay {m.decay:g}"))
    rows.append(("output", config.run.output_dir))
    return rows


def _objective_rows(config) -> list[tuple[str, str]]:
    from ditty.objectives.table import OBJECTIVES, objective_name

    return OBJECTIVES[objective_name(config)].describe(config) if objective_name(config) in OBJECTIVES else []
