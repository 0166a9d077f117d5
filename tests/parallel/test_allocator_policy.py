"""The default host allocator policy of multi-process CPU runs, its opt-outs, and the opt-in for
every CPU run (DITTY_CPU_ALLOCATOR=return)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ditty.parallel import allocator


@pytest.mark.parametrize(
    "env",
    [
        {"DITTY_CPU_ALLOCATOR": "glibc"},
        {"MALLOC_ARENA_MAX": "2"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    ],
)
def test_the_user_can_opt_out_or_choose_their_own(monkeypatch, no_allocator_settings, env):
    monkeypatch.setenv("DITTY_CPU_ALLOCATOR", "return")  # even then
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert allocator.apply_host_allocator_policy("cpu", "fsdp", 2) is False
    assert allocator.worker_environment("cpu", "fsdp", 2) == {}


@pytest.mark.parametrize(
    "kind, device, world, applies",
    [
        ("fsdp", "cpu", "2", True),
        ("hsdp", "cpu", "4", True),
        ("fsdp", "cpu", "1", False),  # one process: glibc's defaults
        ("ddp", "cpu", "2", False),
        ("deepspeed", "cpu", "2", False),  # no per-step gathers
        ("fsdp", "cuda", "2", False),  # CUDA tensors have their own caching allocator
    ],
)
def test_the_trainer_applies_it_to_sharded_cpu_runs_on_several_processes(
    monkeypatch, no_allocator_settings, kind, device, world, applies
):
    import torch

    from ditty.config import TrainerConfig
    from ditty.config.sections import ParallelConfig
    from ditty.train.runtime import apply_allocator_policy

    calls = []
    monkeypatch.setattr(allocator, "return_freed_memory_to_os", lambda threshold: calls.append(threshold) or True)
    monkeypatch.setenv("WORLD_SIZE", world)
    config = TrainerConfig(parallel=ParallelConfig(kind=kind))
    assert apply_allocator_policy(config, torch.device(device)) is applies
    assert calls == ([allocator.MMAP_THRESHOLD] if applies else [])


@pytest.mark.parametrize(
    "kind, device, env, wanted",
    [
        ("fsdp", "cpu", {}, {"THP_MEM_ALLOC_ENABLE": "1"}),  # the workers will return freed memory
        ("hsdp", "cpu", {}, {"THP_MEM_ALLOC_ENABLE": "1"}),
        ("ddp", "cpu", {"DITTY_CPU_ALLOCATOR": "return"}, {"THP_MEM_ALLOC_ENABLE": "1"}),
        ("ddp", "cpu", {}, {}),  # glibc's defaults: huge pages would only change what was measured
        ("fsdp", "cuda", {}, {}),
        ("fsdp", "cpu", {"DITTY_CPU_ALLOCATOR": "glibc"}, {}),
        ("fsdp", "cpu", {"THP_MEM_ALLOC_ENABLE": "0"}, {}),  # the user's own switch stays
    ],
)
def test_the_launcher_gives_returning_workers_huge_pages(monkeypatch, no_allocator_settings, kind, device, env, wanted):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert allocator.worker_environment(device, kind, 2) == wanted


def run_python(script: str, env: dict) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter with `env` added (tests calling it ask for `no_allocator_settings`)."""
    return subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


# A `ditty run` process in miniature: ditty imported before torch, the trainer's policy, then holes
# freed inside glibc's heap. The first 24 MB tensor is mapped, and its free raises glibc's dynamic
# threshold to 24 MB, so the 16 MB tensors after it come from the heap unless the threshold is fixed.
HOLES_IN_THE_HEAP = """
import json, os
import ditty
import torch
from ditty.config import TrainerConfig
from ditty.train.runtime import apply_allocator_policy

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

applied = apply_allocator_policy(TrainerConfig(), torch.device("cpu"))
first = torch.ones(6 << 20)
del first
tensors = [torch.ones(4 << 20) for _ in range(16)]
held = rss_mb()
del tensors[0::2]  # every other one: holes glibc's heap cannot give back from its top
print(json.dumps({"applied": applied, "thp": os.environ.get("THP_MEM_ALLOC_ENABLE"), "returned_mb": held - rss_mb()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize(
    "env, applies",
    [
        ({}, False),  # one process keeps glibc's defaults: the holes stay resident
        ({"DITTY_CPU_ALLOCATOR": "return"}, True),
        ({"DITTY_CPU_ALLOCATOR": "return", "MALLOC_ARENA_MAX": "2"}, False),  # the user's own glibc policy wins
    ],
)
def test_return_gives_freed_memory_back_in_a_single_cpu_process(no_allocator_settings, env, applies):
    run = run_python(HOLES_IN_THE_HEAP, env)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["applied"] is applies
    # the switch torch reads at its first allocation is set wherever "return" applies
    assert out["thp"] == ("1" if applies else None)
    if applies:
        assert out["returned_mb"] >= 120  # the 8 freed 16 MB tensors, 128 MB
    else:
        assert out["returned_mb"] < 20


def test_return_leaves_cuda_runs_alone(monkeypatch):
    import torch

    from ditty.config import TrainerConfig
    from ditty.train.runtime import apply_allocator_policy

    monkeypatch.setenv("DITTY_CPU_ALLOCATOR", "return")
    assert apply_allocator_policy(TrainerConfig(), torch.device("cuda")) is False


def test_an_unknown_choice_is_a_user_error_before_training(tmp_path, capsys, monkeypatch):
    from ditty.cli import main

    monkeypatch.setenv("DITTY_CPU_ALLOCATOR", "retrun")
    out = tmp_path / "run"
    code = main(
        ["run", "tiny_sft", "--train.steps", "4", "--scheduler.warmup_steps", "1", "--run.output_dir", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "`DITTY_CPU_ALLOCATOR` 'retrun' is not a host allocator policy" in err and '"return"' in err
    assert not (out / "final").exists()


def test_an_unknown_choice_stops_the_launcher_before_any_worker(tmp_path, capsys, monkeypatch):
    from ditty.cli import main

    monkeypatch.setenv("DITTY_CPU_ALLOCATOR", "retrun")
    out = tmp_path / "run"
    args = ["run", "tiny_sft", "--nproc-per-node", "2", "--parallel.kind", "fsdp", "--train.micro_batch_size", "32"]
    code = main([*args, "--run.output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "`DITTY_CPU_ALLOCATOR` 'retrun' is not a host allocator policy" in err
    assert not out.exists()  # no worker started, nothing written


def test_check_reports_an_unknown_choice_too(capsys, monkeypatch):
    from ditty.cli import main

    monkeypatch.setenv("DITTY_CPU_ALLOCATOR", "retrun")
    assert main(["check", "tiny_sft"]) == 2
    assert "`DITTY_CPU_ALLOCATOR` 'retrun' is not a host allocator policy" in capsys.readouterr().err


def test_run_hands_the_workers_environment_to_the_launcher(tmp_path, monkeypatch, no_allocator_settings):
    """`ditty run --nproc-per-node 2` of an fsdp CPU recipe: what reaches torchrun's workers (the
    launch itself is replaced; tests/train/test_distributed.py runs the real one)."""
    from ditty import cli
    from ditty.parallel import launch

    seen = {}
    monkeypatch.setattr(launch, "launch", lambda argv, **options: seen.update(options) or 0)
    args = ["run", "tiny_sft", "--nproc-per-node", "2", "--run.device", "cpu", "--train.micro_batch_size", "32"]
    assert cli.main([*args, "--parallel.kind", "fsdp", "--run.output_dir", str(tmp_path / "a")]) == 0
    assert seen["worker_env"] == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert cli.main([*args, "--parallel.kind", "ddp", "--run.output_dir", str(tmp_path / "b")]) == 0
    assert seen["worker_env"] == {}


def test_return_without_huge_pages_says_so(no_allocator_settings):
    """torch imported before ditty: torch never saw THP_MEM_ALLOC_ENABLE, and the run is told the price."""
    script = (
        "import torch, ditty, os\n"
        "from ditty.config import TrainerConfig\n"
        "from ditty.train.runtime import apply_allocator_policy\n"
        "assert 'THP_MEM_ALLOC_ENABLE' not in os.environ\n"
        "assert apply_allocator_policy(TrainerConfig(), torch.device('cpu'))\n"
    )
    run = run_python(script, {"DITTY_CPU_ALLOCATOR": "return"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "without torch's huge pages" in run.stderr and "import ditty first" in run.stderr
