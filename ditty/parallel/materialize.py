"""Build on the meta device, shard, then give each rank only its shard of the real weights.

The order (each rank): `with meta_init(): model = build()`; `apply_parallelism(...)` (fully_shard
turns the meta parameters into meta DTensor shards); `load_sharded_from_safetensors(model,
model_dir if rank == 0 else None)` (or `load_sharded_from_rank0` with an in-memory state dict, or
`load_sharded_from_rank0_tensors` with full tensors rank 0 built itself: a base quantized on rank 0 for QLoRA).
Rank 0 reads the checkpoint one tensor at a time and broadcasts it; every rank keeps its slice. No
rank ever holds the whole model, so resident memory falls with the world size (not only tensor bytes:
building the full model on each rank and then sharding leaves the peak where it was).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ditty._utils.dist import share_from_rank0
from ditty._utils.meta import meta_init as meta_init  # part of this module's public steps (see above)
from ditty.config.errors import RecipeError


def has_meta_parameters(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, device: Union[str, torch.device]) -> nn.Module:
    """Allocate (uninitialised) storage for meta parameters on `device`; real buffers keep their values.

    Works on FSDP2-sharded models (each rank allocates only its shard). The values must then come
    from a load; a non-persistent buffer that is still on meta has no source and raises.
    """
    kept = {
        (id(m), name): (m, name, b)
        for m in model.modules()
        for name, b in m._buffers.items()
        if b is not None and not b.is_meta
    }
    lost = [
        f"{prefix}.{name}".lstrip(".")
        for prefix, m in model.named_modules()
        for name, b in m._buffers.items()
        if b is not None and b.is_meta and name in m._non_persistent_buffers_set
    ]
    if lost:
        raise ValueError(
            f"non-persistent buffers {lost[:4]} are on the meta device and no checkpoint holds them; "
            "build the model under ditty.parallel.materialize.meta_init() so buffers stay real"
        )
    model.to_empty(device=device)
    for module, name, buffer in kept.values():
        module._buffers[name] = buffer.to(device)
    return model


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device_of(model: nn.Module) -> torch.device:
    """Where a model's (local) parameters belong: the mesh's device for shards, else the parameter's."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            kind = p.device_mesh.device_type
        elif p.is_meta:
            kind = "cpu"
        else:
            return p.device
        return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
    return torch.device("cpu")


def load_sharded_from_rank0(
    model: nn.Module,
    full_state_dict: Optional[Mapping[str, torch.Tensor]],
    *,
    device: Union[str, torch.device, None] = None,
    strict: bool = True,
) -> nn.Module:
    """Load a full state dict held by rank 0 (None elsewhere) into a sharded (or meta) model.

    torch's `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)` broadcasts one
    tensor at a time and keeps each rank's slice. Rank 0 holds the whole dict while it runs: for
    checkpoints on disk prefer `load_sharded_from_safetensors`, which never does.
    """
    target = torch.device(device) if device is not None else _device_of(model)
    if has_meta_parameters(model):
        materialize(model, target)
    rank, world = _world()
    if world == 1:
        model.load_state_dict(dict(full_state_dict or {}), strict=strict)
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = dict(full_state_dict) if rank == 0 and full_state_dict is not None else {}
    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    )
    return model


# --- streaming from safetensors files -----------------------------------------------------------


def safetensors_index(model_dir: str) -> dict[str, str]:
    """Tensor name -> file, from model.safetensors.index.json or the single model.safetensors."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
        return {name: os.path.join(model_dir, file) for name, file in weight_map.items()}
    single = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(single):
        raise RecipeError.single(
            f"no model.safetensors (or its index) in {model_dir}",
            key="model.path",
            fix="point model.path at a Hugging Face model directory saved as safetensors",
        )
    return {name: single for name in SafetensorsFile(single).entries}


class SafetensorsFile:
    """Reads one tensor at a time with plain file reads.

    Not `safe_open`: that maps the whole file, and every page a read touches counts in this
    process's resident memory until the map closes, so reading a checkpoint through it costs its
    full size in RSS on rank 0: exactly what sharded loading is meant to avoid.
    """

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        header.pop("__metadata__", None)
        self.data_start = 8 + size
        self.entries: dict[str, dict] = header

    def shape_and_dtype(self, key: str) -> tuple[tuple[int, ...], torch.dtype]:
        entry = self.entries[key]
        return tuple(entry["shape"]), _DTYPE_NAMES[entry["dtype"]]

    def read(self, key: str) -> torch.Tensor:
        shape, dtype = self.shape_and_dtype(key)
        begin, end = self.entries[key]["data_offsets"]
        raw = torch.empty(end - begin, dtype=torch.uint8)
        with open(self.path, "rb") as handle:
            handle.seek(self.data_start + begin)
            if handle.readinto(raw.numpy()) != end - begin:
                raise RecipeError.single(f"{self.path} is truncated at tensor {key}", key="model.path")
        return raw.view(dtype).reshape(shape)


def _targets(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """Each distinct parameter / persistent buffer once, with all its names (tied weights share one)."""
    seen: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(param), ([], param))[0].append(name)
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                seen.setdefault(id(buffer), ([], buffer))[0].append(f"{prefix}.{name}".lstrip("."))
    return list(seen.values())


def _copy_full_into(target: torch.Tensor, full: torch.Tensor) -> None:
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(target, DTensor):
            # src_data_rank=None: every rank already has `full`, so this only slices (no collective).
            piece = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
            target.to_local().copy_(piece)
        else:
            target.copy_(full)


def load_sharded_from_safetensors(
    model: nn.Module, model_dir: Optional[str], *, device: Union[str, torch.device, None] = None
) -> nn.Module:
    """Fill a sharded (or meta) model from a safetensors checkpoint that only rank 0 reads.

    Rank 0 passes the directory, the others None. Tensor by tensor: rank 0 reads it, broadcasts it,
    each rank copies its slice and drops the rest, so the extra memory is one full tensor. All ranks
    raise the same RecipeError when the checkpoint lacks a weight of the model.
    """
    files: dict[str, SafetensorsFile] = {}

    def plan(targets):
        if model_dir is None:
            raise ValueError("rank 0 must pass the model directory")
        return _plan(targets, model_dir)

    def read(entry):
        key, file = entry[0], entry[1]
        if file not in files:
            files[file] = SafetensorsFile(file)
        return files[file].read(key)

    return _stream_from_rank0(model, plan, read, device)


def load_sharded_from_rank0_tensors(
    model: nn.Module, tensors: "Optional[dict[str, torch.Tensor]]", *, device: Union[str, torch.device, None] = None
) -> nn.Module:
    """Fill a sharded (or meta) model from full tensors that rank 0 holds in memory (None elsewhere).

    `tensors` maps a parameter / persistent buffer name (as `named_parameters` gives it before
    sharding; activation-checkpoint and compile wrappers are ignored) to its full value. Rank 0
    broadcasts them one at a time and *pops* each from the dict, so its full copy shrinks as the
    shards fill: rank 0's peak is its full model plus its own shard, the other ranks' one shard plus
    one full tensor. Used for a quantized base that rank 0 loaded and quantized (QLoRA under FSDP).
    """

    def plan(targets):
        if tensors is None:
            raise ValueError("rank 0 must pass the full tensors")
        by_name = {clean_name(name): name for name in tensors}
        out, missing = [], []
        for names, tensor in targets:
            key = next((by_name[clean_name(n)] for n in names if clean_name(n) in by_name), None)
            if key is None:
                missing.append(names[0])
                continue
            full = tensors[key]
            if tuple(full.shape) != tuple(tensor.shape):
                return ValueError(
                    f"rank 0's tensor {key} has shape {list(full.shape)}, the sharded model wants {list(tensor.shape)}"
                )
            out.append((key, tuple(full.shape), full.dtype))
        if missing:
            return ValueError(f"rank 0 holds no value for {', '.join(missing[:5])}")
        return out

    def read(entry):
        return tensors.pop(entry[0]).detach()  # the last reference on rank 0: freed after the copy

    return _stream_from_rank0(model, plan, read, device)


def clean_name(name: str) -> str:
    """A parameter name without the wrappers that activation checkpointing and torch.compile insert."""
    for part in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(part, "")
    return name


def _stream_from_rank0(model: nn.Module, make_plan, read, device) -> nn.Module:
    """The loop both loaders share: rank 0 plans (or fails), every rank learns the plan (or the error),
    then tensor by tensor rank 0 reads, broadcasts, and every rank keeps its slice.

    `make_plan(targets)` (rank 0 only) returns one entry per target, each ending with (shape, dtype),
    or the exception every rank must raise; `read(entry)` (rank 0 only) returns that full tensor.
    """
    target_device = torch.device(device) if device is not None else _device_of(model)
    if has_meta_parameters(model):
        materialize(model, target_device)
    rank, world = _world()
    targets = _targets(model)
    plan: Any = None
    if rank == 0:
        try:
            plan = make_plan(targets)
        except Exception as error:  # sent to every rank, so none waits for a broadcast that never comes
            plan = error
    plan = share_from_rank0(plan)  # every rank learns the plan, or the error to raise
    if isinstance(plan, BaseException):
        raise plan
    comm_device = (
        torch.device("cuda", torch.cuda.current_device()) if target_device.type == "cuda" else torch.device("cpu")
    )
    for (_names, tensor), entry in zip(targets, plan):
        shape, dtype = entry[-2], entry[-1]
        if rank == 0:
            full = read(entry).to(comm_device)
        else:
            full = torch.empty(shape, dtype=dtype, device=comm_device)
        if world > 1:
            dist.broadcast(full, src=0)
        _copy_full_into(tensor, full)
        del full
    return model


def _plan(targets, model_dir: str):
    """Rank 0: for each target, (checkpoint key, file, shape, dtype); or the RecipeError to raise everywhere."""
    index = safetensors_index(model_dir)
    plan, missing = [], []
    files: dict[str, SafetensorsFile] = {}
    for names, tensor in targets:
        key = next((clean_name(n) for n in names if clean_name(n) in index), None)
        if key is None:
            missing.append(names[0])
            continue
        file = index[key]
        if file not in files:
            files[file] = SafetensorsFile(file)
        shape, dtype = files[file].shape_and_dtype(key)
        if shape != tuple(tensor.shape):
            return RecipeError.single(
                f"checkpoint tensor {key} has shape {list(shape)}, the model wants {list(tensor.shape)}",
                key="model.path",
                fix="the model config must match the checkpoint's config.json",
            )
        plan.append((key, file, shape, dtype))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return RecipeError.single(
            f"the checkpoint in {model_dir} has no weights for {', '.join(missing[:5])}{more}",
            key="model.path",
            fix="point model.path at the checkpoint of this architecture",
        )
    return plan


_DTYPE_NAMES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def full_tensor_references(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter / persistent buffer of an unsharded model by name (plain tensors sharing its
    storage, tied weights once): what `load_sharded_from_rank0_tensors` sends after `fully_shard`."""
    return {names[0]: tensor.detach() for names, tensor in _targets(model)}
