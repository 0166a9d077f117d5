"""The demo on a small or busy CPU: a thread count that does not oversubscribe the cores, said on the
screen; a long run that times its first steps on all cores and on one and keeps the faster; and a hint
pointing at `run.num_threads` when a run is far slower than its cores allow."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.config.loader import load_recipe
from ditty.parallel import threads
from ditty.parallel.threads import TRIAL_MIN_STEPS, ThreadTrial, choose_cpu_threads, slow_cpu_hint

SHORT = ["--train.steps", "4", "--data.num_samples", "2000", "--train.eval_samples", "8"]
SHORT += ["--scheduler.warmup_steps", "1", "--logging.progress", "false"]


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_tiny_sft_leaves_the_thread_count_to_ditty():
    """No pin: its 1,200 steps time 1 thread against all cores (ThreadTrial)."""
    assert load_recipe("tiny_sft").config.run.num_threads == 0


def test_small_models_and_busy_cores_get_one_thread(two_cores):
    small = choose_cpu_threads(0, parameters=722_816, busy=0)
    assert small.threads == 1 and "0.7M-parameter model" in small.reason
    busy = choose_cpu_threads(0, parameters=100_000_000, busy=1)
    assert busy.threads == 1 and "other work keeps 1 of 2 cores busy" in busy.reason
    idle = choose_cpu_threads(0, parameters=100_000_000, busy=0)
    assert idle.threads == 2 and idle.reason == ""
    assert choose_cpu_threads(0, parameters=100_000_000, local_processes=2, busy=0).threads == 1
    assert choose_cpu_threads(2, parameters=722_816, busy=1) == threads.ThreadChoice(2, "")


@pytest.mark.slow  # a short run of the demo recipe: ~15 s, more on a busy machine
def test_run_without_a_thread_setting_picks_one_and_says_so(tmp_path, capsys, two_cores):
    out = tmp_path / "run"
    code = main(["run", "tiny_sft", "--run.num_threads", "0", "--run.output_dir", str(out), *SHORT])
    assert code == 0
    printed = capsys.readouterr().out
    assert "CPU threads: 1 per process for a 0.7M-parameter model (set run.num_threads to choose" in printed
    assert "timing the first steps" not in printed  # 4 steps: too short to time 1 thread against 2
    assert json.loads((out / "env.json").read_text())["torch_threads"] == 1


@pytest.mark.slow
def test_a_run_far_below_the_cpu_peak_points_at_the_thread_setting(tmp_path, capsys, two_cores):
    """A peak of 1000 TFLOP/s makes any CPU run read as far below it, as an oversubscribed one is."""
    out = tmp_path / "run"
    args = ["--run.num_threads", "2", "--logging.peak_tflops", "1000", "--train.log_every", "1"]
    assert main(["run", "tiny_sft", "--run.output_dir", str(out), *SHORT, *args]) == 0
    err = capsys.readouterr().err
    assert err.count("slow: ") == 1  # once, not on every record
    assert "2 torch thread(s) per process" in err and "try --run.num_threads 1" in err


class StepClock:
    """Wall time as a table of step lengths: each training step (counted at its first forward) takes
    the time the thread count it runs on is given, so the trial's decisions are deterministic."""

    def __init__(self, seconds_by_threads: dict[int, list[float]]):
        self.now, self.seconds = 0.0, {n: list(v) for n, v in seconds_by_threads.items()}
        self.counts: list[int] = []
        """The thread count each step ran on."""

    def step(self, module, batch: torch.Tensor, *, accumulation: int = 1, evaluate: bool = False) -> None:
        """One optimizer step of `accumulation` forwards (and an evaluation forward after it)."""
        for _ in range(accumulation):
            module(batch)
        if evaluate:
            with torch.no_grad():
                module(batch)
        self.counts.append(torch.get_num_threads())
        self.now += self.seconds[self.counts[-1]].pop(0)

    def __call__(self) -> float:
        return self.now


def trial_on(clock: StepClock, accumulation: int = 1) -> tuple[torch.nn.Module, ThreadTrial]:
    module = torch.nn.Linear(4, 4).train()
    return module, ThreadTrial(module, cores=2, accumulation=accumulation, announce=False, clock=clock)


def test_the_trial_alternates_after_the_warm_up_and_keeps_the_lower_median(two_cores):
    torch.set_num_threads(1)  # the rule's start for a small model
    # warm-up on 1, then 2, 1, 2, 1, 2, 1: two threads take 60-90 ms a step, one thread 100-110
    clock = StepClock({1: [0.5, 0.2, 0.10, 0.11, 0.10], 2: [0.09, 0.06, 0.07]})
    module, trial = trial_on(clock)
    for _ in range(8):
        clock.step(module, torch.ones(1, 4))
    assert trial.result is None  # the 8th step's time is known when the 9th starts
    module(torch.ones(1, 4))
    assert clock.counts == [1, 1, 2, 1, 2, 1, 2, 1]
    assert trial.times == {2: pytest.approx([0.09, 0.06, 0.07]), 1: pytest.approx([0.10, 0.11, 0.10])}
    assert trial.result.threads == 2 and torch.get_num_threads() == 2
    assert "CPU threads: 2, the faster over 6 timed steps (median step 70 ms on 2, 100 ms on 1" in trial.result.reason
    assert not module._forward_pre_hooks  # removed: later steps run untouched


def test_a_clearly_slower_count_loses_after_one_step(two_cores):
    """A large model on one thread: one 8 s step against 1 s on two is enough."""
    torch.set_num_threads(2)
    clock = StepClock({2: [3.0, 1.0, 1.0], 1: [8.0]})
    module, trial = trial_on(clock)
    for _ in range(4):
        clock.step(module, torch.ones(1, 4))
    module(torch.ones(1, 4))
    assert trial.result.threads == 2 and trial.times == {2: [1.0], 1: [8.0]}
    assert clock.seconds[1] == []  # no second step on one thread


def test_a_step_with_an_evaluation_in_it_is_timed_again(two_cores):
    """A no-grad forward (evaluation, generation) inside a timed step: that step does not count."""
    torch.set_num_threads(1)
    clock = StepClock({1: [0.5, 0.5, 0.3, 0.3, 0.3], 2: [0.9, 0.2, 0.2, 0.2, 0.2]})
    module, trial = trial_on(clock)
    clock.step(module, torch.ones(1, 4))
    clock.step(module, torch.ones(1, 4))
    clock.step(module, torch.ones(1, 4), evaluate=True)  # the first timed step, on 2 threads: 0.9 s
    while trial.result is None:
        clock.step(module, torch.ones(1, 4))
    assert clock.counts == [1, 1, 2, 1, 2, 1, 2, 1, 2, 2]  # the dropped step's count once more at the end
    assert trial.times[2] == pytest.approx([0.2, 0.2, 0.2]) and trial.times[1] == pytest.approx([0.3, 0.3, 0.3])
    assert trial.result.threads == 2


def test_steps_that_always_generate_keep_the_starting_count(two_cores):
    """RL-like steps (a no-grad forward in every one) cannot be timed: after the retries, the start stays."""
    torch.set_num_threads(1)
    clock = StepClock({1: [0.1] * 20, 2: [0.1] * 20})
    module, trial = trial_on(clock)
    while trial.result is None:
        clock.step(module, torch.ones(1, 4), evaluate=True)
    assert trial.times == {2: [], 1: []} and trial.result.threads == 1 == torch.get_num_threads()
    assert "the starting count" in trial.result.reason


def test_with_accumulation_a_step_is_all_its_micro_batches(two_cores):
    torch.set_num_threads(1)
    clock = StepClock({1: [0.5, 0.5, 0.4, 0.4, 0.4], 2: [0.5, 0.5, 0.5]})
    module, trial = trial_on(clock, accumulation=3)
    for _ in range(8):
        clock.step(module, torch.ones(1, 4), accumulation=3)
    module(torch.ones(1, 4))
    assert trial.forwards == 3 * 8 + 1
    assert trial.result.threads == 1 and trial.times[1] == pytest.approx([0.4, 0.4, 0.4])


@pytest.mark.slow  # a 100-step run of a shrunken demo: ~10 s
def test_a_long_run_without_a_thread_setting_times_both_and_records_the_choice(tmp_path, capsys, two_cores):
    out = tmp_path / "run"
    small = (
        "{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1, num_attention_heads = 2, "
        "num_key_value_heads = 2, max_position_embeddings = 64, tie_word_embeddings = false }"
    )
    args = ["--run.num_threads", "0", "--run.output_dir", str(out), "--model.config", small]
    args += ["--train.steps", str(TRIAL_MIN_STEPS), "--train.global_batch_size", "4", "--train.micro_batch_size", "4"]
    args += ["--data.num_samples", "1000", "--train.eval_every", "0", "--train.eval_samples", "8"]
    assert main(["run", "tiny_sft", *args, "--logging.progress", "false"]) == 0
    printed = capsys.readouterr().out
    assert "CPU threads: timing the first steps on 2 threads and on 1" in printed
    reason = next(line for line in printed.splitlines() if "the faster over" in line)
    env = json.loads((out / "env.json").read_text())
    assert env["threads_chosen"] == reason
    assert env["torch_threads"] == int(reason.split("CPU threads: ")[1].split(",")[0]) == torch.get_num_threads()


def test_no_hint_for_a_healthy_or_gpu_run():
    assert slow_cpu_hint({"mfu": 0.3, "tokens_per_s": 7000.0}, "cpu") is None
    assert slow_cpu_hint({"mfu": 0.01, "tokens_per_s": 200.0}, "cuda") is None


def test_make_setup_says_what_it_is_doing(tmp_path):
    """`make setup` on a fresh clone: each step announced, pip's own output shown (no --quiet)."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]
    dry = subprocess.run(
        ["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert "--quiet" not in dry
    assert all(f"setup {n}/4" in dry for n in range(1, 5)) and "setup done" in dry
