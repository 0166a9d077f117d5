"""Train state the loop carries between steps, and the per-interval meter behind each log record."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ditty._utils.errors import RunFailure
from ditty.train.step import StepOutput


class NonFiniteLossError(RunFailure):  # reliability: a RunFailure prints without a traceback (exit code 1)
    """Too many consecutive steps had a non-finite loss or gradient: the run stops (exit code 1).

    Not a RecipeError: the recipe was valid, the numbers diverged. Nothing already written is touched.
    """


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps taken (skipped steps count: they consumed their data)."""
    tokens: int = 0
    """Cumulative non-padding tokens that entered the model (summed over ranks)."""
    skipped_steps: int = 0
    consecutive_skips: int = 0
    last_eval_step: Optional[int] = None
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    """The latest evaluation's metrics (val_loss, val_exact_match, ...)."""
    elapsed_s: float = 0.0
    """Training wall time of the run so far, resumed runs included (as of the last checkpoint)."""
    stopped_early: Optional[str] = None
    """What an evaluation met of `train.stop_when` ("val_exact_match 0.445 >= 0.4"): the run ends there."""
    start_metrics: dict[str, Any] = field(default_factory=dict)
    """The evaluation at step 0, when there was one: what a relative `train.stop_when` and the fall
    warning (ditty.train.fall) read later evaluations against."""
    fall_warned: bool = False

    def state_dict(self) -> dict:
        keys = (
            "step",
            "tokens",
            "skipped_steps",
            "consecutive_skips",
            "last_eval_step",
            "elapsed_s",
            "stopped_early",
            "start_metrics",
            "fall_warned",
        )
        return {k: self.__dict__[k] for k in keys}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


class IntervalMeter:
    """Averages of the steps since the last log record, and the throughput over that wall time.

    Means are over finite, non-skipped steps; a skipped step is reported on its own record.
    """

    def __init__(self, offset_s: float = 0.0) -> None:
        self.start = time.perf_counter() - offset_s  # a resumed run's clock continues from its checkpoint
        self._reset(time.perf_counter())

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def _reset(self, now: float) -> None:
        self.since = now
        self.loss = 0.0
        self.grad_norm = 0.0
        self.steps = 0
        self.tokens = 0
        self.extra: dict[str, float] = {}

    def add(self, out: StepOutput, tokens: int) -> None:
        self.tokens += tokens
        if out.skipped or not math.isfinite(out.loss):
            return
        self.steps += 1
        self.loss += out.loss
        self.grad_norm += out.grad_norm
        for key, value in out.metrics.items():
            if key != "lr":  # the schedule's value at the logged step, not a mean over the window
                self.extra[key] = self.extra.get(key, 0.0) + value

    def flush(self) -> dict[str, float]:
        """Means and tokens/s for the interval, then start a new one."""
        now = time.perf_counter()
        n = max(self.steps, 1)
        record = {
            "loss": self.loss / n if self.steps else float("nan"),
            "grad_norm": self.grad_norm / n if self.steps else float("nan"),
            "tokens_per_s": self.tokens / max(now - self.since, 1e-9),
            "elapsed_s": round(now - self.start, 3),
        }
        record.update({k: v / n for k, v in self.extra.items()})
        self._reset(now)
        return record


@dataclass
class TrainResult:
    """What `Trainer.train()` returns: where things went and the last evaluation."""

    run_dir: str
    final_dir: Optional[str]
    steps: int
    tokens: int
    skipped_steps: int
    elapsed_s: float
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    stopped_by: Optional[int] = None
    """The signal (SIGTERM, SIGINT) that preempted the run after a checkpoint, if any."""


@dataclass
class TrainRun:
    """What `Trainer.__init__` builds, one field per build step, typed in one place. Checkpointing,
    final/, the Hub push and evaluation take this object or the fields they need, never the trainer.
    The trainer's attributes of these names are the fields (`RunField`), so a subclass's
    `self.model` or `build_*` override reads and writes the same object."""

    config: Any
    components: Any = None
    """The Python objects that replace config sections (ditty.train.components.RuntimeComponents)."""
    plan: Any = None
    """The compiled recipe (ditty.recipe.compiled.Plan): accumulation steps, warnings."""
    runtime: Any = None
    resume: Any = None
    """The resume decision (ditty.train.resume.ResumePlan)."""
    engine: Any = None
    tokenizer: Any = None
    data: Any = None
    """The data mode (ditty.train.data_modes)."""
    model: Any = None
    """The model as the engine wrapped it."""
    converters: list = field(default_factory=list)
    stream: Any = None
    total_steps: int = 0
    optimizer: Any = None
    scheduler: Any = None
    precision: Any = None
    objective: Any = None
    """The objective's parts (ditty.objectives.parts.ObjectiveParts): loss, stream, evaluation, reference."""
    pipeline: Any = None
    """The step's stages (ditty.train.pipeline.StageChain)."""
    state: TrainState = field(default_factory=TrainState)
    meter: IntervalMeter = field(default_factory=IntervalMeter)
    checkpointer: Any = None
    run_dir: str = ""
    trainer_ref: Optional[str] = None
    """"pkg.mod:Class" of a Trainer subclass (recorded in recipe.toml and checkpoints), None for ditty's."""
    hub_token: Optional[str] = None


class RunField:
    """A Trainer attribute that is the field of the same name of its `TrainRun` (`trainer.run`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: Any = None) -> Any:
        return self if trainer is None else getattr(trainer.run, self.name)

    def __set__(self, trainer: Any, value: Any) -> None:
        setattr(trainer.run, self.name, value)
