"""How many torch threads a CPU process uses: a rule to start with, then, for a long single-process
run, a measurement of its first steps; and the hint when a CPU run is far slower than it should be.

Neither a fixed rule nor the model's size alone gets this right. On the 2-core machine ditty is
built on, tiny_sft widened to 3.4M parameters trained at 8,503 tokens/s on 2 threads and 4,622 on 1
while the machine was quiet (issue 43); the 0.7M demo ran at 176-271 tokens/s on 2 threads of two
busy cores, against thousands on 1. What decides is the size of the model's matrix products
together with what else holds the cores, and the second changes from run to run. So, unless
`run.num_threads` or OMP_NUM_THREADS says otherwise:
- a run starts on the rule's count (`choose_cpu_threads`): 1 for a model under
  SMALL_MODEL_PARAMETERS, else the cores other work leaves free (the 1-minute load average, less
  this process), shared among the processes of this node;
- a single-process run of at least TRIAL_MIN_STEPS planned steps then times whole optimizer steps
  (`ThreadTrial`): after TRIAL_WARMUP steps, alternately on all cores and on one, TRIAL_ROUNDS of
  each, and keeps the count with the lower median wall time; it says which and why, and records it
  in env.json. On this CPU the numbers do not depend on the count (a 4-layer Llama's weights after
  5 AdamW steps were bitwise equal on 1 and 2 threads, with a switch between them), so the choice
  costs nothing in reproducibility here; a BLAS that splits a reduction among threads may change
  the last bits elsewhere. Shorter runs (tests, smoke runs) keep the rule: a few steps on the slower
  count would cost more than the choice saves.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("ditty.parallel")

SMALL_MODEL_PARAMETERS = 20_000_000
"""Below this, a process starts on one thread: on busy cores the products of a model this small
(hidden size up to about 384) stall waiting for a second core far more than they gain from it."""

SLOW_MFU = 0.05
"""A CPU run below this model-FLOPs utilisation of the measured peak (the demo runs at about 30%
on one thread) is waiting on something other than arithmetic, most often oversubscribed cores."""

TRIAL_MIN_STEPS = 500
"""Fewer planned steps than this keep the rule's count: the trial's 8 steps, some of them on the
slower count, are at most 1.6% of a run this long (tests and smoke runs are shorter)."""
TRIAL_WARMUP = 2
"""Steps on the starting count before timing: the first carries allocations and lazy set-up; with
`train.compile` two more, where compiling (and a recompile) happens."""
TRIAL_ROUNDS = 3
"""Timed steps per candidate count; the medians are compared."""
CLEAR_LOSS_S = 1.0
"""A candidate whose first timed step is at least twice as long as the other's, and longer by this
many seconds, loses at once: a large model spends one slow step on one thread, not three, and a
tiny one on busy cores one stalled step on all of them (2,064 ms against 72 ms on one, measured)."""


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str
    """Why, in words for the screen; "" when nothing needs saying (the user's choice, or all cores)."""


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_cores(cores: int) -> int:
    """Cores other processes keep busy: the 1-minute load average less this process's own one."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0
    return max(0, min(cores, round(load - 1.0)))


def user_threads(requested: int) -> Optional[int]:
    """The count the user set: `run.num_threads`, else OMP_NUM_THREADS; None when neither is set."""
    if requested:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return None


def choose_cpu_threads(
    requested: int, *, parameters: Optional[int], local_processes: int = 1, busy: Optional[int] = None
) -> ThreadChoice:
    """The torch thread count a CPU process starts on: `requested` (run.num_threads) when set, else
    OMP_NUM_THREADS when set, else 1 for a small model, else the free cores shared among the
    `local_processes` of this node."""
    chosen = user_threads(requested)
    if chosen is not None:
        return ThreadChoice(chosen, "")
    cores = available_cores()
    share = max(1, cores // max(1, local_processes))
    if share == 1:
        return ThreadChoice(1, "")
    if parameters is not None and parameters < SMALL_MODEL_PARAMETERS:
        return ThreadChoice(
            1,
            f"CPU threads: 1 per process for a {parameters / 1e6:.1f}M-parameter model (set run.num_threads "
            f"to choose; one process training {TRIAL_MIN_STEPS} steps or more times 1 thread against {share})",
        )
    busy = busy_cores(cores) if busy is None else busy
    free = max(1, (cores - busy) // max(1, local_processes))
    if free < share:
        return ThreadChoice(
            free,
            f"CPU threads: {free} per process, as other work keeps {busy} of {cores} cores busy "
            "(set run.num_threads to choose)",
        )
    return ThreadChoice(share, "")


def trial_applies(requested: int, planned_steps: Optional[int]) -> bool:
    """Whether this process times its first steps (ThreadTrial): no count set by the user, one
    process in the run, more than one core, and a run long enough (or of unknown length: epochs)."""
    single = int(os.environ.get("WORLD_SIZE", "1")) == 1 and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) == 1
    long_enough = planned_steps is None or planned_steps >= TRIAL_MIN_STEPS
    return user_threads(requested) is None and single and available_cores() > 1 and long_enough


def apply_cpu_threads(
    config: Any,
    parameters: Optional[int],
    *,
    announce: bool,
    model: Any = None,
    planned_steps: Optional[int] = None,
    accumulation: int = 1,
) -> ThreadChoice:
    """Choose (choose_cpu_threads) and set torch's thread count for this CPU process; with `model`,
    a run the trial applies to (trial_applies) also times its first steps on 1 thread and on all
    cores (ThreadTrial). Prints why on the screen when `announce` (rank 0)."""
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    choice = choose_cpu_threads(config.run.num_threads, parameters=parameters, local_processes=local)
    torch.set_num_threads(choice.threads)
    if model is not None and trial_applies(config.run.num_threads, planned_steps):
        trial = ThreadTrial(
            model,
            cores=available_cores(),
            accumulation=accumulation,
            announce=announce,
            run_dir=config.run.output_dir,
            warmup=TRIAL_WARMUP + (2 if config.train.compile else 0),
        )
        if announce:
            print(
                f"CPU threads: timing the first steps on {trial.cores} threads and on 1, to keep the faster "
                "(set run.num_threads to choose)",
                flush=True,
            )
    elif announce and choice.reason:
        print(choice.reason, flush=True)
    return choice


class ThreadTrial:
    """A forward pre-hook on the model that times whole optimizer steps (from the first micro-batch's
    forward of one step to the next step's), after TRIAL_WARMUP steps on the starting count,
    alternately on all cores and on one, then sets the faster count and removes itself.

    A step during which the model also ran without gradients (an evaluation, generation) is not a
    training step's time: it is dropped and that candidate timed again, up to a limit, after which
    the medians of what was timed decide (or, with nothing timed on one of them, the starting count
    stays)."""

    def __init__(
        self,
        model: Any,
        *,
        cores: int,
        accumulation: int = 1,
        announce: bool = True,
        run_dir: str = "",
        clock: Callable[[], float] = time.perf_counter,
        warmup: int = TRIAL_WARMUP,
    ) -> None:
        import torch

        self.clock = clock
        """Wall time: a step's time is what the user waits for, other jobs' share of the cores included."""
        self.cores = cores
        self.accumulation = max(1, accumulation)
        self.announce = announce
        self.run_dir = run_dir
        """Where env.json gets the choice ("" for none)."""
        self.warmup = warmup
        self.start = torch.get_num_threads()
        self.schedule = [cores, 1] * TRIAL_ROUNDS
        self.times: dict[int, list[float]] = {cores: [], 1: []}
        self.forwards = 0
        self.steps_started = 0
        self.retries_left = 2 * TRIAL_ROUNDS
        self.running: Optional[int] = None  # the count of the step being timed; None in warm-up
        self.started_at: Optional[float] = None
        self.interrupted = False
        self.result: Optional[ThreadChoice] = None
        # Eager even where the model is compiled whole (compile_scope = "model"): the hook reads a clock
        # and sets the thread count, which a compiled graph cannot hold (dynamo would break the graph).
        self.handle = model.register_forward_pre_hook(torch.compiler.disable(self._on_forward))

    def _on_forward(self, module: Any, args: Any) -> None:
        import torch

        if not (module.training and torch.is_grad_enabled()):
            self.interrupted = True
            return
        self.forwards += 1
        if (self.forwards - 1) % self.accumulation:
            return  # not the first micro-batch of a step
        now = self.clock()
        if self.running is not None:
            if not self.interrupted:
                self.times[self.running].append(now - self.started_at)
            elif self.retries_left:
                self.retries_left -= 1
                self.schedule.append(self.running)
        self.started_at, self.interrupted = now, False
        self.steps_started += 1
        if self.steps_started <= self.warmup:
            return
        winner = self._clear_winner()
        if winner is None and self.schedule:
            self.running = self.schedule.pop(0)
            torch.set_num_threads(self.running)
            return
        self._finish(winner)

    def _clear_winner(self) -> Optional[int]:
        many, one = self.times[self.cores], self.times[1]
        if many and one:
            slow, fast = (one, many) if one[0] > many[0] else (many, one)
            if slow[0] - fast[0] >= CLEAR_LOSS_S and slow[0] >= 2 * fast[0]:
                return self.cores if slow is one else 1
        return None

    def _finish(self, winner: Optional[int]) -> None:
        import torch

        self.handle.remove()
        many, one = self.times[self.cores], self.times[1]
        if winner is None and many and one:
            winner = self.cores if statistics.median(many) <= statistics.median(one) else 1
        if winner is None:  # every timed step of a count was interrupted: keep what the run started on
            self.result = ThreadChoice(
                self.start,
                f"CPU threads: {self.start}, the starting count: no training step could be timed alone on both "
                "counts (evaluations or generation in every step; set run.num_threads to choose)",
            )
        else:
            timed = ", ".join(f"{_ms(self.times[n])} on {n}" for n in sorted(self.times, reverse=True) if self.times[n])
            steps = sum(len(t) for t in self.times.values())
            self.result = ThreadChoice(
                winner,
                f"CPU threads: {winner}, the faster over {steps} timed steps (median step {timed}; "
                "set run.num_threads to choose)",
            )
        torch.set_num_threads(self.result.threads)
        if self.announce:
            from tqdm import tqdm  # above a progress bar without breaking it

            tqdm.write(self.result.reason)
            if self.run_dir:
                from ditty._utils.run_dir import add_to_env

                add_to_env(self.run_dir, {"torch_threads": self.result.threads, "threads_chosen": self.result.reason})


def _ms(times: list[float]) -> str:
    return f"{1000 * statistics.median(times):,.0f} ms"


def slow_cpu_hint(record: dict, device_type: str) -> Optional[str]:
    """A line for the screen when a CPU run's logged throughput is far below what its cores can do
    (model-FLOPs utilisation under SLOW_MFU), pointing at the thread setting; None otherwise."""
    mfu = record.get("mfu")
    if device_type != "cpu" or mfu is None or mfu >= SLOW_MFU or "tokens_per_s" not in record:
        return None
    import torch

    threads = torch.get_num_threads()
    cores = available_cores()
    busy = busy_cores(cores)
    advice = "try --run.num_threads 1" if threads > 1 else "fewer processes, or a machine less busy"
    return (
        f"slow: {record['tokens_per_s']:,.0f} tokens/s is {100 * mfu:.1f}% of this CPU's measured peak "
        f"({threads} torch thread(s) per process on {cores} cores, {busy} busy with other work); {advice}"
    )
