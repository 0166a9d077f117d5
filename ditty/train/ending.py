"""How a run saves and ends: periodic checkpoints and the final save (checkpoint, final/, lm-eval
scores, the Hub push); preempted by a signal, already finished, or done; closing the sinks; the result.

A mixin of `Trainer` (these are steps a subclass may replace like any other); it reads the trainer's
built state.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Optional

import torch

from ditty._utils.dist import is_main_process
from ditty.metrics import plot_run
from ditty.metrics.harness import score_final_model
from ditty.train import checkpointing
from ditty.train.final import write_final
from ditty.train.push import push_checkpoint_snapshot, push_to_hub
from ditty.train.state import NonFiniteLossError, TrainResult

log = logging.getLogger("ditty.train")


class RunEnding:
    def save(self, final: bool = False) -> Optional[str]:
        """Periodic: a checkpoint every `checkpoint.every` steps (and a Hub push with push =
        "checkpoints"). Final: `final/` in Hugging Face format on rank 0, a checkpoint of the last
        step (so a longer `train.steps` can continue it), and the Hub push with push = "end"/"checkpoints"."""
        push = self.config.hub.push
        if not final:  # a periodic checkpoint (ditty.train.cadence) or a timed one (checkpoint.every_minutes)
            due = self.cadence.saves_at(self.state.step)
            due = self.save_clock_due() or due  # every rank reads the clock on the same steps
            if self.checkpointer.save_if_due(self.run, due):  # saves wait for a finite step
                self.save_clock.saved()
                if push == "checkpoints" and not self.should_stop():  # the last step pushes final/ instead
                    push_checkpoint_snapshot(self.run)
            return None
        # The last checkpoint first, and final/ only once it is safe on disk: a failed final/ write then
        # loses nothing (a rerun resumes at the last step and writes final/ again). A last step skipped
        # as non-finite gets no checkpoint (its weights are the last finite step's, which final/ holds).
        self.refuse_non_finite_end()
        self.checkpointer.save_if_due(self.run, True)
        self.checkpointer.wait()
        from ditty.optim.schedule_free import evaluation_weights

        with evaluation_weights(self.optimizer):  # final/ holds schedule-free's averaged weights
            path = write_final(self.run)
        if self.config.eval.harness_tasks:  # lm-eval scores of final/, before the push
            self.log({"step": self.state.step, **score_final_model(self.run, path)})
        if push in ("end", "checkpoints"):
            push_to_hub(self.run, path, message=f"ditty: final model, step {self.state.step}")
        return path

    def refuse_non_finite_end(self) -> None:
        """A run whose last steps were skipped as non-finite, or whose last evaluation is not finite,
        diverged: final/ would hold a model that gives NaN, so none is written and the run fails
        (exit code 1), even when its steps ran out before `train.max_skipped_steps` in a row."""
        state, gate = self.state, self.checkpointer.finite
        fix = (
            'Try a lower optimizer.lr, gradient clipping (train.max_grad_norm), or train.precision = "fp32". '
            f"Files already in {self.config.run.output_dir} are kept; no final model was written."
        )
        if state.consecutive_skips:
            first = state.step - state.consecutive_skips + 1
            steps = f"step {first}" if first == state.step else f"steps {first}-{state.step}"
            raise NonFiniteLossError(
                f"stopping: the run ended inside a streak of {state.consecutive_skips} non-finite steps ({steps}), "
                f"so its weights are those of a diverging run. {gate.last_good(self.run_dir)}. {fix}"
            )
        if state.last_eval_step == state.step:
            # The loss and the reward are the model's own numbers; a task metric (F1 of an absent class)
            # may be NaN on a healthy model.
            broken = {
                k: v
                for k, v in state.eval_metrics.items()
                if (k == "val_loss" or k.startswith("val_reward")) and isinstance(v, float) and not math.isfinite(v)
            }
            if broken:
                shown = ", ".join(f"{k} {v}" for k, v in broken.items())
                raise NonFiniteLossError(
                    f"stopping: the last evaluation (step {state.step}) is not finite ({shown}), so the model "
                    f"diverged. {fix}"
                )

    def save_clock_due(self) -> bool:
        """`checkpoint.every_minutes` passed since the last save (ditty.checkpoint.clock), read at log
        steps, where the ranks agree on it with one small all-reduce."""
        from ditty.train.step import all_reduce_sum

        log_every = self.config.train.log_every or 1
        if self.state.step % log_every:
            return False
        device = self.runtime.device
        return self.save_clock.due(lambda late: bool(all_reduce_sum(torch.tensor(float(late), device=device)) > 0))

    def preempt(self) -> TrainResult:
        """A signal asked to stop: the step is done; save a checkpoint (and wait for it), say how to resume."""
        # A step inside a non-finite streak is not saved: the newest checkpoint stays the resume point.
        self.checkpointer.save_if_due(self.run, True)
        self.checkpointer.wait()
        signum = self.checkpointer.stop_signal
        if is_main_process():
            print(checkpointing.preempted_message(self.state.step, self.run_dir, signum), flush=True)
        result = self.result(None)
        result.stopped_by = signum
        return result

    def finished(self) -> TrainResult:
        """`resume = "auto"` on a finished run: report it, touch nothing."""
        self.run_lock.release()
        out = self.config.run.output_dir
        final = os.path.join(out, "final")
        # The Python API's load_checkpoint=True already sets overwrite_finished: no flag to advise there.
        replace_final = (
            "" if self.config.checkpoint.overwrite_finished else " and add --checkpoint.overwrite_finished true"
        )
        if is_main_process():
            print(
                f"{out} is a finished run (step {self.resume.step}, {final}); nothing to do. "
                f"To train further, {self.further()}{replace_final} (final/ is replaced); to start afresh, "
                "choose a new run.output_dir."
            )
        return TrainResult(
            run_dir=out, final_dir=final, steps=self.resume.step, tokens=0, skipped_steps=0, elapsed_s=0.0
        )

    def further(self) -> str:
        """How a finished run trains further: more steps, or (it met train.stop_when) another condition."""
        steps = self.config.train.steps  # a finished run builds nothing: no total_steps
        if self.config.train.stop_when and (steps is None or self.resume.step < steps):
            return (
                f"change train.stop_when (it was met: {self.config.train.stop_when!r}) with "
                "--checkpoint.force_resume true"
            )
        return "raise train.steps"

    def close(self) -> None:
        """Wait for a pending checkpoint save and close the sinks, then draw curves.png; also after
        an error (the metrics so far are kept)."""
        try:
            self.checkpointer.close()
        finally:
            stream = self.run.stream  # None when the build failed before the stream
            if stream is not None:  # dataloader workers end with the run, not when it is collected
                stream.close()
            self.progress.close()
            self.logger.close()
            self.run_lock.release()  # the run directory is free for the next run
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
        self.check_compile(at_end=True)  # a run too short for the check after its second step
        if self.compile_report is not None:  # counted again: evaluation and later shapes compile more
            print(self.compile_watch.report().summary())
        if self.state.stopped_early and result.steps < self.total_steps:
            print(f"stopped before train.steps ({self.total_steps}): {self.state.stopped_early} (train.stop_when)")
        skipped = getattr(self, "skipped_rows", self.data.skipped_rows)  # as of the last record (a stream's too)
        if skipped:
            print(f'skipped {skipped} bad data rows (data.on_bad_rows = "skip")')
        print(f"model saved to {result.final_dir}")
