"""The demo on a small or busy CPU: a thread count that does not oversubscribe the cores, said on the
screen, and a hint pointing at `run.num_threads` when a run is far slower than its cores allow."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.config.loader import load_recipe
from ditty.parallel import threads
from ditty.parallel.threads import choose_cpu_threads, slow_cpu_hint

SHORT = ["--train.steps", "4", "--data.num_samples", "2000", "--train.eval_samples", "8"]
SHORT += ["--scheduler.warmup_steps", "1", "--logging.progress", "false"]


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_tiny_sft_sets_one_thread():
    assert load_recipe("tiny_sft").config.run.num_threads == 1


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
    assert "CPU threads: 1 per process, as a 0.7M-parameter model trains fastest on one" in capsys.readouterr().out
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
