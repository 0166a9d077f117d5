"""Test-only pipeline stages for the fault-injection suite, driven by environment variables so that
the same recipe runs clean when they are unset (a rerun then has an identical recipe).

- `Pace`: sleeps DITTY_TEST_STEP_SLEEP seconds per training micro-batch (a run slow enough to be
  caught in the middle by another process).
- `NaNFrom`: from 0-based optimizer step DITTY_TEST_NAN_FROM on (to DITTY_TEST_NAN_UNTIL, exclusive,
  if set), the logits become NaN: a streak of non-finite steps.
- `StopInSave` (a trainer, named at the top of a recipe): one rank stops itself as a save begins.
- `InterruptInSave` (a trainer): a Ctrl-C as a save begins and a second one inside it.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from ditty._utils.dist import rank
from ditty.processors import PostProcessor, PreProcessor
from ditty.train.trainer import Trainer


class Pace(PreProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.seconds = float(os.environ.get("DITTY_TEST_STEP_SLEEP", "0") or 0)

    def process(self, batch, ctx):
        if self.seconds and ctx.get("training"):
            time.sleep(self.seconds)
        return batch, ctx


class NaNFrom(PostProcessor):
    def __init__(self) -> None:
        super().__init__()
        start = os.environ.get("DITTY_TEST_NAN_FROM")
        until = os.environ.get("DITTY_TEST_NAN_UNTIL")
        self.start = int(start) if start else None
        self.until = int(until) if until else None

    def process(self, model_output, ctx):
        step = ctx.get("step")
        if (
            self.start is not None
            and ctx.get("training")
            and step >= self.start
            and (self.until is None or step < self.until)
        ):
            model_output.logits = model_output.logits * torch.tensor(float("nan"))
        return model_output, ctx


class StopInSave(Trainer):
    """Rank DITTY_TEST_STOP_RANK stops itself (SIGSTOP) as the checkpoint of step DITTY_TEST_STOP_AT_STEP
    begins, while its peers go on into the save's collectives."""

    def save(self, final: bool = False):
        at = os.environ.get("DITTY_TEST_STOP_AT_STEP")
        if at and not final and self.state.step == int(at) and rank() == int(os.environ["DITTY_TEST_STOP_RANK"]):
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().save(final)


class InterruptInSave(Trainer):
    """Two Ctrl-Cs at the save of step DITTY_TEST_INTERRUPT_AT_STEP: the first as it begins (the run
    asks to stop after this save), the second from inside DCP's write of the shards."""

    def save(self, final: bool = False):
        at = os.environ.get("DITTY_TEST_INTERRUPT_AT_STEP")
        if not (at and not final and self.state.step == int(at)):
            return super().save(final)
        from torch.distributed.checkpoint import FileSystemWriter

        original = FileSystemWriter.write_data

        def write_data(writer, plan, planner):
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, inside the save
            time.sleep(1)  # the handler runs here
            return original(writer, plan, planner)

        os.kill(os.getpid(), signal.SIGINT)
        FileSystemWriter.write_data = write_data
        try:
            return super().save(final)
        finally:
            FileSystemWriter.write_data = original
