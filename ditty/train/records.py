"""What a step leaves behind: its metrics.jsonl record (and the evaluation or lm-eval scores due with it),
the progress bar, and the count of skipped steps that stops a diverging run.

A mixin of `Trainer` (these are steps a subclass may replace like any other); it reads the trainer's
built state.
"""

from __future__ import annotations

import logging
from typing import Any

from ditty._utils.dist import is_main_process
from ditty.data.mixture import source_token_record
from ditty.data.workers import streamed_skipped_rows
from ditty.metrics.harness import harness_on_model
from ditty.metrics.mfu import utilization
from ditty.metrics.progress import format_record
from ditty.optim.schedule_free import evaluation_weights
from ditty.parallel.threads import slow_cpu_hint
from ditty.train.cadence import Due
from ditty.train.state import NonFiniteLossError
from ditty.train.step import StepOutput

log = logging.getLogger("ditty.train")


class StepRecords:
    def log_step(self, out: StepOutput, due: Due) -> None:
        """The step's record when one is due: metrics, then evaluation and lm-eval scores of the live model."""
        self.check_compile()
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

    def check_compile(self, *, at_end: bool = False) -> None:
        """Once, after this process's second step, or at the end of a shorter run: a `train.compile`
        that fell back to eager says so, with dynamo's reason (ditty.parallel.compile_report). Not the
        first step: dynamo compiles at the first forward it sees, and a custom model's first forward
        runs under the FLOP counter (mfu), where dynamo does not compile."""
        watch = getattr(self, "compile_watch", None)
        if watch is None or self.compile_report is not None:
            return
        self.compile_steps_seen = getattr(self, "compile_steps_seen", 0) + 1
        if self.compile_steps_seen < 2 and not at_end:
            return
        self.compile_report = watch.report()
        if self.compile_report.fell_back and is_main_process():
            log.warning(self.compile_report.warning(self.config.train.activation_checkpointing))

    def step_record(self, out: StepOutput) -> dict[str, Any]:
        """The metrics.jsonl record of this step: interval means, counters, and skip marks."""
        record: dict[str, Any] = {"step": self.state.step}
        interval = self.meter.flush()
        record.update(loss=interval.pop("loss"), lr=out.metrics.get("lr"), grad_norm=interval.pop("grad_norm"))
        record.update(tokens=self.state.tokens, **interval)
        # The step's own values only where the interval has no mean (a skipped step's, alone in its interval).
        record.update({k: v for k, v in out.metrics.items() if k != "lr" and k not in record})
        record.update(self.memory.record(self.model, self.optimizer))
        # Bad data rows left out (data.on_bad_rows = "skip"): up front, and by a stream's readers (collective).
        self.skipped_rows = self.data.skipped_rows + streamed_skipped_rows(self.stream)
        if self.skipped_rows:
            record["skipped_rows"] = self.skipped_rows
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
