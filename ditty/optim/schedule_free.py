"""Schedule-free AdamW (the `schedulefree` package) and the train/eval switch every optimizer may have.

Schedule-free AdamW trains at an interpolation y of two sequences and evaluates at their average
x: the model's weights are y in train mode and x in eval mode. The trainer puts the optimizer in
eval mode to evaluate, to save a checkpoint and to write final/, and back in train mode after, so
checkpoints and final/ hold the weights a user should evaluate (x). A resume loads x and the
optimizer's eval-mode flag, and the switch back to train mode recomputes y exactly as the
uninterrupted run did after its save: the resumed steps are bitwise the same.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def schedule_free_adamw(groups: list[dict[str, Any]], **options: Any):
    """An `AdamWScheduleFree` whose state exists from the start (see `_eager_state`)."""
    from schedulefree import AdamWScheduleFree

    class ScheduleFreeAdamW(AdamWScheduleFree):
        # Per-group counters (schedulefree keeps them in the param groups): a resume must take them
        # from the checkpoint, not from the freshly built optimizer (ditty.checkpoint.stateful).
        group_state_keys = ("k", "train_mode", "weight_sum", "lr_max", "scheduled_lr")

    optimizer = ScheduleFreeAdamW(groups, **options)
    _eager_state(optimizer)
    return optimizer


def _eager_state(optimizer: Any) -> None:
    """Create z and exp_avg_sq now, as the first step would (z = the weights, exp_avg_sq = 0).

    torch's checkpoint loader initialises an empty optimizer state by stepping it with zero
    gradients, which schedule-free refuses in eval mode and which would advance its step counter.
    """
    import torch

    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            state["z"] = torch.clone(parameter.detach(), memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)


def has_modes(optimizer: Any) -> bool:
    """Whether `optimizer` has schedule-free's train()/eval() weight switch."""
    return callable(getattr(optimizer, "eval", None)) and callable(getattr(optimizer, "train", None))


def train_mode(optimizer: Any) -> None:
    """Put a schedule-free optimizer in train mode (the weights become y); others are untouched."""
    if has_modes(optimizer):
        optimizer.train()


@contextmanager
def evaluation_weights(optimizer: Any) -> Iterator[None]:
    """The model holds the weights to evaluate inside the block (schedule-free's x), and the
    training weights again after it, when it held them before."""
    switch = has_modes(optimizer) and any(group.get("train_mode") for group in optimizer.param_groups)
    if switch:
        optimizer.eval()
    try:
        yield
    finally:
        if switch:
            optimizer.train()
