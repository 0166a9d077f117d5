"""How the Trainer builds each component from its config section.

`Trainer` inherits these `build_*` methods, so a subclass replaces any one of them (a custom
tokenizer, a different data mode) without touching the loop. Each returns what it builds and takes
what an earlier step built as an argument; the only state they read is what `Trainer.__init__` sets
first (`config`, `components`, `plan`, `runtime`). Imports of the heavy builders are deferred to the
call.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ditty._utils.dist import is_main_process
from ditty.models.recipe_model import base_model_for, converters_for

log = logging.getLogger("ditty.train")


@dataclass
class BuiltModel:
    """What `build_model` hands on: the model, its converters (whose hooks run after each optimizer
    step), and the weights a meta-built model still needs after sharding (ditty.models.meta)."""

    model: torch.nn.Module
    converters: list
    pending: Any = None


class Builders:
    """Mixin of `build_*` methods (see the module doc)."""

    def build_plan(self):
        """The recipe compiler on this config (the CLI and `Pipeline` pass their compiled plan instead):
        every error at once as a RecipeError, warnings logged."""
        from ditty._utils.dist import world_size
        from ditty.recipe import compile_config

        plan = compile_config(self.config, world_size=world_size(), replaced=self.components.replaced_sections())
        if is_main_process():
            for problem in plan.warnings:
                log.warning("%s", problem.format(plan.source))
        plan.raise_for_errors()
        return plan

    def build_runtime(self):
        from ditty.parallel.runtime import start_runtime

        return start_runtime(self.config)

    def build_engine(self):
        from ditty.train.engines import build_engine

        return build_engine(self.config, self.runtime)

    def build_tokenizer(self):
        """[tokenizer]; or the Python API's tokenizer, else the one saved beside a given transformers
        model's checkpoint (either is saved into final/ with the model)."""
        from ditty.train.data_modes import takes_rows

        components = self.components
        if components.tokenizer is not None:
            return components.tokenizer
        if components.model is not None and not self.config.tokenizer.source(self.config.model):
            from ditty.data.tokenizer import tokenizer_beside

            found = tokenizer_beside(components.model)
            if found is not None:
                return found
        non_text = components.has_data and not takes_rows(self.config, components)
        return tokenizer_for(self.config, non_text_data=non_text)

    def build_model(self, tokenizer: Any, labels: Any = None) -> BuiltModel:
        """The model as `[model]` and `[quant]` describe it (or the Python API's instance), then the
        converters (adapters, float8) in order. fsdp/hsdp on several processes build a local
        pretrained checkpoint on the meta device when they can (ditty.models.meta). `labels`: the data's
        label set, for the tasks that classify (it sizes the head and names the classes)."""
        from ditty.models.converters import apply_converters

        model, pending = base_model_for(
            self.config, tokenizer, self.runtime.device, given=self.components.model, labels=labels
        )
        converters = self.build_converters()
        model = apply_converters(model, converters)
        # A Python API loss with parameters (UncertaintyWeightedLoss) trains with the model: after the
        # converters (PEFT would freeze it), before parallelization and the optimizer.
        from ditty.stages.loss_parameters import attach_loss_parameters

        model = attach_loss_parameters(model, self.components.loss, parallel_kind=self.config.parallel.kind)
        from ditty.models.adapters import trainable_parameter_counts

        trainable, total = trainable_parameter_counts(model)
        if is_main_process():
            print(f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.2f}%)")
        if self.runtime.device.type == "cpu":  # a rule; a long run times 1 thread against all (ditty.parallel.threads)
            from ditty.metrics.peak import device_peak_flops
            from ditty.parallel.threads import apply_cpu_threads

            plan = self.plan
            apply_cpu_threads(
                self.config,
                total,
                announce=is_main_process(),
                model=model,
                planned_steps=plan.steps,
                accumulation=plan.accumulation_steps or 1,
            )
            # mfu's CPU peak is measured once per process (~0.3 s of products); here, not in the first logged step
            device_peak_flops(self.runtime.device, override_tflops=self.config.logging.peak_tflops)
        return BuiltModel(model, converters, pending)

    def build_converters(self) -> list:
        """The Python API's ModelTransforms first, then the recipe's converters."""
        return list(self.components.converters or []) + converters_for(self.config)

    def build_model_ready(self, built: BuiltModel) -> torch.nn.Module:
        """Activation checkpointing and compile (in torchtitan's order, before wrapping), then the
        engine's wrapping (DDP, FSDP2 shards, a meta-built model's weights)."""
        from ditty.parallel.compile_report import CompileWatch
        from ditty.parallel.speed import apply_speedups, compiled_modules

        model = apply_speedups(built.model, self.config)
        # Dynamo compiles at the first forward; the watch reads what it made after the first step.
        self.compile_watch = CompileWatch(len(compiled_modules(model))) if self.config.train.compile else None
        return self.engine.wrap(model, built.pending)

    def build_data(self, tokenizer: Any):
        """The data mode: the recipe's [data], or the Python API's dataset/dataloader."""
        from ditty.train.data_modes import build_data_mode

        return build_data_mode(self.config, self.runtime, tokenizer, self.components)

    def build_total_steps(self, data: Any) -> int:
        """`train.steps`, or enough steps for `train.epochs` passes over the training samples."""
        t = self.config.train
        if t.steps is not None:
            return t.steps
        samples = data.train_samples()
        if 0 < samples < t.global_batch_size and is_main_process():
            log.warning(
                "the global batch (%d samples) is larger than the training data (%d samples): every step repeats "
                "samples, so one step is already %.1f epochs; lower train.global_batch_size or add data",
                t.global_batch_size,
                samples,
                t.global_batch_size / samples,
            )
        return max(1, math.ceil((t.epochs or 1.0) * samples / t.global_batch_size))

    def build_optimizer(self, model: torch.nn.Module, converters: list):
        """`[optimizer]` over the trainable parameters; the converters' post-step hooks (float8's scale
        precompute under FSDP) are registered on it, so they run after every real optimizer step."""
        from ditty.models.converters import post_optimizer_hooks, run_post_optimizer_hooks
        from ditty.optim import build_optimizer

        if self.components.optimizer is not None:  # the Python API's optimizer=, checked against the trained parameters
            from ditty.optim.given import check_given_optimizer

            optimizer = check_given_optimizer(self.components.optimizer, model)
        else:
            optimizer = build_optimizer(self.config.optimizer, model)
        if post_optimizer_hooks(converters):
            optimizer.register_step_post_hook(lambda *_: run_post_optimizer_hooks(model, converters))
        return optimizer

    def build_scheduler(self, optimizer: Any, total_steps: int):
        from ditty.optim import build_scheduler

        return build_scheduler(self.config.scheduler, optimizer, total_steps)

    def build_precision(self):
        from ditty.parallel.precision import build_precision

        return self.engine.adapt_precision(build_precision(self.config.train.precision, self.runtime.device))

    def build_objective(self):
        """The parts of the objective the recipe trains (its row of ditty.objectives.table: the loss, and
        where it has them its own stream, evaluation and reference). A loss the recipe or the Python API
        names ([[pipeline.loss]], loss_calculator=) takes the place of a row's that allows it."""
        from ditty.config.errors import RecipeError
        from ditty.objectives.parts import ObjectiveParts
        from ditty.objectives.table import objective_for
        from ditty.train.pipeline import build_loss

        row = objective_for(self.config)
        given = self.components.loss if self.components.loss is not None else build_loss(self.config.pipeline)
        if given is None:
            from ditty.models.mtp.loss import with_mtp

            parts = row.build(self.run)
            parts.loss = with_mtp(parts.loss, self.config.mtp, self.config.train)  # [mtp]: the heads' loss beside it
            return parts
        if not row.given_loss:
            raise RecipeError.single(
                f'the objective "{row.name}" brings its own loss, and {type(given).__name__} was given',
                key="pipeline.loss",
                fix="leave the loss out (the objective's section tunes its loss), or train another objective",
            )
        return ObjectiveParts(loss=given)

    def build_stream(self, data: Any, objective: Any):
        """The step's micro-batches: the objective's own (rollouts), else the data mode's global order."""
        return objective.stream if objective.stream is not None else data.stream(self.plan.accumulation_steps)

    def build_pipeline(self, objective: Any):
        """[pipeline]'s processors from the recipe (the Python API's instances replace them) around the
        objective's loss."""
        from ditty.train.pipeline import StageChain, build_processors

        components = self.components
        pre, post = build_processors(self.config.pipeline)
        return StageChain(
            components.preprocessors if components.preprocessors is not None else pre,
            components.postprocessors if components.postprocessors is not None else post,
            objective.loss,
        )

    def build_checkpointer(self):
        from ditty.train.checkpointing import Checkpointer

        return Checkpointer(self.config, self.engine, self.resume)

    def build_run_dir(self, model: torch.nn.Module, total_steps: int) -> str:
        """Create the run directory and write recipe.toml and env.json (rank 0); a directory that
        cannot take them (a full disk, a read-only mount) is a RecipeError naming it."""
        from ditty.config.errors import RecipeError

        run_dir = self.config.run.output_dir
        if is_main_process():
            try:
                self._write_run_files(run_dir, model, total_steps)
            except OSError as error:
                raise RecipeError.single(
                    f"cannot write into the run directory {run_dir}: {error.strerror or error} "
                    f"({error.filename or run_dir}); no file there was left half-written",
                    key="run.output_dir",
                    fix="free space on that filesystem (`df -h`), or choose a run.output_dir that is writable",
                ) from None
        return run_dir

    def _write_run_files(self, run_dir: str, model: torch.nn.Module, total_steps: int) -> None:
        from ditty._utils.run_dir import environment, write_env
        from ditty.models.adapters import trainable_parameter_counts
        from ditty.train.final import write_recipe

        os.makedirs(run_dir, exist_ok=True)
        info = environment(
            trainable_parameter_counts(model),
            world_size=self.runtime.world_size,
            seed=self.config.run.seed,
            device=self.runtime.device,
            extra={
                "grad_accum": self.plan.accumulation_steps,
                "total_steps": total_steps,
                "run_id": self.resume.run_id,  # ditty.checkpoint.lineage
            },
        )
        write_env(run_dir, info)  # first: it marks the directory as a ditty run
        write_recipe(run_dir, self.config, self.trainer_ref())
        if self.components.given():
            from ditty.train.components import annotate_recipe

            annotate_recipe(run_dir, self.components)  # says the file alone cannot re-run this

    def build_logger(self, resuming: bool):
        """metrics.jsonl and friends; a resumed run appends after the records up to its checkpoint."""
        from ditty.metrics import build_logger

        if resuming:
            from ditty.metrics.logger import truncate_metrics

            truncate_metrics(self.config.run.output_dir, self.resume.step)
        cfg = self.config
        logger = build_logger(cfg.logging, cfg.run.output_dir, run_name=cfg.run.name, append=resuming)
        if self.components.metrics_logger is not None:  # the Python API's metrics_logger=
            from ditty.metrics.user_logger import attach_user_logger

            attach_user_logger(logger, self.components.metrics_logger, self.run)
        return logger

    def trainer_ref(self) -> Optional[str]:
        """ "pkg.mod:Class" of a Trainer subclass (recorded in recipe.toml), None for ditty's own."""
        cls = type(self)
        if cls.__module__ == "ditty.train.trainer":
            return None
        return f"{cls.__module__}:{cls.__qualname__}"


# The build step that `ditty export` shares with the trainer, as a plain function of the config (the
# model's are in ditty.models.recipe_model).


def tokenizer_for(config: Any, *, non_text_data: bool = False):
    """The recipe's tokenizer; None for non-text data (built-in images, a Python API dataset) unless a
    tokenizer source is named."""
    from ditty.data.formats import format_of
    from ditty.data.tokenizer import build_tokenizer

    non_text = non_text_data or not format_of(config.data).tokenized
    if non_text and config.tokenizer.kind == "auto" and not config.tokenizer.source(config.model):
        return None
    if non_text and config.tokenizer.kind == "auto" and not config.tokenizer.path:
        from ditty.data.tokenizer import holds_no_tokenizer

        if holds_no_tokenizer(config.model.path):  # samples that are tensors need none; final/ gets none
            return None
    return build_tokenizer(config.tokenizer, config.model)
