"""`Trainer`: builds every component from its config section, then runs the loop as named steps.

Read `train()` first: it is the whole run in outline. Every step is a method a subclass can
replace (`train_step`, `forward_backward`, `evaluate`, `log`, `save`, `should_stop`, and each
`build_*`), in the style of torchtitan's Trainer. A subclass adds recipe sections by extending the
nested `Config`:

    class MyTrainer(Trainer):
        @dataclass(frozen=True)
        class Config(Trainer.Config):
            extra: MySection = field(default_factory=MySection)
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any, Optional

import torch

from ditty._utils.dist import is_main_process
from ditty._utils.dist import rank as get_rank
from ditty._utils.dist import world_size as get_world_size
from ditty.config.root import TrainerConfig
from ditty.data.generic import batch_samples, is_generic, to_device
from ditty.data.mixture import source_token_record
from ditty.evaluation import harness_due, harness_on_model, score_final_model
from ditty.metrics import Progress, plot_run
from ditty.metrics.progress import format_record
from ditty.models.converters import run_post_optimizer_hooks
from ditty.train import checkpointing, deepspeed_engine, distributed
from ditty.train.builders import Builders
from ditty.train.components import RuntimeComponents
from ditty.train.evaluate import eval_batches, validation_loss
from ditty.train.final import save_final, unwrap_model
from ditty.train.heldout import held_out_losses
from ditty.train.pipeline import run_pipeline
from ditty.train.speed import apply_speedups
from ditty.train.state import IntervalMeter, NonFiniteLossError, TrainResult, TrainState
from ditty.train.step import (
    LossNormaliser,
    StepOutput,
    all_reduce_sum,
    clip_grads,
    grad_norm,
    input_tokens,
    supervised_tokens,
)

log = logging.getLogger("ditty.train")


class Trainer(Builders):
    Config = TrainerConfig
    converters: list = []  # model rewrites applied by build_model; their hooks run after each step

    def __init__(self, config: TrainerConfig, components: Optional[RuntimeComponents] = None):
        self.config = config
        self.components = components or RuntimeComponents()  # Python objects that replace config sections
        self.world_size, self.rank = get_world_size(), get_rank()
        self.device = self.build_device()
        self.build_threads()
        self.build_seed()
        # Cheap, so a refused or finished run fails (or stops) before any weights load or file is written.
        self.resume = checkpointing.plan_resume(config, self.trainer_ref())
        if self.resume.finished:
            return  # train() says so and touches nothing
        self.tokenizer = self.build_tokenizer()
        self.model = self.build_model()
        self.model = apply_speedups(self.model, self.config)  # activation checkpointing, then torch.compile
        self.model = self.build_parallel(self.model)  # ddp/fsdp/hsdp: after those, before the optimizer
        self.data = self.build_data()
        self.grad_accum = self.build_grad_accum()
        self.stream = self.build_stream()
        self.total_steps = self.build_total_steps()
        self.optimizer = self.build_optimizer()
        self.scheduler = self.build_scheduler()
        self.engine = self.build_engine()  # deepspeed: wraps model and optimizer; None otherwise
        self.precision = self.build_precision()
        self.pipeline = self.build_pipeline()
        self.state = TrainState()
        self.run_dir = self.config.run.output_dir
        self.checkpointer = checkpointing.Checkpointer(self, self.resume)
        self.checkpointer.restore()  # restores the RNG, after everything that draws from it is built
        # Only now, with the checkpoint loaded, the run directory's files are (re)written: a resume
        # that fails leaves recipe.toml, env.json and metrics.jsonl as they were.
        self.build_run_dir()
        self.logger = self.build_logger()

    # ------------------------------------------------------------------ the loop

    def train(self) -> TrainResult:
        """The run: steps until `should_stop`, evaluating and logging on schedule, then the final save."""
        if self.resume.finished:
            return self.finished()
        cfg = self.config.train
        self.checkpointer.install_signals()
        self.progress = Progress(self.total_steps, enabled=self.config.logging.progress, initial=self.state.step)
        self.meter = IntervalMeter()
        self.model.train()
        try:
            while not self.should_stop():
                out = self.train_step(self.stream.next_step())
                self.state.step += 1
                self.state.tokens += out.tokens
                self.meter.add(out, out.tokens)
                self.progress.update()

                last = self.should_stop()
                record: dict[str, Any] = {}
                if out.skipped or last or (cfg.log_every and self.state.step % cfg.log_every == 0):
                    record = self.step_record(out)
                if last or (cfg.eval_every and self.state.step % cfg.eval_every == 0):
                    record = {**(record or self.step_record(out)), **self.evaluate()}
                if harness_due(self.config.eval, self.state.step, last):  # datascale (#18): lm-eval, live model
                    scores = harness_on_model(unwrap_model(self.model), self.tokenizer, self.config.eval)
                    self.state.eval_metrics.update(scores)
                    record = {**(record or self.step_record(out)), **scores}
                if record:
                    self.log(record)
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

    def should_stop(self) -> bool:
        """`train.steps` reached; or, training by epochs, the data cursor passed `train.epochs` passes
        (with packing a step consumes a variable number of samples, so steps only bound it)."""
        if self.state.step >= self.total_steps:
            return True
        t = self.config.train
        return t.steps is None and self.stream.cursor >= (t.epochs or 1.0) * self.train_samples()

    def train_step(self, micro_batches: list[dict]) -> StepOutput:
        """One optimizer step over every micro-batch of the global batch (gradient accumulation).

        The global supervised-token count is taken before the first forward (see step.py), so each
        micro-batch's backward already carries its final weight.
        """
        norm = LossNormaliser.for_step(micro_batches, self.count_tokens, self.world_size)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens = torch.zeros((), dtype=torch.float64, device=self.device)
        metrics: dict[str, float] = {}
        for index, batch in enumerate(micro_batches):
            ctx = self.make_context(index=index, count=len(micro_batches), training=True)
            with distributed.micro_batch_sync(self.model, self.config, index, len(micro_batches)):
                scaled, out = self.forward_backward(batch, norm, ctx)
            loss_sum += scaled.double()
            tokens += self.count_inputs(batch).to(self.device, torch.float64)
            for key, value in (out.metrics or {}).items():
                metrics[key] = metrics.get(key, 0.0) + float(value) / len(micro_batches)
        # One collective for both; every rank scaled by world_size, so the sum / world is the loss.
        totals = all_reduce_sum(torch.stack([loss_sum, tokens]))
        metrics = distributed.mean_across_ranks(metrics)
        return self.optimizer_step(totals[0] / self.world_size, totals[1], norm.global_tokens, metrics)

    def forward_backward(self, batch: dict, norm: LossNormaliser, ctx: dict) -> tuple[torch.Tensor, Any]:
        """Forward one micro-batch through the pipeline and backward its share of the global loss."""
        out = self.forward(batch, ctx)
        scaled = norm.scale(out.loss, out.num_tokens, batch_samples(batch))
        if self.engine is not None:
            deepspeed_engine.backward(self.engine, scaled)  # the engine steps after the last micro-batch
        else:
            self.precision.backward(scaled)
        return scaled.detach(), out

    def forward(self, batch: Any, ctx: dict) -> Any:
        """batch -> preprocessors -> model.forward -> postprocessors -> loss calculator: a LossOutput.

        On the first micro-batch of the run (`pipeline.check_tensors`), every stage's real tensors
        are compared with its declared contract; a mismatch is a RecipeError naming the stage.
        """
        check = bool(
            self.config.pipeline.check_tensors and ctx.get("training") and not getattr(self, "contracts_checked", False)
        )
        if check:
            self.contracts_checked = True  # once per process: the first training micro-batch (also after a resume)
        return run_pipeline(
            self.pipeline,
            self.model,
            to_device(batch, self.device),
            ctx,
            self.precision.autocast,
            lm=not is_generic(self.data),
            check=check,
        )

    def optimizer_step(
        self, loss: torch.Tensor, tokens: torch.Tensor, supervised: torch.Tensor, metrics: dict
    ) -> StepOutput:
        """Clip and step, unless the loss or the gradient is not finite: then zero grads and skip.

        Cost: one host sync per step (loss, grad norm and counts read together) to decide whether to step.
        Under DeepSpeed the engine has already stepped (and clipped); this only reads its figures.
        """
        if self.engine is not None:
            return deepspeed_engine.finish_step(self, loss, tokens, supervised, metrics)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.precision.unscale_(self.optimizer)
        norm = grad_norm(params)  # a DTensor under FSDP: clipping takes it as is, the log reads its full value
        values = torch.stack(
            [t.to(self.device, torch.float64) for t in (loss, distributed.local_value(norm), tokens, supervised)]
        )
        loss_value, norm_value, tokens, supervised = values.tolist()
        lr = self.optimizer.param_groups[0]["lr"]
        skipped, reason = False, ""
        if not math.isfinite(loss_value) or not math.isfinite(norm_value):
            skipped, reason = True, "non-finite loss" if not math.isfinite(loss_value) else "non-finite gradient"
            if self.precision.scaler is not None:
                self.precision.scaler.update()  # unscale_ was called: the scaler must close this step
        else:
            clip_grads(params, self.config.train.max_grad_norm, norm)
            if not self.precision.step(self.optimizer):
                skipped, reason = True, "fp16 overflow (loss scale lowered)"
            else:
                run_post_optimizer_hooks(self.model, self.converters)
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # torch warns when the scheduler steps before any optimizer step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()  # the schedule follows the step count, skipped steps included
        if self.precision.loss_scale is not None:
            metrics["loss_scale"] = self.precision.loss_scale
        return StepOutput(loss_value, norm_value, int(tokens), int(supervised), skipped, reason, metrics | {"lr": lr})

    def check_skips(self, out: StepOutput) -> None:
        """Count consecutive skipped steps; too many stop the run with a clear error."""
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
                f'Try a lower optimizer.lr, gradient clipping (train.max_grad_norm), or train.precision = "fp32". '
                f"Files already in {self.config.run.output_dir} are kept; no final model was written."
            )

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """val_loss over the whole validation set, plus the task's metrics as val_<name>."""
        if is_generic(self.data):
            return self.evaluate_generic()
        self.model.eval()
        metrics: dict[str, Any] = {}
        val = getattr(self.data, "val", None)
        if val is not None and len(val) > 0:
            batches = eval_batches(val, self.config.train.micro_batch_size, self.tokenizer.pad_token_id)
            forward = lambda b: self.forward(b, self.make_context(index=0, count=1, training=False))  # noqa: E731
            metrics["val_loss"] = validation_loss(forward, batches, self.count_tokens)
        val_sets = getattr(self.data, "val_sets", ())
        if val_sets:  # datascale (#18): val_loss/NAME per held-out set and val_loss over all of them
            forward = lambda b: self.forward(b, self.make_context(index=0, count=1, training=False))  # noqa: E731
            micro, pad = self.config.train.micro_batch_size, self.tokenizer.pad_token_id
            metrics.update(held_out_losses(forward, val_sets, micro, pad, self.count_tokens))
        task = getattr(self.data, "task", None)
        if task is not None and self.config.train.eval_samples > 0:
            with self.precision.autocast():
                scores = task.evaluate(
                    unwrap_model(self.model), self.tokenizer, self.device, self.config.train.eval_samples
                )
            metrics.update({k if k.startswith("val_") else f"val_{k}": v for k, v in scores.items()})
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
        record.update(source_token_record(self.stream))  # datascale (#18): tokens/source/NAME (collective)
        record.update(distributed.memory_record(self))
        if out.skipped:
            record.update(skipped=True, skip_reason=out.skip_reason, step_loss=out.loss, step_grad_norm=out.grad_norm)
        return record

    def log(self, record: dict[str, Any]) -> None:
        """Send a record to metrics.jsonl/TensorBoard/wandb (rank 0) and the progress bar."""
        self.logger.log(record)
        self.progress.set_metrics(record)
        if not self.config.logging.progress:  # no bar (e.g. logs to a file): one line per record
            self.progress.write(format_record(record))
        elif any(k.startswith("val_") for k in record):
            shown = ", ".join(
                f"{k} {v:.4f}" for k, v in record.items() if k.startswith("val_") and isinstance(v, float)
            )
            self.progress.write(f"step {record['step']}: {shown}")

    def save(self, final: bool = False) -> Optional[str]:
        """Periodic: a checkpoint every `checkpoint.every` steps (and a Hub push with push =
        "checkpoints"). Final: `final/` in Hugging Face format on rank 0, a checkpoint of the last
        step (so a longer `train.steps` can continue it), and the Hub push with push = "end"/"checkpoints"."""
        every, push = self.config.checkpoint.every, self.config.hub.push
        if not final:
            if every and self.state.step % every == 0 and self.state.step != self.checkpointer.last_saved_step:
                self.checkpointer.save()
                if push == "checkpoints" and not self.should_stop():  # the last step pushes final/ instead
                    checkpointing.push_checkpoint_snapshot(self)
            return None
        path = None
        full = distributed.full_state_dict(self.model)  # FSDP: gathered on every rank, kept on rank 0 (CPU)
        if is_main_process():
            path = save_final(
                self.model,
                self.tokenizer,
                self.run_dir,
                merged=self.config.checkpoint.final_format == "merged",
                state_dict=full,
            )
        del full
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # nobody reads final/ before it is complete
        if self.state.step != self.checkpointer.last_saved_step:
            self.checkpointer.save()
        path = path or os.path.join(self.run_dir, "final")
        if self.config.eval.harness_tasks:  # datascale (#18): lm-eval scores of final/, before the push
            self.log({"step": self.state.step, **score_final_model(self, path)})
        if push in ("end", "checkpoints"):
            checkpointing.push_to_hub(self, path, message=f"ditty: final model, step {self.state.step}")
        return path

    def preempt(self) -> TrainResult:
        """A signal asked to stop: the step is done; save a checkpoint (and wait for it), say how to resume."""
        if self.state.step != self.checkpointer.last_saved_step:
            self.checkpointer.save()
        self.checkpointer.manager.wait()
        signum = self.checkpointer.stop_signal
        if is_main_process():
            print(checkpointing.preempted_message(self, signum), flush=True)
        result = self.result(None)
        result.stopped_by = signum
        return result

    def finished(self) -> TrainResult:
        """`resume = "auto"` on a finished run: report it, touch nothing."""
        final = os.path.join(self.config.run.output_dir, "final")
        if is_main_process():
            print(
                f"{self.config.run.output_dir} is a finished run (step {self.resume.step}, {final}); nothing to do. "
                f"To train further, raise train.steps; to start afresh, choose a new run.output_dir."
            )
        return TrainResult(
            run_dir=self.config.run.output_dir,
            final_dir=final,
            steps=self.resume.step,
            tokens=0,
            skipped_steps=0,
            elapsed_s=0.0,
        )

    def close(self) -> None:
        """Wait for a pending checkpoint save and close the sinks, then draw curves.png; also after
        an error (the metrics so far are kept)."""
        try:
            self.checkpointer.close()
        finally:
            self.progress.close()
            self.logger.close()
        if is_main_process() and os.path.exists(os.path.join(self.run_dir, "metrics.jsonl")):
            try:
                plot_run(self.run_dir)
            except Exception as exc:  # a plot must never hide the run's own outcome
                log.warning("could not draw curves.png: %s", exc)

    def result(self, final_dir: Optional[str]) -> TrainResult:
        return TrainResult(
            run_dir=self.run_dir,
            final_dir=final_dir,
            steps=self.state.step,
            tokens=self.state.tokens,
            skipped_steps=self.state.skipped_steps,
            elapsed_s=round(self.meter.flush()["elapsed_s"], 1),
            eval_metrics=dict(self.state.eval_metrics),
        )

    def report(self, result: TrainResult) -> None:
        if not is_main_process():
            return
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.eval_metrics.items() if isinstance(v, float))
        print(f"done: {result.steps} steps in {result.elapsed_s:.1f} s; {shown}")
        print(f"model saved to {result.final_dir}")

    # ------------------------------------------------------------------ small helpers

    def count_tokens(self, batch: Any) -> torch.Tensor:
        """Supervised tokens of a batch, by the loss calculator's own rule when it has one; for
        generic data, the batch's samples."""
        counter = getattr(self.pipeline.loss, "count_tokens", None)
        if is_generic(self.data) and counter is None:
            return torch.tensor(batch_samples(batch))
        return counter(batch) if counter is not None else supervised_tokens(batch)

    def make_context(self, *, index: int, count: int, training: bool) -> dict:
        from ditty.processors import Context

        return Context(
            step=self.state.step,
            micro_step=index,
            num_micro_steps=count,
            training=training,
            model=self.model,
            tokenizer=self.tokenizer,
            device=self.device,
        )

    def count_inputs(self, batch: Any) -> torch.Tensor:
        """The `tokens` metric's increment: non-padding tokens, or samples for generic data."""
        if is_generic(self.data):
            return torch.tensor(batch_samples(batch))
        return input_tokens(batch, self.tokenizer.pad_token_id)

    def evaluate_generic(self) -> dict[str, Any]:
        """Generic data: val_loss (the mean loss over the validation set, weighted by samples) and
        the task's metrics; the task may write files (a diffusion sample grid) into the run directory."""
        from ditty.data.generic import eval_micro_batches

        self.model.eval()
        metrics: dict[str, Any] = {}
        val = self.data.val
        if val is not None and len(val) > 0:
            total, count = 0.0, 0
            for batch in eval_micro_batches(val, self.config.train.micro_batch_size, self.data.collate_fn):
                out = self.forward(batch, self.make_context(index=0, count=1, training=False))
                size = batch_samples(batch)
                total += float(out.mean_loss()) * size
                count += size
            metrics["val_loss"] = total / max(count, 1)
        task = self.data.task
        if task is not None and self.config.train.eval_samples > 0:
            # Every rank runs the task (a sharded model's forward needs them all); rank 0 writes files.
            with self.precision.autocast():
                scores = task.evaluate(
                    unwrap_model(self.model),
                    device=self.device,
                    pipeline=self.pipeline,
                    run_dir=self.config.run.output_dir if is_main_process() else "",
                    step=self.state.step,
                )
            metrics.update({k if k.startswith("val_") else f"val_{k}": v for k, v in scores.items()})
        self.model.train()
        self.state.last_eval_step = self.state.step
        self.state.eval_metrics = metrics
        return metrics
