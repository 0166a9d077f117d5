"""The device mesh: its shape as a pure function (for the recipe compiler), and the mesh itself.

`mesh_shape` imports no torch, so `ditty check --nproc-per-node N` can print the mesh and each rank's
share of the model before anything heavy is loaded. `build_mesh` makes the one torch DeviceMesh of
a run, with named dimensions: ("dp",) for ddp, fsdp and deepspeed; ("replicate", "shard") for hsdp;
("dp", "cp", "tp") when `parallel.tp` or `parallel.cp` is above 1 (kind "fsdp"), tensor parallel
innermost so its ranks are neighbours (one node's GPUs); `batch_mesh` flattens the first two into
"dp_cp": FSDP shards over it, since context-parallel ranks hold different tokens of the same rows
and their gradients add up like data-parallel ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from ditty.config.errors import Problem, RecipeError
from ditty.config.sections import SHARDED_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from ditty.config.sections import ParallelConfig
    from ditty.parallel.env import Runtime

MODEL_PARALLEL_KINDS = ("fsdp",)
"""The parallel kinds that take `parallel.tp` / `parallel.cp` above 1 (see ditty/recipe/scale_rules.py)."""
KIND_REFUSALS = {
    "none": "without a data-parallel kind there is no mesh for tensor- or context-parallel parameters "
    "and gradients (ditty builds them on its FSDP2 mesh)",
    "ddp": "DDP takes plain tensors; tensor-parallel parameters are DTensors, and context-parallel "
    "gradients must be reduced over the context ranks as FSDP2 does",
    "hsdp": "HSDP's replicate x shard mesh has no tensor or context dimension in ditty yet",
    "deepspeed": "DeepSpeed's ZeRO engine owns the parameters and has no DTensor tensor-parallel or "
    "Ulysses path in ditty",
}
"""Why each other parallel kind refuses tp or cp above 1: rows of the support table
(ditty/recipe/scale_rules.py), checked here because they decide whether a mesh exists at all."""
KIND_REFUSAL_FIX = (
    'set parallel.kind = "fsdp" (FSDP2 shards over the ranks tp and cp leave; with tp x cp equal to the world '
    "size it shards nothing and only tensor/context parallel remain)"
)


def kind_refusal_rule(kind: str) -> str:
    return f"scale.kind-{kind}"


DATA_CONTEXT = "dp_cp"
"""The flattened ("dp", "cp") dimension: the ranks that hold different tokens (FSDP shards over it)."""


@dataclass(frozen=True)
class MeshShape:
    kind: str
    dim_names: tuple[str, ...]
    sizes: tuple[int, ...]
    zero_stage: int = 0

    def size_of(self, name: str) -> int:
        """The size of dimension `name` (1 when the mesh has no such dimension)."""
        return dict(zip(self.dim_names, self.sizes)).get(name, 1)

    @property
    def world_size(self) -> int:
        product = 1
        for size in self.sizes:
            product *= size
        return product

    @property
    def tp(self) -> int:
        return self.size_of("tp")

    @property
    def cp(self) -> int:
        return self.size_of("cp")

    @property
    def model_parallel(self) -> bool:
        """Whether the mesh has tensor- or context-parallel dimensions (the ("dp", "cp", "tp") layout)."""
        return "tp" in self.dim_names

    @property
    def data_parallel_size(self) -> int:
        """Ranks that take different rows of the batch: the world without its tp and cp groups."""
        return self.world_size // (self.tp * self.cp)

    @property
    def batch_ranks(self) -> int:
        """Ranks that hold different tokens (data x context parallel): the loss sums over these, and
        gradients are averaged over them."""
        return self.world_size // self.tp

    @property
    def shard_size(self) -> int:
        """How many ranks share one copy of the parameters along the data dimensions (1: each holds them
        whole); tensor parallel divides each rank's share by `tp` again."""
        if self.model_parallel:
            return self.batch_ranks
        if self.kind in SHARDED_KINDS:
            return self.sizes[-1]
        if self.kind == "deepspeed" and self.zero_stage == 3:
            return self.world_size
        return 1

    def coordinates(self, rank: int) -> dict[str, int]:
        """`rank`'s index along each dimension (row-major, the last dimension fastest, as DeviceMesh lays
        out ranks)."""
        out: dict[str, int] = {}
        for name, size in reversed(list(zip(self.dim_names, self.sizes))):
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name in self.dim_names}

    def describe(self) -> str:
        """One line for the plan: the mesh and what each rank holds."""
        if self.world_size == 1 or self.kind == "none":
            return "1 process: each rank holds the whole model and optimizer state"
        shown = [(n, s) for n, s in zip(self.dim_names, self.sizes) if s > 1 or not self.model_parallel]
        dims = " x ".join(f"{name} {size}" for name, size in shown)
        n = self.shard_size * self.tp
        if self.kind == "ddp":
            share = "each rank holds the whole model, gradients and optimizer state"
        elif self.kind == "deepspeed" and self.zero_stage == 2:
            share = f"whole parameters; 1/{self.world_size} of gradients and optimizer state per rank"
        else:
            share = f"each rank holds 1/{n} of parameters, gradients and optimizer state"
        extra = []
        if self.tp > 1:
            extra.append(
                f"tensor parallel over {self.tp} ranks (linear layers split, norms sequence-parallel, "
                "loss on vocabulary shards)"
            )
        if self.cp > 1:
            extra.append(f"context parallel over {self.cp} ranks (each row's tokens split, Ulysses attention)")
        if extra:
            extra.append(f"the batch splits over {self.data_parallel_size} data-parallel rank(s)")
        return f"{self.kind} mesh ({dims}): {share}" + "".join(f"; {part}" for part in extra)


def mesh_shape(parallel: "ParallelConfig", world_size: int) -> Union[MeshShape, list[Problem]]:
    """The mesh for `parallel` on `world_size` processes, or every problem that prevents it."""
    kind = parallel.kind
    problems: list[Problem] = []
    if world_size < 1:
        return [Problem("", f"world size must be at least 1, got {world_size}", fix="--nproc-per-node 1 or more")]
    tp, cp = parallel.tp, parallel.cp
    if tp != 1 or cp != 1:
        return _model_parallel_shape(parallel, world_size)
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


def _model_parallel_shape(parallel: "ParallelConfig", world_size: int) -> Union[MeshShape, list[Problem]]:
    """("dp", "cp", "tp") for kind "fsdp" with tp or cp above 1, or every problem that prevents it."""
    problems: list[Problem] = []
    for name in ("tp", "cp"):
        degree = getattr(parallel, name)
        if degree < 1:
            problems.append(
                Problem(f"parallel.{name}", f"must be at least 1, got {degree}", fix=f"set parallel.{name} = 1 or more")
            )
    if problems:
        return problems
    tp, cp = parallel.tp, parallel.cp
    if parallel.kind not in MODEL_PARALLEL_KINDS:
        key = "parallel.tp" if tp > 1 else "parallel.cp"
        return [
            Problem(
                key,
                f'= {tp if key == "parallel.tp" else cp} needs parallel.kind = "fsdp", and this recipe has '
                f"{parallel.kind!r}: {KIND_REFUSALS[parallel.kind]}",
                fix=KIND_REFUSAL_FIX,
                rule=kind_refusal_rule(parallel.kind),
            )
        ]
    if world_size % (tp * cp):
        return [
            Problem(
                "parallel.tp" if tp > 1 else "parallel.cp",
                f"tp x cp = {tp} x {cp} = {tp * cp} does not divide the world size {world_size}",
                fix=f"run a multiple of {tp * cp} processes (--nproc-per-node x --nnodes), or change parallel.tp "
                "or parallel.cp",
            )
        ]
    if not isinstance(parallel.reshard_after_forward, bool):
        return [
            Problem(
                "parallel.reshard_after_forward",
                "as a group size is not supported with tensor or context parallel",
                fix="use true or false",
            )
        ]
    return MeshShape(parallel.kind, ("dp", "cp", "tp"), (world_size // (tp * cp), cp, tp))


def build_mesh(parallel: "ParallelConfig", info: "Runtime") -> "DeviceMesh | None":
    """The DeviceMesh for this run (None on one process or for kind "none")."""
    shape = mesh_shape(parallel, info.world_size)
    if isinstance(shape, list):
        raise RecipeError(shape)
    if info.world_size == 1 or shape.kind == "none":
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(info.device.type, shape.sizes, mesh_dim_names=shape.dim_names)


def batch_mesh(mesh: "Optional[DeviceMesh]") -> "Optional[DeviceMesh]":
    """The (sub)mesh of the ranks that hold different tokens, which FSDP2 or DDP shard or replicate
    over: ("dp", "cp") flattened into DATA_CONTEXT on a tensor/context-parallel mesh, else the whole
    mesh. Call once per mesh and keep the result (torch asks callers to keep flattened meshes rather
    than slice them from the root again)."""
    if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
        return mesh
    return mesh["dp", "cp"]._flatten(DATA_CONTEXT)


def sub_mesh(mesh: "Optional[DeviceMesh]", name: str) -> "Optional[DeviceMesh]":
    """Dimension `name` of a tensor/context-parallel mesh, or None when the mesh has none or it is 1 wide."""
    if mesh is None or name not in (mesh.mesh_dim_names or ()):
        return None
    sub = mesh[name]
    return sub if sub.size() > 1 else None
