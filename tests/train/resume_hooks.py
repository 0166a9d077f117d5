"""Test-only pipeline stage that signals its own process at a chosen (step, micro-step).

Named in a recipe as `tests.train.resume_hooks:SignalAt`; it reads DITTY_TEST_SIGNAL_AT =
"STEP:MICRO:SIGNAL" (0-based optimizer step, 0-based micro-step, e.g. "6:1:KILL"), so the same
recipe runs uninterrupted when the variable is unset. Deterministic: no timing involved.
"""

from __future__ import annotations

import os
import signal

from ditty.processors import PreProcessor

ENV = "DITTY_TEST_SIGNAL_AT"


class SignalAt(PreProcessor):
    def __init__(self) -> None:
        super().__init__()
        spec = os.environ.get(ENV)
        self.at = None
        if spec:
            step, micro, name = spec.split(":")
            self.at = (int(step), int(micro), getattr(signal, f"SIG{name}"))
        self.sent = False

    def process(self, batch, ctx):
        if self.at and not self.sent and ctx.get("training") and (ctx["step"], ctx["micro_step"]) == self.at[:2]:
            self.sent = True
            os.kill(os.getpid(), self.at[2])
        return batch, ctx


# DITTY_TEST_KILL_IN_SAVE=N: the N-th checkpoint write of this process (1-based) writes its data
# files, then the process kills itself with SIGKILL inside the writer, before DCP's .metadata.
KILL_IN_SAVE = "DITTY_TEST_KILL_IN_SAVE"
if os.environ.get(KILL_IN_SAVE):
    from torch.distributed.checkpoint import FileSystemWriter

    _original_write_data = FileSystemWriter.write_data
    _writes = {"n": 0}

    def _write_data_then_die(self, plan, planner):
        _writes["n"] += 1
        result = _original_write_data(self, plan, planner)
        if _writes["n"] == int(os.environ[KILL_IN_SAVE]):
            if hasattr(result, "wait"):
                result.wait()  # the shards are on disk: the process dies in the middle of the save
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    FileSystemWriter.write_data = _write_data_then_die
