"""Per-turn credit: the advantages of episodes whose turns each earned a reward (the estimators of
one reward per completion are ditty.objectives.rl.estimators).

`turn_advantages` is the per-turn credit of episodes of several turns (`rl.credit = "turn"`):
DeepSeekMath's process supervision (Shao et al. 2024, section 4.1.3): every turn reward of a group's
episodes is normalised by the mean (and, unless scale_rewards = "none", the std) of all of them, and
a turn's tokens take the sum of the normalised rewards of that turn and the later ones. A group's
episodes are on one rank, so it needs no other rank's rewards.
"""

from __future__ import annotations

import torch
from torch import Tensor


def turn_advantages(
    turn_rewards: list[list[float]],
    turn_spans: list[list[tuple[int, int]]],
    widths: list[int],
    group_size: int,
    scale_rewards: str,
) -> Tensor:
    """[rows, max width] per-token advantages (0 outside the model's turns) of episodes whose turns
    span `turn_spans` and earned `turn_rewards`, a group's `group_size` rows adjacent."""
    from ditty.objectives.rl.grpo import ADVANTAGE_EPS

    out = torch.zeros(len(turn_rewards), max(widths, default=0), dtype=torch.float64)
    for start in range(0, len(turn_rewards), group_size):
        rows = range(start, start + group_size)
        pooled = torch.tensor([r for row in rows for r in turn_rewards[row]], dtype=torch.float64)
        mean = pooled.mean()
        spread = pooled.std() if scale_rewards != "none" and pooled.numel() > 1 else torch.ones(())
        scale = spread + ADVANTAGE_EPS if scale_rewards != "none" else spread
        for row in rows:
            normalised = (torch.tensor(turn_rewards[row], dtype=torch.float64) - mean) / scale
            to_go = normalised.flip(0).cumsum(0).flip(0)  # this turn's and the later ones'
            for (begin, end), value in zip(turn_spans[row], to_go.tolist()):
                out[row, begin:end] = value
    return out
