"""The trainer's side of checkpoints: what a checkpoint holds, saving and restoring it, preemption.

`ditty.checkpoint` knows how to write and read a checkpoint safely; this module knows what the
trainer puts in one and when; whether a run resumes is decided before (ditty.train.resume).
Preemption: SIGTERM/SIGINT set a flag; the loop finishes the step it is in, saves a checkpoint
and stops (the trainer's `train()` asks `stop_requested` after each step).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional

from ditty._utils.dist import is_main_process
from ditty._utils.errors import UserInterrupt
from ditty.checkpoint import lineage
from ditty.checkpoint.resume_diff import SIDECAR_DATA_FILES, SIDECAR_RECIPE, flatten_recipe, jsonable
from ditty.config.errors import RecipeError
from ditty.train.resume import ResumePlan, doc_labels, same_stop_condition

log = logging.getLogger("ditty.train")


# ---------------------------------------------------------------------------- saving and loading


class Checkpointer:
    """Saves and restores the built run (ditty.train.state.TrainRun) through a `CheckpointManager`;
    what holds the model and optimizer tensors is the engine's business (ditty's DCP, or the engine's
    own files). A step inside a streak of non-finite steps is never saved (ditty.checkpoint.finite)."""

    def __init__(self, config: Any, engine: Any, resume: ResumePlan) -> None:
        from ditty.checkpoint import CheckpointManager
        from ditty.data.fingerprint import data_fingerprints

        self.config = config
        self.engine = engine
        self.resume = resume
        cfg = config.checkpoint
        self.manager = CheckpointManager(
            config.run.output_dir, keep_last=cfg.keep_last, async_save=cfg.async_save and engine.async_save
        )
        self.finite = self.manager.finite
        self.last_saved_step: Optional[int] = None
        # The data as it is when the run starts (the rows it tokenised), recorded in every checkpoint.
        self.data_files = data_fingerprints(config.data) if is_main_process() else {}
        self.stop_signal: Optional[int] = None
        self._old_handlers: dict[int, Any] = {}

    def app_state(self, run: Any) -> dict:
        adapter = self.config.peft.kind != "none"
        return self.engine.checkpoint_state(run.model, run.optimizer, trainable_only=adapter)

    def sidecar(self, run: Any) -> dict:
        recipe_path = os.path.join(self.config.run.output_dir, "recipe.toml")
        recipe_text = None
        if is_main_process() and os.path.isfile(recipe_path):
            with open(recipe_path, encoding="utf-8") as f:
                recipe_text = f.read()
        return {
            # elapsed_s: a resumed run's training wall time continues from it
            "train_state": {**run.state.state_dict(), "elapsed_s": round(run.meter.elapsed_s, 3)},
            "scheduler": jsonable(run.scheduler.state_dict()),
            "data": run.stream.state_dict(),
            "precision": jsonable(run.precision.state_dict()),
            "total_steps": run.total_steps,
            "trainer": run.trainer_ref,
            lineage.RUN_ID: self.resume.run_id,  # which run wrote it (ditty.checkpoint.lineage)
            SIDECAR_RECIPE: flatten_recipe(run.config, run.trainer_ref),
            SIDECAR_DATA_FILES: self.data_files,
            "recipe_toml": recipe_text,
            # A classifier's label set, which sizes its head: `ditty export` rebuilds the model from it.
            "labels": run.data.labels.to_json() if run.data.labels is not None else None,
        }

    def save(self, run: Any) -> Path:
        from ditty.optim.schedule_free import evaluation_weights

        with evaluation_weights(run.optimizer):  # schedule-free: save the weights to evaluate (x)
            path = self.manager.save(
                run.state.step,
                self.app_state(run),
                self.sidecar(run),
                write_extra=self.engine.checkpoint_writer(run.model),
            )
        self.last_saved_step = run.state.step
        return path

    def save_if_due(self, run: Any, due: bool) -> bool:
        """Save this step when `due` (or a save put off by a non-finite streak waits) and the step is
        finite, unless it has its checkpoint already. Whether it saved."""
        if self.finite.save_now(due) and run.state.step != self.last_saved_step:
            self.save(run)
            return True
        return False

    def observe(self, step: int, skipped: bool) -> None:
        """After each step: a skipped one starts or extends a streak, whose checkpoint before it is kept."""
        self.finite.observe(step, skipped, self.last_saved_step)

    def restore(self, run: Any) -> None:
        """Load the planned checkpoint into the built run; RNG last. Prints where it resumed."""
        if self.resume.checkpoint is None:
            return
        from ditty.checkpoint import read_sidecar

        saved_labels, labels = doc_labels(read_sidecar(self.resume.checkpoint)), run.data.labels
        if saved_labels is not None and labels is not None and saved_labels != labels.to_json():
            raise RecipeError.single(
                f"checkpoint {self.resume.checkpoint} was trained on the labels {saved_labels['names']}; "
                f"the data now has {list(labels.names)}",
                key="data",
                fix='resume on the data the checkpoint was trained on, or start afresh (checkpoint.resume = "never")',
            )
        doc = self.manager.load(self.resume.checkpoint, self.app_state(run))
        self.engine.load_checkpoint_files(run.model, self.resume.checkpoint)
        run.state.load_state_dict(doc["train_state"])
        if not same_stop_condition(doc, self.config):
            run.state.stopped_early = None  # another train.stop_when: checked at the next evaluation
        if doc.get("data") is not None:
            run.stream.load_state_dict(doc["data"])
        elif run.state.step:
            log.warning("the data stream has no saved position: the resumed run restarts its data from the beginning")
        run.precision.load_state_dict(doc.get("precision") or {})
        # ClosedFormLR keeps only the step count and writes that step's rate into the optimizer, so
        # a longer train.steps takes effect here (the schedule is the new recipe's, at this step).
        run.scheduler.load_state_dict(doc["scheduler"])
        self.manager.restore_rng(doc)
        self.last_saved_step = run.state.step
        if is_main_process():
            print(f"resumed from step {run.state.step} ({self.resume.checkpoint})", flush=True)

    def wait(self) -> None:
        """Until a background save is on disk."""
        self.manager.wait()

    def describe_kept(self) -> Optional[str]:
        """The complete checkpoints on disk, in words (for the message of a failed final/ write)."""
        return self.manager.describe_kept()

    def close(self) -> None:
        self.restore_signals()
        self.manager.close()  # waits for a pending background save

    # ---- preemption ------------------------------------------------------------------------

    def install_signals(self) -> None:
        """SIGTERM/SIGINT: finish the current step, save, stop. Main thread only (Python's rule)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is not None and signum == signal.SIGINT:
            raise UserInterrupt  # a second Ctrl-C: stop now, without the checkpoint
        self.stop_signal = signum
        if is_main_process():
            print(f"\nreceived {signal_name(signum)}: finishing this step, then saving a checkpoint", flush=True)

    def stop_requested(self) -> bool:
        """Whether any rank was signalled (one small all-reduce per step when there are several).
        Every rank then takes the signal a peer got, so a SIGTERM sent to one worker stops all of them
        with the same message and exit code."""
        from ditty.checkpoint import comm

        if comm.world_size(self.manager.group) > 1:
            signalled = comm.all_max(int(self.stop_signal or 0), self.manager.group)
            if signalled and self.stop_signal is None:
                self.stop_signal = signalled
            return bool(signalled)
        return self.stop_signal is not None


def signal_name(signum: Optional[int]) -> str:
    """SIGTERM for 15; a number outside the `signal.Signals` table (or None) is said as such, never raised."""
    try:
        return signal.Signals(int(signum)).name  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"signal {signum}"


def preempted_message(step: int, run_dir: str, signum: Optional[int]) -> str:
    return (
        f"stopped by {signal_name(signum)} after step {step}; checkpoint saved in "
        f"{os.path.join(run_dir, 'checkpoints')}. To resume, run the same command again "
        f"(`ditty run <same recipe>` resumes automatically from the newest checkpoint)."
    )
