"""Advantage estimators: the rewards of the whole global batch -> one advantage per completion.

An estimator is a function `fn(rewards, group_size, lengths) -> advantages`: `rewards` [N] float64
of every rank's completions in global prompt order, a group's `group_size` completions adjacent;
`lengths` [N] their token counts (an estimator that normalises over tokens reads them); the result
[N]. `rl.advantage` names one of `ESTIMATORS` or a function of one's own as "package.module:function"
(the compiler imports and checks it before any weight loads; ditty.rl.AdvantageEstimator is the
interface). A built-in's settings (rl.scale_rewards) are bound by `estimator_for(rl)`.

| name | advantage of completion i of a group g |
|---|---|
| "group" | GRPO: (r_i - mean_g) / (std_g + eps), or the batch's std, or none (`rl.scale_rewards`) |
| "rloo" | RLOO: r_i - the mean of the group's other rewards (ditty.objectives.rl.rloo) |
| "reinforce_pp" | REINFORCE++, group baseline: r_i - mean_g, whitened over every completion token of the batch |

Per-turn credit (`rl.credit = "turn"`) is the group estimator's own, from each turn's reward
(ditty.objectives.rl.turn_credit.turn_advantages); the compiler refuses it beside another estimator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the compiler reads ESTIMATORS without importing torch
    from torch import Tensor

Estimator = Callable[["Tensor", int, "Tensor"], "Tensor"]
"""fn(rewards [N], group_size, lengths [N]) -> advantages [N]."""

WHITEN_EPS = 1e-8
"""Added to the variance before the square root in REINFORCE++'s whitening (verl's masked_whiten)."""


def group(rewards: Tensor, group_size: int, lengths: Tensor, *, scale_rewards: str = "group") -> Tensor:
    """GRPO's group-normalised advantages (ditty.objectives.rl.grpo.group_advantages)."""
    from ditty.objectives.rl.grpo import group_advantages

    return group_advantages(rewards, group_size, scale_rewards).advantages


def rloo(rewards: Tensor, group_size: int, lengths: Tensor, *, scale_rewards: str = "none") -> Tensor:
    """RLOO's leave-one-out advantages (ditty.objectives.rl.rloo.leave_one_out_advantages)."""
    from ditty.objectives.rl.rloo import leave_one_out_advantages

    return leave_one_out_advantages(rewards, group_size, scale_rewards).advantages


def reinforce_pp(rewards: Tensor, group_size: int, lengths: Tensor) -> Tensor:
    """REINFORCE++ with a group baseline (Hu et al. 2025; verl's reinforce_plus_plus_baseline): each
    reward less its group's mean, then whitened over the batch as verl whitens the advantage tiled over
    the response tokens: the mean and the (unbiased) variance count every completion once per token,
    A = (s - mean) / sqrt(var + 1e-8). A completion of no tokens takes no part in the statistics."""
    import torch

    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{tuple(rewards.shape)} rewards do not split into groups of {group_size}")
    grouped = rewards.reshape(-1, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    weights = lengths.to(centred.dtype)
    tokens = weights.sum()
    if tokens <= 1:
        return centred
    mean = (centred * weights).sum() / tokens
    variance = ((centred - mean) ** 2 * weights).sum() / (tokens - 1)  # verl's masked_var(unbiased=True)
    return (centred - mean) * torch.rsqrt(variance + WHITEN_EPS)


@dataclass(frozen=True)
class BuiltIn:
    function: Callable[..., Tensor]
    settings: tuple[str, ...] = ()
    """The [rl] keys bound as its keyword arguments."""
    summary: str = ""


ESTIMATORS: dict[str, BuiltIn] = {
    "group": BuiltIn(group, ("scale_rewards",), "group-normalised"),
    "rloo": BuiltIn(rloo, ("scale_rewards",), "leave-one-out (RLOO)"),
    "reinforce_pp": BuiltIn(reinforce_pp, (), "REINFORCE++ with a group baseline, whitened over the batch's tokens"),
}


def estimator_for(rl: Any) -> Estimator:
    """The estimator `rl.advantage` names: a built-in with its settings bound, or the user's function."""
    built_in = ESTIMATORS.get(rl.advantage)
    if built_in is not None:
        return functools.partial(built_in.function, **{key: getattr(rl, key) for key in built_in.settings})
    from ditty.config.references import import_reference

    return import_reference(rl.advantage, key="rl.advantage")


def describe(advantage: str) -> str:
    """The plan's and the card's words for `rl.advantage`."""
    built_in = ESTIMATORS.get(advantage)
    return built_in.summary if built_in is not None else f"{advantage} (your own estimator)"
