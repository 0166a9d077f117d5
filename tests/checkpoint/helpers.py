"""A tiny model, optimizer and schedule whose training depends on every piece of resumable state:
weights, AdamW moments, the LR schedule, and the torch RNG (dropout, and batches drawn from it)."""

from __future__ import annotations

import torch

from ditty.checkpoint import ModelOptimizerState


def build(seed: int = 0, shard=None):
    """shard: applied to the model before the optimizer is made (FSDP2's fully_shard)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
    if shard is not None:
        shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # non-constant LR
    return model, opt, sched


def train_step(model, opt, sched) -> float:
    x = torch.randn(8, 6)  # drawn from the global RNG, like dropout: the RNG must be restored
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    return loss.item()


def app_state(model, opt):
    return {"train": ModelOptimizerState(model, opt)}


def assert_same_state(a_model, a_opt, b_model, b_opt):
    for (ka, va), (kb, vb) in zip(a_model.state_dict().items(), b_model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    sa, sb = a_opt.state_dict(), b_opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name, value in sa["state"][k].items():
            assert torch.equal(value, sb["state"][k][name]), (k, name)
