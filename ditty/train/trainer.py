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

from ditty._utils.dist import is_main_process
from ditty.checkpoint.clock import SaveClock
from ditty.checkpoint.lock import hold_run_dir
from ditty.config.root import TrainerConfig
from ditty.data.generic import batch_samples, to_device
from ditty.data.mixture import source_token_record
from ditty.metrics import Progress
from ditty.metrics.harness import harness_on_model
from ditty.metrics.mfu import utilization
from ditty.metrics.progress import format_record
from ditty.optim.schedule_free import evaluation_weights, train_mode
from ditty.parallel.memory import MemoryReport
from ditty.parallel.threads import slow_cpu_hint
from ditty.train.builders import Builders
from ditty.train.cadence import Cadence, Due
from ditty.train.components import RuntimeComponents
from ditty.train.data_modes import EvalRequest
from ditty.train.ending import RunEnding
from ditty.train.final import check_output_dir
from ditty.train.pipeline import MODEL_OUTPUT, run_pipeline
from ditty.train.resume import plan_resume
from ditty.train.state import IntervalMeter, NonFiniteLossError, RunField, TrainResult, TrainRun, TrainState
from ditty.train.step import LossNormaliser, StepOutput, all_reduce_sum, mean_across_ranks

log = logging.getLogger("ditty.train")


class Trainer(Builders, RunEnding):
    Config = TrainerConfig

    def __init__(self, config: TrainerConfig, components: Optional[RuntimeComponents] = None, *, plan=None):
        self.components = components or RuntimeComponents()  # Python objects that replace config sections
        # What the steps below build, in one typed object (ditty.train.state.TrainRun): self.config,
        # self.model, self.optimizer, ... are its fields. Checkpointing, final/ and the push take it.
        self.run = TrainRun(config, trainer_ref=self.trainer_ref(), hub_token=self.components.hub_token)
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
        self.stream = self.data.stream(self.plan.accumulation_steps)
        self.total_steps = self.build_total_steps(self.data)
        optimizer = self.build_optimizer(self.model, self.converters)
        self.scheduler = self.build_scheduler(optimizer, self.total_steps)
        self.model, self.optimizer = self.engine.attach(self.model, optimizer)
        self.precision = self.build_precision()
        self.pipeline = self.build_pipeline(self.model, self.data)
        if config.rl.kind != "none":  # rollouts in the loop: GRPO's stream, loss and evaluation (ditty.train.rl)
            from ditty.train.rl import attach_rl

            attach_rl(self)
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

    # ------------------------------------------------------------------ the loop

    def train(self) -> TrainResult:
        """The run: steps until `should_stop`, evaluating and logging on schedule, then the final save."""
        if self.resume.finished:
            return self.finished()
        self.checkpointer.install_signals()
        self.progress = Progress(self.total_steps, enabled=self.config.logging.progress, initial=self.state.step)
        self.meter = IntervalMeter(offset_s=self.state.elapsed_s)  # elapsed_s counts across resumes
        self.save_clock = SaveClock(self.config.checkpoint.every_minutes)  # checkpoint.every_minutes
        self.model.train()
        train_mode(self.optimizer)  # schedule-free AdamW trains at its interpolated weights
        try:
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

    def advance(self, out: StepOutput) -> StepOutput:
        """Count the step just taken (step, tokens, the interval's means, the progress bar)."""
        self.state.step += 1
        self.state.tokens += out.tokens
        self.meter.add(out, out.tokens)
        self.progress.update()
        return out

    def log_step(self, out: StepOutput, due: Due) -> None:
        """The step's record when one is due: metrics, then evaluation and lm-eval scores of the live model."""
        record: dict[str, Any] = self.step_record(out) if (due.log or due.evaluate or due.harness) else {}
        if due.evaluate:
            record.update(self.evaluate())
        if due.harness:
            with evaluation_weights(self.optimizer):
                scores = harness_on_model(self.engine.unwrap(self.model), self.tokenizer, self.config.eval)
            self.state.eval_metrics.update(scores)
            record.update(scores)
        if record:
            self.log(record)

    def should_stop(self) -> bool:
        """`train.steps` reached; or, training by epochs, the data cursor passed `train.epochs` passes
        (with packing a step consumes a variable number of samples, so steps only bound it)."""
        if self.state.step >= self.total_steps:
            return True
        t = self.config.train
        return t.steps is None and self.stream.cursor >= (t.epochs or 1.0) * self.data.train_samples()

    def train_step(self, micro_batches: list) -> StepOutput:
        """One optimizer step over every micro-batch of the global batch (gradient accumulation).

        The global supervised-token count is taken before the first forward (see step.py), so each
        micro-batch's backward already carries its final weight.
        """
        count = lambda batch: self.data.supervised_count(batch, self.pipeline.loss)  # noqa: E731
        world, group = self.runtime.batch_ranks, self.runtime.batch_group  # the world unless tensor parallel
        norm = LossNormaliser.for_step(micro_batches, count, world, group)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        tokens = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        metrics: dict[str, float] = {}
        for index, batch in enumerate(micro_batches):
            ctx = self.make_context(index=index, count=len(micro_batches), training=True)
            with self.engine.micro_batch(self.model, index, len(micro_batches)):
                scaled, out = self.forward_backward(batch, norm, ctx)
            loss_sum += scaled.double()
            tokens += self.data.input_count(batch).to(self.runtime.device, torch.float64)
            for key, value in (out.metrics or {}).items():
                metrics[key] = metrics.get(key, 0.0) + float(value) / len(micro_batches)
        # One collective for both; every rank scaled by world_size, so the sum / world is the loss.
        totals = all_reduce_sum(torch.stack([loss_sum, tokens]), group)
        step_totals = torch.stack([totals[0] / world, totals[1], norm.global_tokens.to(totals.device)])
        return self.optimizer_step(step_totals, mean_across_ranks(metrics))

    def forward_backward(self, batch: Any, norm: LossNormaliser, ctx: dict) -> tuple[torch.Tensor, Any]:
        """Forward one micro-batch through the pipeline and backward its share of the global loss."""
        out = self.forward(batch, ctx)
        scaled = norm.scale(out.loss, out.num_tokens, batch_samples(batch))
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

    def check_skips(self, out: StepOutput) -> None:
        """Count consecutive skipped steps; too many stop the run with a clear error."""
        # No checkpoint during a streak of skipped steps (ditty.checkpoint.finite).
        self.checkpointer.observe(self.state.step, out.skipped)
        if not out.skipped:
            self.state.consecutive_skips = 0
            return
        self.state.skipped_steps += 1
        self.state.consecutive_skips += 1
        limit = self.config.train.max_skipped_steps
        log.warning(
            "step %d skipped: %s (%d in a row, limit %d)",
            self.state.step,
            out.skip_reason,
            self.state.consecutive_skips,
            limit,
        )
        if self.state.consecutive_skips >= limit:
            raise NonFiniteLossError(
                f"stopping: {self.state.consecutive_skips} consecutive steps had a {out.skip_reason} "
                f"(train.max_skipped_steps = {limit}), last at step {self.state.step}. "
                f"{self.checkpointer.finite.last_good(self.run_dir)}. "
                f"Try a lower optimizer.lr, gradient clipping (train.max_grad_norm), or train.precision = "
                f'"fp32". Files already in {self.config.run.output_dir} are kept; no final model was written.'
            )

    def eval_forward(self, batch: Any) -> tuple[Any, Any]:
        """One validation batch through `forward`: (its LossOutput, the model's output after the postprocessors)."""
        ctx = self.make_context(index=0, count=1, training=False)
        return self.forward(batch, ctx), ctx.get(MODEL_OUTPUT)

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
        with evaluation_weights(self.optimizer):  # schedule-free: evaluate its averaged weights
            metrics = self.data.evaluate(request)
        self.model.train()
        self.state.last_eval_step = self.state.step
        self.state.eval_metrics = metrics
        return metrics

    def step_record(self, out: StepOutput) -> dict[str, Any]:
        """The metrics.jsonl record of this step: interval means, counters, and skip marks."""
        record: dict[str, Any] = {"step": self.state.step}
        interval = self.meter.flush()
        record.update(loss=interval.pop("loss"), lr=out.metrics.get("lr"), grad_norm=interval.pop("grad_norm"))
        record.update(tokens=self.state.tokens, **interval)
        record.update({k: v for k, v in out.metrics.items() if k != "lr"})
        record.update(self.memory.record(self.model, self.optimizer))
        if self.data.skipped_rows:  # bad data rows left out (data.on_bad_rows = "skip")
            record["skipped_rows"] = self.data.skipped_rows
        # mfu/hfu: model FLOPs x tokens/s over the devices' peak (ditty.metrics.mfu)
        runtime = self.runtime
        record.update(
            utilization(self.model, self.config, runtime.device, runtime.world_size, record.get("tokens_per_s"))
        )
        record.update(source_token_record(self.stream))  # tokens/source/NAME of a mixture (collective)
        if out.skipped:
            record.update(skipped=True, skip_reason=out.skip_reason, step_loss=out.loss, step_grad_norm=out.grad_norm)
        return record

    def log(self, record: dict[str, Any]) -> None:
        """Send a record to metrics.jsonl/TensorBoard/wandb (rank 0) and the progress bar."""
        self.logger.log(record)
        self.progress.set_metrics(record)
        # Once, from the second logged record on (the first carries the start-up): a CPU run far below its peak.
        hint = (
            slow_cpu_hint(record, self.runtime.device.type) if self.state.step > self.config.train.log_every else None
        )
        if hint and not self.slow_hint_shown:
            self.slow_hint_shown = True
            self.progress.write(hint)
        if not self.config.logging.progress:  # no bar (e.g. logs to a file): one line per record
            self.progress.write(format_record(record))
        elif any(k.startswith("val_") for k in record):
            shown = ", ".join(
                f"{k} {v:.4f}" for k, v in record.items() if k.startswith("val_") and isinstance(v, float)
            )
            self.progress.write(f"step {record['step']}: {shown}")

    def make_context(self, *, index: int, count: int, training: bool) -> dict:
        from ditty.stages.processors import Context

        return Context(
            step=self.state.step,
            micro_step=index,
            num_micro_steps=count,
            training=training,
            model=self.model,
            tokenizer=self.tokenizer,
            device=self.runtime.device,
        )


# The trainer's attributes of the built parts are the fields of its TrainRun (self.run).
for _field in dataclasses.fields(TrainRun):
    if _field.name not in ("trainer_ref", "hub_token"):  # trainer_ref() is a method of the Builders
        setattr(Trainer, _field.name, RunField(_field.name))
