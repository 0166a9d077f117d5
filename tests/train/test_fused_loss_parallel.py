"""`[train] loss_chunks` on two gloo ranks against one process with the full logits: FSDP2 with the
output head as a sharded unit of its own, FSDP2 with a tied head (in the root unit), DDP, and
DeepSpeed ZeRO-2. Losses and final weights within ditty's parity bound (measured: losses 1e-7,
weights 2.4e-6 relative)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import pytest

from tests.parallel.harness import run_ranks
from tests.train.test_distributed import TOLERANCE, final_weights, loss_error, losses, relative_error, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


def chunked(config, chunks: int = 3):
    return replace(config, train=replace(config.train, loss_chunks=chunks))


def tied(config):
    return replace(config, model=replace(config.model, config={**config.model.config, "tie_word_embeddings": True}))


def _run_all(rank: int, world: int, configs: list) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    from ditty.train import Trainer

    for config in configs:
        Trainer(config).train()


def test_chunked_loss_on_two_ranks_matches_full_logits_on_one(tmp_path):
    from ditty.train import Trainer

    path = {name: str(tmp_path / name) for name in ("single", "single_tied", "fsdp", "fsdp_tied", "ddp", "zero2")}
    Trainer(tiny_config(path["single"], micro=4)).train()
    Trainer(tied(tiny_config(path["single_tied"], micro=4))).train()
    runs = {
        "fsdp": chunked(tiny_config(path["fsdp"], micro=2, parallel="fsdp")),
        "fsdp_tied": tied(chunked(tiny_config(path["fsdp_tied"], micro=2, parallel="fsdp"))),
        "ddp": chunked(tiny_config(path["ddp"], micro=2, parallel="ddp")),
    }
    if importlib.util.find_spec("deepspeed"):
        runs["zero2"] = chunked(tiny_config(path["zero2"], micro=2, parallel="deepspeed", zero_stage=2))
    run_ranks(_run_all, 2, list(runs.values()), timeout=900)
    for name in runs:
        reference = path["single_tied" if name.endswith("tied") else "single"]
        loss_err = loss_error(losses(path[name]), losses(reference))
        got, expected = final_weights(path[name]), final_weights(reference)
        # A tied model saved from FSDP writes the shared matrix once, as one process does.
        assert sorted(got) == sorted(expected), name
        weight_err = relative_error(got, expected)
        print(f"{name}: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
        assert loss_err < TOLERANCE and weight_err < TOLERANCE, name


def _dtensor_head(rank: int, world: int) -> float:
    """A head whose weight is a DTensor sharded over the vocabulary (as FSDP2 stores it between
    forwards): the fused loss gathers it differentiably; its gradient comes back sharded and equal
    to the full-logits gradient's shard."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ditty.fused_loss import fused_linear_cross_entropy, head_projection

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(64, 16)
    head = torch.nn.Linear(16, 64, bias=False)
    head.weight = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    hidden = torch.randn(10, 16)
    target = torch.randint(0, 64, (10,))
    total, _ = fused_linear_cross_entropy(hidden, head_projection(head), target, chunks=3)
    total.backward()
    reference = full.clone().requires_grad_()
    F.cross_entropy(hidden @ reference.t(), target, reduction="sum").backward()
    assert head.weight.grad.placements == (Shard(0),)
    return float((head.weight.grad.full_tensor() - reference.grad).abs().max())


def test_a_dtensor_sharded_head():
    errors = run_ranks(_dtensor_head, 2, timeout=300)
    assert max(errors) < 1e-5, errors
