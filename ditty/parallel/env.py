"""Join the process group that torchrun set up: rank, world size, device, backend, timeout.

Everything here reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). On one
process nothing is initialised, so a single-process run never pays for a process group.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from ditty._utils.dist import configured_timeout


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its rank of the world, its device, and (once `start_runtime` built
    it, ditty.parallel.runtime) the mesh."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Optional[Any] = None
    """The DeviceMesh of ddp/fsdp/hsdp on several processes; None on one process and for DeepSpeed."""
    shape: Optional[Any] = None
    """The mesh's MeshShape (ditty.parallel.mesh): its dimensions and sizes, without torch."""
    batch_mesh: Optional[Any] = None
    """The mesh of the ranks that hold different tokens (ditty.parallel.mesh.batch_mesh): the whole
    mesh, or its flattened ("dp", "cp") dimensions under tensor or context parallel."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def model_parallel(self) -> bool:
        """Tensor or context parallel: some ranks share rows of the batch (the ("dp", "cp", "tp") mesh)."""
        return self.shape is not None and self.shape.model_parallel

    def coordinate(self, name: str) -> int:
        """This rank's index along mesh dimension `name` (0 without such a dimension)."""
        return self.shape.coordinates(self.rank).get(name, 0) if self.model_parallel else 0

    @property
    def data_rank(self) -> int:
        """This rank's index among the ranks that take different rows of the batch."""
        return self.coordinate("dp") if self.model_parallel else self.rank

    @property
    def data_world_size(self) -> int:
        """Ranks that take different rows of the batch (the data-parallel degree)."""
        return self.shape.data_parallel_size if self.model_parallel else self.world_size

    @property
    def batch_ranks(self) -> int:
        """Ranks that hold different tokens (data x context parallel): what the loss sums over and the
        gradient reduction averages over."""
        return self.shape.batch_ranks if self.model_parallel else self.world_size

    @property
    def batch_group(self) -> Optional[Any]:
        """The process group of those ranks; None when they are the whole world."""
        if not self.model_parallel or self.shape.tp == 1:
            return None
        return self.batch_mesh.get_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


DistInfo = Runtime
"""The name `init_distributed`'s result had before it became the one runtime type."""


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def resolve_device(device: Union[str, torch.device], local_rank: int = 0) -> torch.device:
    """ "auto" picks CUDA when present; a CUDA device becomes this process's local GPU."""
    if isinstance(device, torch.device):
        kind = device.type
    else:
        kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else str(device).split(":")[0]
    if kind == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(kind)


def init_distributed(device: Union[str, torch.device] = "auto", *, timeout: float | None = None) -> Runtime:
    """Join torchrun's process group (nccl on CUDA, with gloo for CPU tensors; gloo on CPU).

    `timeout` is in seconds (default: $DITTY_DIST_TIMEOUT_S, else 600). Idempotent; on one process
    (no WORLD_SIZE, or 1) it creates no group and returns rank 0 of 1.
    """
    from ditty.parallel.launch import die_with_launcher

    die_with_launcher()  # a torchrun worker stops (and saves) when its launcher dies; a no-op elsewhere
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    resolved = resolve_device(device, local_rank)
    if world_size <= 1:
        return Runtime(0, 1, 0, resolved)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    if not dist.is_initialized():
        global _CREATED_GROUP
        wait = datetime.timedelta(seconds=timeout) if timeout is not None else configured_timeout()
        # On CUDA, CPU tensors (object collectives, DCP metadata) still need a backend: gloo.
        backend = "cpu:gloo,cuda:nccl" if resolved.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            timeout=wait,
            device_id=resolved if resolved.type == "cuda" else None,
        )
        _CREATED_GROUP = True
    return Runtime(dist.get_rank(), dist.get_world_size(), local_rank, resolved)


_CREATED_GROUP = False
"""Whether init_distributed created this process's group (destroy_distributed leaves any other alone)."""


def created_group() -> None:
    """Say that the group now initialized is ditty's own, for destroy_distributed (DeepSpeed's one-process group)."""
    global _CREATED_GROUP
    _CREATED_GROUP = True


def destroy_distributed() -> None:
    """Leave the process group init_distributed created (call at the end of a run). A group someone
    else created is left as it is: the user's own, or the one an in-process vLLM engine made for itself
    on a single process (destroying it would leave that engine unable to load weights)."""
    global _CREATED_GROUP
    if _CREATED_GROUP and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _CREATED_GROUP = False
