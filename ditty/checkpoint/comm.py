"""The few collectives a checkpoint needs, all on CPU tensors, none through pickle.

Checkpointing gets its own gloo group: an async save runs DCP's planning collectives and ditty's
barriers from a background thread, and collectives of two threads interleaving on the training's
group would pair up wrongly across ranks (a hang, or worse, silently mismatched data). A second
group costs one set of gloo connections per rank. Gloo also means the checkpoint's small
coordination messages stay on CPU even when training talks over NCCL.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from ditty._utils.dist import configured_timeout


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def new_checkpoint_group() -> dist.ProcessGroup | None:
    """Collective: every rank must call it at the same point. None when there is no process group."""
    if not initialized():
        return None
    # The training group's timeout, not torch's 30-minute default for new groups: a peer that stops
    # answering during a save ends the run as soon as it would during a step.
    return dist.new_group(backend="gloo", timeout=configured_timeout())


def rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group) if group is not None else 0


def world_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if group is not None else 1


def all_gather_json(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's JSON value, in rank order. JSON text in uint8 tensors instead of
    `all_gather_object`, which would unpickle what other ranks send."""
    if group is None:
        return [json.loads(json.dumps(obj))]
    data = json.dumps(obj).encode("utf-8")
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.zeros_like(buf) for _ in sizes]
    dist.all_gather(bufs, buf, group=group)
    return [json.loads(b[: int(s.item())].numpy().tobytes().decode("utf-8")) for b, s in zip(bufs, sizes)]


def all_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """A barrier that also tells every rank whether all of them succeeded, so one rank's failure
    makes all ranks raise instead of leaving the others waiting in a plain barrier."""
    if group is None:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def all_max(value: int, group: dist.ProcessGroup | None) -> int:
    """The largest of every rank's `value` (a small integer), on every rank."""
    if group is None:
        return value
    flag = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item())
