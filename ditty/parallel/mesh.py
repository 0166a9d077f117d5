"""The device mesh: its shape as a pure function (for the recipe compiler), and the mesh itself.

`mesh_shape` imports no torch, so `ditty check --nproc-per-node N` can print the mesh and each rank's
share of the model before anything heavy is loaded. `build_mesh` makes the torch DeviceMesh:
1-D ("dp") for ddp, fsdp and deepspeed; 2-D ("replicate", "shard") for hsdp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from ditty.config.errors import Problem, RecipeError
from ditty.config.sections import SHARDED_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from ditty.config.sections import ParallelConfig
    from ditty.parallel.env import Runtime


@dataclass(frozen=True)
class MeshShape:
    kind: str
    dim_names: tuple[str, ...]
    sizes: tuple[int, ...]
    zero_stage: int = 0

    @property
    def world_size(self) -> int:
        product = 1
        for size in self.sizes:
            product *= size
        return product

    @property
    def data_parallel_size(self) -> int:
        """Ranks that split the batch: every kind ditty offers is data parallel over the whole world."""
        return self.world_size

    @property
    def shard_size(self) -> int:
        """How many ranks share one copy of the parameters (1: each rank holds them whole)."""
        if self.kind in SHARDED_KINDS:
            return self.sizes[-1]
        if self.kind == "deepspeed" and self.zero_stage == 3:
            return self.world_size
        return 1

    def describe(self) -> str:
        """One line for the plan: the mesh and what each rank holds."""
        if self.world_size == 1 or self.kind == "none":
            return "1 process: each rank holds the whole model and optimizer state"
        dims = " x ".join(f"{name} {size}" for name, size in zip(self.dim_names, self.sizes))
        n = self.shard_size
        if self.kind == "ddp":
            share = "each rank holds the whole model, gradients and optimizer state"
        elif self.kind == "deepspeed" and self.zero_stage == 2:
            share = f"whole parameters; 1/{self.world_size} of gradients and optimizer state per rank"
        else:
            share = f"each rank holds 1/{n} of parameters, gradients and optimizer state"
        return f"{self.kind} mesh ({dims}): {share}"


def mesh_shape(parallel: "ParallelConfig", world_size: int) -> Union[MeshShape, list[Problem]]:
    """The mesh for `parallel` on `world_size` processes, or every problem that prevents it."""
    kind = parallel.kind
    problems: list[Problem] = []
    if world_size < 1:
        return [Problem("", f"world size must be at least 1, got {world_size}", fix="--nproc-per-node 1 or more")]
    if kind == "none":
        if world_size > 1:
            problems.append(
                Problem(
                    "parallel.kind",
                    f'is "none" but {world_size} processes were asked for; each would train its own copy',
                    fix='set parallel.kind to "ddp" or "fsdp" (or run one process)',
                )
            )
        return problems or MeshShape("none", ("dp",), (1,))
    if kind != "hsdp":
        shape = MeshShape(kind, ("dp",), (world_size,), zero_stage=parallel.zero_stage if kind == "deepspeed" else 0)
    else:
        replicate, shard = parallel.replicate_size, parallel.shard_size
        if replicate < 1:
            problems.append(Problem("parallel.replicate_size", f"must be at least 1, got {replicate}"))
        if shard == 0 or shard < -1:
            problems.append(Problem("parallel.shard_size", f"must be at least 1, or -1 to derive it, got {shard}"))
        if problems:
            return problems
        if shard == -1:
            if world_size % replicate:
                return [
                    Problem(
                        "parallel.replicate_size",
                        f"= {replicate} does not divide the world size {world_size}",
                        fix=f"choose a divisor of {world_size}, or change --nproc-per-node / --nnodes",
                    )
                ]
            shard = world_size // replicate
        if replicate * shard != world_size:
            return [
                Problem(
                    "parallel.shard_size",
                    f"replicate_size x shard_size = {replicate} x {shard} = "
                    f"{replicate * shard}, but the world size is {world_size}",
                    fix="make the product equal nproc-per-node x nnodes, or set shard_size = -1",
                )
            ]
        shape = MeshShape("hsdp", ("replicate", "shard"), (replicate, shard))
    reshard = parallel.reshard_after_forward
    if kind in SHARDED_KINDS and not isinstance(reshard, bool):
        n = shape.shard_size
        if reshard < 1 or n % reshard:
            problems.append(
                Problem(
                    "parallel.reshard_after_forward",
                    f"as a group size must divide the shard size {n}, got {reshard}",
                    fix="use true, false, or a divisor of the shard size",
                )
            )
    return problems or shape


def build_mesh(parallel: "ParallelConfig", info: "Runtime") -> "DeviceMesh | None":
    """The DeviceMesh for this run (None on one process or for kind "none")."""
    shape = mesh_shape(parallel, info.world_size)
    if isinstance(shape, list):
        raise RecipeError(shape)
    if info.world_size == 1 or shape.kind == "none":
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(info.device.type, shape.sizes, mesh_dim_names=shape.dim_names)
