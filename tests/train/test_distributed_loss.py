"""Two gloo ranks, each with half of the global batch, give the single-process loss and gradients:
the supervised-token count is all-reduced before the backward, and the world-size factor undoes
the gradient averaging of data parallelism (emulated here by an all-reduce mean, as DDP does)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ditty.data.collate import pad_samples
from ditty.loss import CausalLMLoss
from ditty.train.step import LossNormaliser, all_reduce_sum


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 50)

    def forward(self, input_ids):
        return {"logits": self.out(torch.tanh(self.emb(input_ids)))}


def _samples():
    g = torch.Generator().manual_seed(1)
    out = []
    for length, prompt in [(4, 1), (12, 9), (6, 2), (9, 3), (3, 1), (11, 2), (7, 5), (5, 1)]:
        ids = torch.randint(1, 50, (length,), generator=g).tolist()
        out.append((ids, [-100] * prompt + ids[prompt:]))
    return out


def _loss_and_grads(model, micro_batches, world_size):
    loss_fn = CausalLMLoss()
    norm = LossNormaliser.for_step(micro_batches, loss_fn.count_tokens, world_size)
    total = torch.zeros((), dtype=torch.float64)
    for batch in micro_batches:
        out = loss_fn(model(batch["input_ids"]), {"batch": batch})
        scaled = norm.scale(out, batch["input_ids"].shape[0])
        scaled.backward()
        total += scaled.detach().double()
    for p in model.parameters():  # what DDP does to gradients: the mean over ranks
        if world_size > 1:
            dist.all_reduce(p.grad)
            p.grad /= world_size
    loss = all_reduce_sum(total) / world_size
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def _worker(rank, world_size, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        samples = _samples()[rank * 4 : rank * 4 + 4]  # rank r: the r-th half of the global batch
        micro = [pad_samples(samples[i : i + 2], 0) for i in (0, 2)]  # micro 2 x accumulation 2
        loss, grads = _loss_and_grads(TinyLM(), micro, world_size)
        if rank == 0:
            queue.put(
                (loss, [g.tolist() for g in grads])
            )  # plain lists: tensors would go through shared memory that dies with the worker
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_match_one_process():
    loss_1, grads_1 = _loss_and_grads(TinyLM(), [pad_samples(_samples(), 0)], world_size=1)
    from tests.train import forked

    queue = forked.context().SimpleQueue()  # ranks fork from the server that imported torch once
    mp.start_processes(_worker, args=(2, _free_port(), queue), nprocs=2, join=True, start_method="forkserver")
    loss_2, grads_2 = queue.get()
    assert abs(loss_2 - loss_1) < 1e-6
    for a, b in zip(grads_1, (torch.tensor(g) for g in grads_2)):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-5)
