"""Parallelism on torch.distributed: launch, process group, mesh, wrapping (data, tensor parallel),
sharded loading.

One job per module:
- `launch`: start `python -m ditty ...` on N ranks through torch.distributed.run; exit codes 0/2/1.
- `env`: `init_distributed(device)` joins torchrun's process group -> `Runtime` (rank, device;
  `runtime.start_runtime` adds the mesh).
- `mesh`: `mesh_shape(parallel, world_size)` (pure, for the compiler), `build_mesh` and `batch_mesh`:
  one DeviceMesh with named dimensions ("dp", "cp", "tp" under tensor or context parallel).
- `tp_table`: the families ditty splits with tensor and context parallel, and what must divide what (pure).
- `tensor`: `apply_tensor_parallel(model, tp_mesh)`, the plan applied with DTensor (sequence parallel norms).
- `wrap`: `apply_parallelism(model, parallel, mesh, precision=..., block_classes=...)`: DDP or FSDP2.
- `accumulation`: `no_sync_context` and `grad_average_correction` for micro-batches and ranks.
- `materialize`: meta-device build, then each rank loads only its shard.
- `memory`: per-rank bytes in local tensors and peak resident memory.
- `allocator`: whether a CPU process gives freed memory back to the OS (glibc's mmap threshold).
- `deepspeed`: the ZeRO engine config (deepspeed is an optional extra).
- `runtime`: `start_runtime` (process group, device, mesh, threads, allocator policy) for a run.
- `speed`: activation checkpointing and torch.compile, block by block, in torchtitan's order.
- `precision`: autocast and loss scaling (the FSDP2 half of mixed precision is in `wrap`).

Importing this package imports no torch; the names below load their module on first use. (`launch`
and `materialize` are also module names: import those functions from their modules.)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Runtime": "env",
    "DistInfo": "env",
    "init_distributed": "env",
    "destroy_distributed": "env",
    "MeshShape": "mesh",
    "mesh_shape": "mesh",
    "build_mesh": "mesh",
    "apply_parallelism": "wrap",
    "find_blocks": "wrap",
    "no_sync_context": "accumulation",
    "grad_average_correction": "accumulation",
    "meta_init": "materialize",
    "load_sharded_from_rank0": "materialize",
    "load_sharded_from_safetensors": "materialize",
    "deepspeed_config": "deepspeed",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty.parallel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ditty.parallel.{module}"), name)
