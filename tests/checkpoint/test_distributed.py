"""Two gloo processes with FSDP2: sharded (async) save, load on 2 ranks, and resharding 1 -> 2 -> 1."""

from __future__ import annotations

import copy
import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from ditty.checkpoint import CheckpointManager

from .helpers import app_state, build, train_step

# DCP warns on every save/load without a process group; single-process is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

FULL = StateDictOptions(full_state_dict=True)  # every rank gets the whole tensors
WORLD = 2


def _full_state(model, opt) -> dict:
    """The unsharded model and optimizer state keyed by parameter name (collective under FSDP)."""
    # deepcopy: unsharded entries (AdamW's `step`) come back as the live tensors, not copies.
    model_sd, optim_sd = copy.deepcopy(get_state_dict(model, opt, options=FULL))
    return {
        "model": model_sd,
        "optim_state": optim_sd.get("state", {}),
        "param_groups": optim_sd.get("param_groups", []),
    }


def _assert_equal_states(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["optim_state"].keys() == b["optim_state"].keys()
    for k in a["optim_state"]:
        for name, v in a["optim_state"][k].items():
            assert torch.equal(v, b["optim_state"][k][name]), (k, name)
    assert a["param_groups"] == b["param_groups"]


def _shard(model):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _worker(rank: int, port: int, src_ckpt: str, expected_path: str, run_dir: str, dump_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        # 1 -> 2: a single-process checkpoint loads into the FSDP2 shards.
        model, opt, sched = build(seed=11, shard=_shard)
        mgr = CheckpointManager(run_dir, keep_last=1, async_save=True)
        sidecar = mgr.load(src_ckpt, app_state(model, opt))
        sched.load_state_dict(sidecar["scheduler"])
        _assert_equal_states(_full_state(model, opt), torch.load(expected_path, weights_only=True))

        torch.manual_seed(100 + rank)  # per-rank streams, as dropout on different data would have
        train_step(model, opt, sched)
        at_save = _full_state(model, opt)
        rng_at_save = torch.get_rng_state()
        path = mgr.save(3, app_state(model, opt), {"scheduler": sched.state_dict()})
        train_step(model, opt, sched)  # runs while the async save may still be writing
        mgr.wait()
        if rank == 0:
            torch.save(at_save, dump_path)

        # 2 -> 2: load back into fresh shards; every rank gets its own RNG stream back.
        model, opt, sched = build(seed=12, shard=_shard)
        sidecar = mgr.load(path, app_state(model, opt))
        _assert_equal_states(_full_state(model, opt), at_save)
        assert sorted(sidecar["rng"]) == ["0", "1"] and sidecar["world_size"] == WORLD
        assert sidecar["rng"]["0"]["torch"] != sidecar["rng"]["1"]["torch"]
        assert mgr.restore_rng(sidecar)
        assert torch.equal(torch.get_rng_state(), rng_at_save)
        mgr.close()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fsdp2_two_processes_save_load_and_reshard(tmp_path):
    model, opt, sched = build(seed=0)
    for _ in range(2):
        train_step(model, opt, sched)
    src = CheckpointManager(tmp_path / "one", keep_last=1).save(
        2, app_state(model, opt), {"scheduler": sched.state_dict()}
    )
    torch.save(_full_state(model, opt), tmp_path / "expected.pt")

    run_dir, dump = tmp_path / "two", tmp_path / "at_save.pt"
    from tests.train import forked

    forked.context()  # the workers fork from the server that imported torch and ditty once
    ctx = mp.start_processes(
        _worker,
        args=(_free_port(), str(src), str(tmp_path / "expected.pt"), str(run_dir), str(dump)),
        nprocs=WORLD,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + 150
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the two checkpoint workers did not finish in time")

    # 2 -> 1: the sharded checkpoint loads into a plain single-process model.
    path = run_dir / "checkpoints" / "step-3"
    assert CheckpointManager(run_dir, keep_last=1).latest_complete() == path
    model, opt, _ = build(seed=13)
    CheckpointManager(run_dir, keep_last=1).load(path, app_state(model, opt))
    _assert_equal_states(_full_state(model, opt), torch.load(dump, weights_only=True))
