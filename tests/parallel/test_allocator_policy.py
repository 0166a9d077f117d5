"""The default host allocator policy of multi-process CPU runs, and its opt-outs."""

from __future__ import annotations

import os

import pytest

from ditty.parallel import memory


@pytest.mark.parametrize(
    "env",
    [
        {"DITTY_CPU_ALLOCATOR": "glibc"},
        {"MALLOC_ARENA_MAX": "2"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    ],
)
def test_the_user_can_opt_out_or_choose_their_own(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert memory.apply_distributed_allocator_policy() is False


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
def test_the_trainer_applies_it_to_sharded_cpu_runs_on_several_processes(monkeypatch, kind, device, world, applies):
    import torch

    from ditty.config import TrainerConfig
    from ditty.config.sections import ParallelConfig
    from ditty.train.runtime import apply_allocator_policy

    calls = []
    monkeypatch.setattr(memory, "return_freed_memory_to_os", lambda threshold: calls.append(threshold) or True)
    monkeypatch.setenv("WORLD_SIZE", world)
    for name in ("DITTY_CPU_ALLOCATOR", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    config = TrainerConfig(parallel=ParallelConfig(kind=kind))
    assert apply_allocator_policy(config, torch.device(device)) is applies
    assert calls == ([memory.DISTRIBUTED_MMAP_THRESHOLD] if applies else [])
