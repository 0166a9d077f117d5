"""`Trainer`: compiles its config, builds every component from its section, then runs the loop as named steps.

Read `__init__` (the build, in order) and `train()` (the run) first: they are the whole trainer in
outline. Everything that depends on the parallel kind is the engine's (ditty.train.engines);
everything that depends on the kind of data is the data mode's (ditty.train.data_modes). Every step
is a method a subclass can replace (`train_step`, `forward_backward`, `evaluate`, `log`, `save`,
`should_stop`, and each `build_*`), in the style of torchtitan's Trainer. A subclass adds recipe
sections by extending the nested `Config`:

    class MyTrainer(Trainer):
        @dataclass(frozen=True)
        class Config(Trainer.Config):
            extra: MySection = field(default_factory=MySection)
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, Optional

import torch

from ditty._utils.dist import is_main_process, on_every_rank
from ditty.checkpoint.clock import SaveClock
from ditty.checkpoint.lock import hold_run_dir
from ditty.config.errors import RecipeError
from ditty.config.root import TrainerConfig
from ditty.config.stopping import parse_stop_condition
from ditty.data.generic import batch_samples, to_device
from ditty.metrics import Progress
from ditty.optim.schedule_free import evaluation_weights, train_mode
from ditty.parallel.memory import MemoryReport
from ditty.train.builders import Builders
from ditty.train.cadence import Cadence
from ditty.train.components import RuntimeComponents
from ditty.train.data_modes import EvalRequest
from ditty.train.ending import RunEnding
from ditty.train.final import check_output_dir
from ditty.train.pipeline import MODEL_OUTPUT, run_pipeline
from ditty.train.records import StepRecords
from ditty.train.resume import plan_resume
from ditty.train.state import IntervalMeter, RunField, TrainResult, TrainRun, TrainState
from ditty.train.step import LossNormaliser, StepMetrics, StepOutput, all_reduce_sum, as_sum

log = logging.getLogger("ditty.train")


class Trainer(Builders, StepRecords, RunEnding):
    Config = TrainerConfig

    def __init__(self, config: TrainerConfig, components: Optional[RuntimeComponents] = None, *, plan=None):
        components = components or RuntimeComponents()  # Python objects that replace config sections
        # What the steps below build, in one typed object (ditty.train.state.TrainRun): self.config,
        # self.model, self.optimizer, ... are its fields. Checkpointing, final/ and the push take it.
        self.run = TrainRun(
            config, components=components, trainer_ref=self.trainer_ref(), hub_token=components.hub_token
        )
        self.plan = plan or self.build_plan()  # every rule, before anything is built
        self.runtime = self.build_runtime()  # device, process group, mesh: a rank that cannot join fails first
        from ditty.parallel.runtime import seed_everything

        seed_everything(config.run.seed)
        # One writer per run directory (ditty.checkpoint.lock), taken before anything in it is read or
        # written, and never inside a directory of someone else's files; a killed save's leftovers go.
        check_output_dir(config.run.output_dir)
        self.run_lock = hold_run_dir(config.run.output_dir)
        # Cheap, so a refused or finished run fails (or stops) before any weights load or file is written.
        self.resume = plan_resume(config, self.trainer_ref(), self.runtime.world_size)
        if self.resume.finished:
            return  # train() says so and touches nothing
        self.engine = self.build_engine()
        self.tokenizer = self.build_tokenizer()
        self.data = self.build_data(self.tokenizer)  # first: a classifier's head size is its data's label count
        built = self.build_model(self.tokenizer, labels=self.data.labels)
        self.converters, self.built_on_meta = built.converters, built.pending is not None
        self.model = self.build_model_ready(built)  # speedups, then the engine's wrapping: before the optimizer
        self.total_steps = self.build_total_steps(self.data)
        optimizer = self.build_optimizer(self.model, self.converters)
        self.scheduler = self.build_scheduler(optimizer, self.total_steps)
        self.model, self.optimizer = self.engine.attach(self.model, optimizer)
        self.precision = self.build_precision()
        # The objective's row (ditty.objectives.table): its loss and, where it has them, its own stream
        # (RL's rollouts), evaluation and reference, built on the policy as it will train.
        self.objective = self.build_objective()
        self.stream = self.build_stream(self.data, self.objective)
        self.pipeline = self.build_pipeline(self.objective)
        self.state = TrainState()
        self.contracts_checked = False
        self.checkpointer = self.build_checkpointer()
        self.checkpointer.restore(self.run)  # the RNG last, after everything that draws from it is built
        # Only now, with the checkpoint loaded, the run directory's files are (re)written: a resume
        # that fails leaves recipe.toml, env.json and metrics.jsonl as they were.
        self.run_dir = self.build_run_dir(self.model, self.total_steps)
        self.logger = self.build_logger(resuming=self.resume.checkpoint is not None)
        self.memory = MemoryReport(self.engine, self.run_dir)
        self.cadence = Cadence.of(config)
        self.meter = IntervalMeter(offset_s=self.state.elapsed_s)  # train() starts a fresh one; saves read it
        self.slow_hint_shown = False
        self.compile_report = None  # what train.compile made, read after the first step (check_compile)

    # ------------------------------------------------------------------ the loop

    def train(self) -> TrainResult:
        """The run: steps until `should_stop`, evaluating and logging on schedule, then the final save."""
        if self.resume.finished:
            return self.finished()
        if getattr(self, "_trained", False):  # its sinks are closed and final/ written: another call would re-save it
            raise RecipeError.single(
                "this Trainer has run train() already",
                key="Trainer.train",
                fix="build a new Trainer: it resumes from the last checkpoint (raise train.steps to train further)",
            )
        self._trained = True
        self.checkpointer.install_signals()
        self.progress = Progress(self.total_steps, enabled=self.config.logging.progress, initial=self.state.step)
        self.meter = IntervalMeter(offset_s=self.state.elapsed_s)  # elapsed_s counts across resumes
        self.save_clock = SaveClock(self.config.checkpoint.every_minutes)  # checkpoint.every_minutes
        self.model.train()
        train_mode(self.optimizer)  # schedule-free AdamW trains at its interpolated weights
        try:
            if self.state.step == 0 and self.evaluates_at_start():  # the baseline a gain is read against
                self.log({"step": 0, **self.evaluate()})
            while not self.should_stop():
                out = self.advance(self.train_step(self.stream.next_step()))
                due = self.cadence.at(self.state.step, last=self.should_stop(), skipped=out.skipped)
                self.log_step(out, due)
                self.check_skips(out)
                self.save(final=False)
                if self.checkpointer.stop_requested():
                    return self.preempt()

            if self.state.last_eval_step != self.state.step:  # a run of zero steps still evaluates
                self.log({"step": self.state.step, **self.evaluate()})
            final_dir = self.save(final=True)
        finally:
            self.close()
        result = self.result(final_dir)
        self.report(result)
        return result

    def evaluates_at_start(self) -> bool:
        """`train.eval_at_start`; unset: for the objectives after SFT that evaluate during the run."""
        from ditty.objectives.table import objective_for

        t = self.config.train
        return (
            t.eval_at_start
            if t.eval_at_start is not None
            else t.eval_every > 0 and objective_for(self.config).post_training
        )

    def advance(self, out: StepOutput) -> StepOutput:
        """Count the step just taken (step, tokens, the interval's means, the progress bar); an update
        that changed the weights is a new version of the policy for the objective (what it samples with)."""
        if not out.skipped:
            self.objective.after_update()
        self.state.step += 1
        self.state.tokens += out.tokens
        self.meter.add(out, out.tokens)
        self.progress.update()
        return out

    def should_stop(self) -> bool:
        """`train.steps` reached, or an evaluation met `train.stop_when`; or, training by epochs, the data
        cursor passed `train.epochs` passes (with packing a step consumes a variable number of samples)."""
        if self.state.step >= self.total_steps or self.state.stopped_early:
            return True
        t = self.config.train
        return t.steps is None and self.stream.cursor >= (t.epochs or 1.0) * self.data.train_samples()

    def train_step(self, micro_batches: list) -> StepOutput:
        """One optimizer step over every micro-batch of the global batch (gradient accumulation).

        The global supervised-token count (or the units a loss over global counts declares) is taken
        before the first forward (see step.py), so each micro-batch's backward already carries its
        final weight.
        """
        count = lambda batch: self.data.supervised_count(batch, self.pipeline.loss)  # noqa: E731
        world, group = self.runtime.batch_ranks, self.runtime.batch_group  # the world unless tensor parallel
        norm = LossNormaliser.for_step(micro_batches, count, world, group)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        tokens = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        metrics = StepMetrics(len(micro_batches))
        for index, batch in enumerate(micro_batches):
            ctx = self.make_context(index=index, count=len(micro_batches), training=True, units=norm.global_units)
            with self.engine.micro_batch(self.model, index, len(micro_batches)):
                scaled, out = self.forward_backward(batch, norm, ctx)
            loss_sum += scaled.double()
            tokens += self.data.input_count(batch).to(self.runtime.device, torch.float64)
            metrics.add(out)
        # One collective for both; every rank scaled by world_size, so the sum / world is the loss.
        totals = all_reduce_sum(torch.stack([loss_sum, tokens]), group)
        step_totals = torch.stack([totals[0] / world, totals[1], norm.global_tokens.to(totals.device)])
        return self.optimizer_step(step_totals, metrics.across_ranks(group, world) | self.objective.step_metrics())

    def forward_backward(self, batch: Any, norm: LossNormaliser, ctx: dict) -> tuple[torch.Tensor, Any]:
        """Forward one micro-batch through the pipeline and backward its share of the global loss."""
        out = self.forward(batch, ctx)
        scaled = norm.scale(out, batch_samples(batch))
        self.engine.backward(scaled, self.precision)  # DeepSpeed also steps here, after the last micro-batch
        return scaled.detach(), out

    def forward(self, batch: Any, ctx: dict) -> Any:
        """batch -> preprocessors -> model.forward -> postprocessors -> loss calculator: a LossOutput.

        On the first training micro-batch of the process (`pipeline.check_tensors`), every stage's
        real tensors are compared with its declared contract; a mismatch is a RecipeError naming the stage.
        """
        check = bool(self.config.pipeline.check_tensors and ctx.get("training") and not self.contracts_checked)
        self.contracts_checked = self.contracts_checked or check
        batch = to_device(batch, self.runtime.device)
        return run_pipeline(
            self.pipeline, self.model, batch, ctx, self.precision.autocast, lm=self.data.token_batches, check=check
        )

    def optimizer_step(self, totals: torch.Tensor, metrics: dict) -> StepOutput:
        """The engine's step (clip and step, or skip a non-finite one), then the schedule, which follows
        the step count, skipped steps included. `totals`: [loss, input tokens, supervised tokens]."""
        lr = self.optimizer.param_groups[0]["lr"]
        out = self.engine.step(self.model, self.optimizer, self.precision, totals)
        with warnings.catch_warnings():  # torch warns when the scheduler steps before any optimizer step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        if self.precision.loss_scale is not None:
            metrics["loss_scale"] = self.precision.loss_scale
        out.metrics = metrics | {"lr": lr}
        return out

    def eval_forward(self, batch: Any) -> tuple[Any, Any]:
        """One validation batch through `forward`: (its LossOutput, the model's output after the postprocessors).
        A loss over global counts is evaluated over the batch's own and reported as a sum with its count."""
        units = self.data.supervised_count(batch, self.pipeline.loss)
        ctx = self.make_context(index=0, count=1, training=False, units=units if isinstance(units, dict) else None)
        return as_sum(self.forward(batch, ctx), units), ctx.get(MODEL_OUTPUT)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """val_loss over the whole validation set, plus the task's metrics as val_<name>."""
        self.model.eval()
        request = EvalRequest(
            forward=self.eval_forward,
            model=self.engine.unwrap(self.model),
            autocast=self.precision.autocast,
            pipeline=self.pipeline,
            device=self.runtime.device,
            micro_batch_size=self.config.train.micro_batch_size,
            eval_samples=self.config.train.eval_samples,
            step=self.state.step,
            run_dir=self.run_dir if is_main_process() else "",
        )
        evaluation = self.objective.evaluation or self.data  # the objective's own (RL's greedy reward), else the data's
        with evaluation_weights(self.optimizer):  # schedule-free: evaluate its averaged weights
            metrics = evaluation.evaluate(request)
        self.model.train()
        self.state.last_eval_step = self.state.step
        self.state.eval_metrics = metrics
        self.read_against_start(metrics)
        condition = parse_stop_condition(self.config.train.stop_when)  # the compiler checked it parses
        if condition is not None:  # every rank stops alike, or none does
            met = condition.met(metrics, self.state.start_metrics)
            self.state.stopped_early = met if on_every_rank(met is not None) else None
        return metrics

    def read_against_start(self, metrics: dict[str, Any]) -> None:
        """Keep the evaluation at step 0; warn once when a later one fell well below it (ditty.train.fall)."""
        from ditty.train.fall import fall_warning

        if self.state.step == 0:
            self.state.start_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            return
        if self.state.fall_warned or not self.state.start_metrics:
            return
        lr = self.optimizer.param_groups[0]["lr"]
        text = fall_warning(self.state.start_metrics, metrics, self.state.step, lr)
        if text is not None:
            self.state.fall_warned = True
            if is_main_process():
                log.warning(text)

    def make_context(self, *, index: int, count: int, training: bool, units: Optional[dict] = None) -> dict:
        """The micro-batch's context; `units`: the global counts a loss over them divides by."""
        from ditty.stages.processors import Context

        ctx = Context(
            step=self.state.step,
            micro_step=index,
            num_micro_steps=count,
            training=training,
            model=self.model,
            tokenizer=self.tokenizer,
            device=self.runtime.device,
        )
        if units:
            ctx["global_units"] = units
        return ctx


# The trainer's attributes of the built parts are the fields of its TrainRun (self.run).
for _field in dataclasses.fields(TrainRun):
    if _field.name not in ("trainer_ref", "hub_token"):  # trainer_ref() is a method of the Builders
        setattr(Trainer, _field.name, RunField(_field.name))
