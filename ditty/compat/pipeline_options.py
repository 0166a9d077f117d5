"""The Pipeline's keyword arguments as a Trainer.Config, and the problems some of them raise.

`build_config` maps every keyword onto a recipe section (the table in
docs/python-api/coming-from-ditty.md lists the original Ditty's keywords and defaults);
`keyword_problems` finds what cannot be honoured or has no effect, and `slot_problems` objects
of the wrong kind, before anything is built. The original's keywords that ditty does not implement
are refused with what to use instead (`REFUSED`), and an unknown keyword gets the closest known
one: never a TypeError.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import replace
from typing import Any, Optional

from ditty.config.errors import Problem, RecipeError

REFUSED = {
    "validation_callbacks": "pass val_dataset= (val_loss every eval_every steps) and task= "
    "(ditty.data.generic.GenericTask: your own metrics, also every eval_every steps)",
}
"""The original Ditty's Pipeline keywords with no ditty equivalent -> what to use instead."""

OPTIM_BACKENDS = {"torchao": "torchao", "bnb": "bnb", "torch": "torch", "muon": "torch", "adafactor": "torch"}
"""optim_backend values ditty builds ("muon" and "adafactor" are optimizer kinds); the original's
"adamw_fp8" is refused."""

MUON_KEYWORDS = {
    "muon_lr": "muon_lr",
    "muon_weight_decay": "muon_weight_decay",
    "muon_momentum": "muon_momentum",
    "muon_ns_steps": "ns_steps",
    "muon_adjust_lr_fn": "adjust_lr_fn",
}
"""The original's muon_* keywords -> [optimizer] fields (torch.optim.Muon's names)."""

NOT_YET = "not supported yet"


def unknown_keyword_problems(unknown: dict[str, Any], known: list[str]) -> list[Problem]:
    problems = []
    for name in unknown:
        if name in REFUSED:
            problems.append(Problem(name, "is an option of the original Ditty that ditty does not have", REFUSED[name]))
            continue
        close = difflib.get_close_matches(name, known, n=1)
        problems.append(
            Problem(name, "is not a Pipeline keyword", f"did you mean {close[0]}?" if close else "see help(Pipeline)")
        )
    return problems


def keyword_problems(s: dict[str, Any], data: Any, factory: Any, val: Any = None) -> list[Problem]:
    """Keywords that cannot be honoured (errors) or do nothing here (warnings)."""
    import torch

    out: list[Problem] = []

    def error(key: str, message: str, fix: str) -> None:
        out.append(Problem(key, message, fix))

    def warning(key: str, message: str, fix: str = "") -> None:
        out.append(Problem(key, message, fix, severity="warning"))

    loader = isinstance(data, torch.utils.data.DataLoader)
    backend = s["optim_backend"]
    if backend not in OPTIM_BACKENDS:
        error(
            "optim_backend",
            f"{backend!r} is not built in (ditty builds AdamW: torch, or 8-bit with torchao or bnb; muon; adafactor)",
            "pass optimizer=<your torch optimizer instance>, e.g. torch.optim.Adafactor(model.parameters())",
        )
    if backend == "muon" and s["use_8bit_optim"]:
        error("use_8bit_optim", "there is no 8-bit Muon", 'leave use_8bit_optim=False with optim_backend="muon"')
    if backend == "muon" and not s["muon_nesterov"]:
        error("muon_nesterov", "ditty's Muon always uses Nesterov momentum", "leave muon_nesterov=True")
    if backend != "muon":
        for name in [*MUON_KEYWORDS, "muon_nesterov"]:
            if s[name] != MUON_DEFAULTS[name]:
                warning(name, 'has no effect without optim_backend="muon"')
    if s["push_to_hub"] and not s["output_hub_repo"]:
        error("push_to_hub", "push_to_hub=True needs output_hub_repo", 'pass output_hub_repo="you/model-name"')
    if s["hf_hub_token"] and not s["push_to_hub"]:
        warning("hf_hub_token", "has no effect without push_to_hub=True")
    if not s["save_final_checkpoint"]:
        error(
            "save_final_checkpoint",
            "ditty always saves the last step (final/ and a checkpoint to resume from)",
            "leave it True; to keep less, lower checkpoint.keep_last (extra_config)",
        )
    if not s["load_optimizer_checkpoint"]:
        error(
            "load_optimizer_checkpoint",
            "a resumed run always restores the optimizer with the model (resume is exact)",
            "to start a fresh optimizer from trained weights: ModelFactory.from_checkpoint(old_run + '/final', "
            "MyModel) in a new output_dir",
        )
    if not s["shuffle_each_epoch"]:
        error(
            "shuffle_each_epoch",
            f"{NOT_YET}: ditty reads a dataset in a seeded permutation per epoch",
            "for a fixed order pass a DataLoader with shuffle=False as dataset= (used batch by batch)",
        )
    from ditty.data.iterable import is_iterable_only

    iterable = data is not None and is_iterable_only(data)
    iterable_loader = loader and isinstance(data.dataset, torch.utils.data.IterableDataset)
    if (iterable or iterable_loader) and s["steps"] is None and s["max_steps"] is None:
        error("max_steps", "an iterable (streaming) dataset has no length: epochs cannot be counted", "pass max_steps=")
    if s["shuffle_buffer_size"] is not None and not iterable:
        where = "the DataLoader passed as dataset= keeps its own order" if loader else "this dataset is map-style"
        warning("shuffle_buffer_size", f"has no effect: it applies to iterable datasets, and {where}")
    if s["shuffle_buffer_size"] is not None and s["shuffle_buffer_size"] < 1:
        error("shuffle_buffer_size", f"must be at least 1, got {s['shuffle_buffer_size']}", "1 keeps the order")
    if val is not None and is_iterable_only(val):
        error("val_dataset", "an iterable validation set cannot be evaluated whole", "pass a list or map-style one")
    if s["num_workers"] and loader:
        warning("num_workers", "has no effect: the DataLoader passed as dataset= has its own num_workers")
    elif s["num_workers"] and iterable:
        warning("num_workers", "has no effect: an iterable dataset is read in the training process")
    if s["num_workers"] is not None and s["num_workers"] < 0:
        error("num_workers", f"must not be negative, got {s['num_workers']}", "0 loads in the training process")
    optimizer = s["optimizer"]
    if optimizer is not None:
        if s["use_8bit_optim"]:
            warning("use_8bit_optim", "has no effect: optimizer= is used as given")
        if getattr(getattr(factory, "fsdp_config", None), "enabled", False):
            error(
                "optimizer",
                "an optimizer built before the run cannot hold FSDP's sharded parameters",
                "leave optimizer= out (lr=, weight_decay=, use_8bit_optim= configure ditty's), or disable FSDP",
            )
    return out


def slot_problems(pipeline: Any) -> list[Problem]:
    """The Pipeline's object slots hold the kinds of objects the Trainer calls: processors,
    a LossCalculator, a ModelFactory, a tokenizer factory and a metrics logger with their methods."""
    from ditty.compat.model_factory import ModelFactory
    from ditty.stages.loss import LossCalculator
    from ditty.stages.processors import PostProcessor, PreProcessor

    problems = []
    for slot, items, base in (
        ("preprocessors", pipeline.preprocessors, PreProcessor),
        ("postprocessors", pipeline.postprocessors, PostProcessor),
    ):
        for index, item in enumerate(items):
            if not isinstance(item, base):
                problems.append(
                    Problem(
                        f"{slot}[{index}]",
                        f"{type(item).__name__} is not a {base.__name__}",
                        fix=f"subclass ditty.processors.{base.__name__} and implement process()",
                    )
                )
    for key, value, kind, called, fix in (
        (
            "loss_calculator",
            pipeline.loss_calculator,
            LossCalculator,
            "LossCalculator",
            "subclass ditty.loss.LossCalculator and implement compute()",
        ),
        (
            "model_factory",
            pipeline.model_factory,
            ModelFactory,
            "ModelFactory or nn.Module",
            "ModelFactory.from_instance(model) or ModelFactory.from_checkpoint(path, cls)",
        ),
    ):
        if value is not None and not isinstance(value, kind):
            problems.append(Problem(key, f"{type(value).__name__} is not a {called}", fix=fix))
    for key, value, method in (
        ("tokenizer_factory", pipeline.tokenizer_factory, "build"),
        ("metrics_logger", pipeline.metrics_logger, "log_scalar"),
    ):
        if value is not None and not callable(getattr(value, method, None)):
            problems.append(Problem(key, f"{type(value).__name__} has no {method}()", fix=f"see ditty.{key}"))
    return problems


def build_config(s: dict[str, Any], factory: Any, data: Any, world_size: int, model_task: Optional[str] = None) -> Any:
    """The Trainer.Config the keywords `s` describe (grad_accum: global = micro x grad_accum x data-parallel size).
    `model_task` sets [model] task and the task's first data format; extra_config may refine both."""
    import torch

    from ditty.config import sections as S
    from ditty.train import Trainer

    micro = s["batch_size"]
    if isinstance(data, torch.utils.data.DataLoader) and data.batch_size:
        micro = data.batch_size  # each of the loader's batches is one micro-batch
    from ditty.data.iterable import is_iterable_only

    loader_or_stream = isinstance(data, torch.utils.data.DataLoader) or is_iterable_only(data)
    workers = 0 if loader_or_stream else max(0, s["num_workers"] or 0)
    precision, fp8 = _precision(s)
    lr = s["lr"] * (world_size if s["scale_lr_by_world_size"] else 1)
    backend = OPTIM_BACKENDS.get(s["optim_backend"], "torchao")
    config = Trainer.Config(
        run=S.RunConfig(
            name=s["name"],
            output_dir=s["output_dir"],
            seed=0 if s["seed"] is None else s["seed"],
            device=s["device"],
            num_threads=s["num_threads"],
        ),
        train=S.TrainConfig(
            steps=_steps(s, data, micro * s["grad_accum"] * world_size),
            epochs=float(s["epochs"]),
            micro_batch_size=micro,
            global_batch_size=micro * s["grad_accum"] * world_size,
            max_grad_norm=s["max_grad_norm"],
            precision=precision,
            log_every=s["log_every"],
            eval_every=s["validation_every"] if s["validation_every"] is not None else s["eval_every"],
            activation_checkpointing="full" if s["gradient_checkpointing"] else "none",
        ),
        optimizer=_optimizer(s, backend, lr),
        scheduler=S.SchedulerConfig(kind=s["lr_schedule"], warmup_steps=s["warmup_steps"]),
        data=S.DataConfig(num_workers=workers, shuffle_buffer_size=max(1, s["shuffle_buffer_size"] or 1000)),
        parallel=S.ParallelConfig(kind="ddp") if world_size > 1 else S.ParallelConfig(),
        fp8=fp8,
        checkpoint=S.CheckpointConfig(
            every=s["checkpoint_every"],
            resume="auto" if s["load_checkpoint"] else "never",
            # The original API's load_checkpoint=True continues a run, a finished one too (more steps).
            overwrite_finished=s["load_checkpoint"],
            final_format="merged" if s["merge_adapters"] else "auto",
        ),
        hub=S.HubConfig(
            repo_id=s["output_hub_repo"], private=s["private_repo"], push="end" if s["push_to_hub"] else "never"
        ),
        logging=S.LoggingConfig(progress=s["progress"]),
        pipeline=S.PipelineConfig(check_tensors=s["check_contracts"]),
    )
    if model_task is not None:
        from ditty.models.tasks import model_task as task_named

        task = task_named(model_task)
        config = replace(
            config, model=replace(config.model, task=task.name), data=replace(config.data, format=task.data_formats[0])
        )
    overrides = factory.recipe_overrides() if hasattr(factory, "recipe_overrides") else {}
    for section, values in [*overrides.items(), *s["extra_config"].items()]:
        config = _replace_section(config, section, values)
    return config


def _precision(s: dict[str, Any]) -> tuple[str, Any]:
    from ditty.config import sections as S

    precision = "bf16" if (s["bf16"] or s["use_bfloat16"]) else "fp16" if s["fp16"] else "fp32"
    accel = dict(s["accelerator_kwargs"])
    mixed = accel.pop("mixed_precision", None) or s["accelerator_mixed_precision"]
    if accel:
        raise RecipeError.single(
            f"accelerator_kwargs {sorted(accel)} are not supported (only mixed_precision)",
            key="accelerator_kwargs",
            fix="use the Pipeline keyword or extra_config for that setting",
        )
    if mixed == "fp8":
        return precision, S.Fp8Config(enabled=True, backend="te")
    if mixed in ("bf16", "fp16"):
        return mixed, S.Fp8Config()
    if mixed not in (None, "no", "fp32"):
        raise RecipeError.single(
            f"mixed_precision {mixed!r} is not one of fp8, bf16, fp16, no", key="accelerator_kwargs"
        )
    return precision, S.Fp8Config()


def _steps(s: dict[str, Any], data: Any, global_batch: int) -> Optional[int]:
    """`steps`, else `max_steps` capped by `epochs` (the original stopped at whichever came first)."""
    if s["steps"] is not None or s["max_steps"] is None:
        return s["steps"]
    samples = _length(data)
    if samples is None:
        return s["max_steps"]
    return max(1, min(s["max_steps"], math.ceil(float(s["epochs"]) * samples / global_batch)))


def _length(data: Any) -> Optional[int]:
    data = getattr(data, "dataset", data)  # a DataLoader counts its dataset's samples
    try:
        return len(data)
    except TypeError:
        return None


MUON_DEFAULTS = {
    "muon_lr": None,
    "muon_weight_decay": None,
    "muon_momentum": 0.95,
    "muon_nesterov": True,
    "muon_ns_steps": 5,
    "muon_adjust_lr_fn": None,
}
"""The Pipeline's muon_* defaults (None: the [optimizer] field's default)."""


def _optimizer(s: dict[str, Any], backend: str, lr: float) -> Any:
    """[optimizer] from optim_backend, use_8bit_optim and the muon_* keywords."""
    from ditty.config import sections as S

    if s["optim_backend"] in ("muon", "adafactor"):
        muon = {}
        if s["optim_backend"] == "muon":
            muon = {field: s[name] for name, field in MUON_KEYWORDS.items() if s[name] is not None}
        return S.OptimizerConfig(kind=s["optim_backend"], lr=lr, weight_decay=s["weight_decay"], **muon)
    eight_bit = s["use_8bit_optim"] and backend != "torch"
    return S.OptimizerConfig(
        kind="adamw8bit" if eight_bit else "adamw",
        backend=backend if eight_bit else "default",
        lr=lr,
        weight_decay=s["weight_decay"],
    )


def _replace_section(config: Any, section: str, values: dict[str, Any]) -> Any:
    if not hasattr(config, section):
        raise RecipeError.single(f"extra_config: no recipe section [{section}]", key=f"extra_config.{section}")
    try:
        return replace(config, **{section: replace(getattr(config, section), **values)})
    except TypeError as exc:
        raise RecipeError.single(f"extra_config[{section!r}]: {exc}", key=f"extra_config.{section}") from None
