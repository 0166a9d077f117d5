"""Where a run executes: the device, the process group and mesh, and the process-wide settings that
must be in place before anything heavy is built (CPU threads, allocator, compile caches, seeds).

`start_runtime(config)` is the trainer's first build step, so a rank that cannot join fails before
any weights load. On one process no process group is ever created.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import replace
from typing import Any, Iterator

import torch

from ditty.parallel.env import Runtime


def start_runtime(config: Any) -> Runtime:
    """Pick the device, join torchrun's process group (a no-op on one process), build the mesh."""
    from ditty._utils.dist import set_batch_replicas
    from ditty.parallel import build_mesh, init_distributed
    from ditty.parallel.mesh import batch_mesh, mesh_shape

    device = _device(config.run.device)
    apply_allocator_policy(config, device)
    info = init_distributed(device)
    mesh = build_mesh(config.parallel, info) if info.is_distributed else None  # raises on a bad shape
    shape = mesh_shape(config.parallel, info.world_size) if mesh is not None else None
    if info.is_distributed:
        separate_compile_caches(info.rank, info.world_size)
    # A tensor-parallel group computes one forward together: its ranks must read the same batches.
    set_batch_replicas(shape.tp if shape is not None else 1)
    threads = config.run.num_threads
    if threads and device.type == "cpu":  # tiny models train several times faster on one thread
        torch.set_num_threads(threads)
    return replace(info, mesh=mesh, shape=shape, batch_mesh=batch_mesh(mesh))


def _device(want: str) -> torch.device:
    """cuda when asked or available ("auto"), else the CPU with one thread per available core."""
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        _require_cuda_device(local)
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    if "OMP_NUM_THREADS" not in os.environ:
        # Oversubscribing cores (threads x local processes > cores) slows CPU matmuls a lot.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, cores // local_procs))
    return torch.device("cpu")


def _require_cuda_device(local_rank: int) -> None:
    """run.device = "cuda" where there is no such device: exit 2 naming the setting, not torch's error."""
    from ditty.config.errors import RecipeError

    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a build without CUDA"
        raise RecipeError.single(
            f'is "cuda", but this machine has no usable CUDA device (torch {torch.__version__}, {built})',
            key="run.device",
            fix='set run.device = "auto" (CUDA where there is a device, else the CPU) or "cpu"',
        )
    if local_rank >= torch.cuda.device_count():
        raise RecipeError.single(
            f"local rank {local_rank} has no CUDA device: this node has {torch.cuda.device_count()}",
            key="run.device",
            fix=f"start at most {torch.cuda.device_count()} processes per node (--nproc-per-node)",
        )


def seed_everything(seed: int) -> None:
    """Python's, torch's (CUDA included) and numpy's global generators: model init, dropout, data."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def apply_allocator_policy(config: Any, device: torch.device) -> bool:
    """fsdp/hsdp on several CPU processes, or any CPU run with DITTY_CPU_ALLOCATOR=return: glibc gives
    freed memory back to the OS, so resident memory follows the tensors (the trade is explained in
    `ditty.parallel.allocator`). Runs before the process group starts its threads. Returns whether
    it applied."""
    from ditty.parallel.allocator import apply_host_allocator_policy

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return apply_host_allocator_policy(device.type, config.parallel.kind, world_size)


def separate_compile_caches(rank: int, world_size: int) -> None:
    """One inductor cache directory per (world size, rank), unless the user chose one.

    Uneven FSDP shards differ in shape between ranks (259 rows: 130 on rank 0, 129 on rank 1), and
    inductor's FX graph cache does not tell those graphs apart for DTensor inputs (torch 2.13):
    torchao's 8-bit AdamW, compiled per parameter, then fails on rank 1 with "expected size
    129==130" when it finds rank 0's graph in a shared cache. Costs only the sharing of compiled
    graphs between ranks.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = default_cache_dir()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # Inductor writes its default into the variable on first use (an import may already have): a
    # value equal to the default was not the user's choice.
    if chosen is not None and os.path.abspath(chosen) != os.path.abspath(default):
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default, f"ditty-world{world_size}-rank{rank}")


def teardown() -> None:
    """Leave the process group at the end of a run (a no-op on one process)."""
    from ditty._utils.dist import set_batch_replicas
    from ditty.parallel import destroy_distributed

    set_batch_replicas(1)
    destroy_distributed()


@contextlib.contextmanager
def process_group_for_run() -> Iterator[None]:
    """Destroy the process group when the run ends normally. After an error it is left alone: torchrun
    stops the other ranks, and a destroy could wait on a peer that is already gone."""
    yield
    teardown()
