"""A loss with trainable parameters trains with the model (UncertaintyWeightedLoss's log-variances).

The trainer calls `attach_loss_parameters` once, after the model's converters (so PEFT does not
freeze them) and before parallelization and the optimizer (so DDP and the optimizer see them).
"""

from __future__ import annotations

from typing import Any

from ditty._utils.modules import LOSS_MODULE
from ditty.stages.loss import loss_sharding_refused


def loss_parameters(loss: Any) -> list[tuple[str, Any]]:
    """The trainable parameters a loss holds, named: its own (`named_parameters()`, as an nn.Module
    or UncertaintyWeightedLoss has), those of nn.Module / Parameter attributes of a plain loss
    (the original Ditty's losses were nn.Modules, so ported ones may hold layers), and its parts'."""
    import torch

    found: list[tuple[str, Any]] = []
    if callable(getattr(loss, "named_parameters", None)):
        found += [(n, p) for n, p in loss.named_parameters() if p.requires_grad]
    elif loss is not None:
        for attr, value in vars(loss).items():
            if isinstance(value, torch.nn.Parameter) and value.requires_grad:
                found.append((attr, value))
            elif isinstance(value, torch.nn.Module):
                found += [(f"{attr}.{n}", p) for n, p in value.named_parameters() if p.requires_grad]
    for index, (part, _) in enumerate(getattr(loss, "parts", None) or ()):
        found += [(f"parts.{index}.{n}", p) for n, p in loss_parameters(part)]
    seen: set[int] = set()
    return [(n, p) for n, p in found if not (id(p) in seen or seen.add(id(p)))]


def attach_loss_parameters(model: Any, loss: Any, *, parallel_kind: str = "none") -> Any:
    """Register a loss's trainable parameters on the model as the submodule `ditty_loss`.

    Why on the model: everything the trainer does with parameters then covers them with no other
    path (the optimizer's groups, gradient clipping, DDP's gradient averaging, checkpoints and
    their resume). The loss keeps computing with the same Parameter objects. They appear in the
    model's state dict as `ditty_loss.*` (so a custom model's final/ holds them too;
    `ModelFactory.from_checkpoint` skips them). Sharded engines (fsdp, hsdp, deepspeed) would
    shard them with the model's root, outside whose forward the loss runs: refused.
    """
    named = loss_parameters(loss)
    if not named:
        return model
    if parallel_kind in ("fsdp", "hsdp", "deepspeed"):
        raise loss_sharding_refused(parallel_kind)
    import torch

    holder = torch.nn.Module()
    for name, parameter in named:
        holder.register_parameter(name.replace(".", "_"), parameter)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        holder.to(device)  # in place: the loss's references stay valid
    model.add_module(LOSS_MODULE, holder)
    return model
