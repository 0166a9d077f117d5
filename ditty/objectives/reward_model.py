"""The Bradley-Terry loss of a scalar reward model (`model.task = "reward-model"`), as TRL's
RewardTrainer computes it, with its metric names (accuracy, margin, mean_reward).

How the trainer plugs it in: a sequence classifier with one output (num_labels = 1) scores the
chosen and the rejected rows of a `ditty.objectives.logprobs.concatenate_pairs` batch in one
forward; `split_pairs` of its [2N, 1] scores (squeezed) gives `chosen_scores` and
`rejected_scores`. `global_pairs` is the pair count of the whole global batch; the loss and each
metric are this split's share (ditty.objectives.output).
"""

from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ditty.objectives.output import Count, ObjectiveOutput, detached, share


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    *,
    global_pairs: Count,
    margin: Optional[Tensor] = None,
    center_rewards_coefficient: Optional[float] = None,
) -> ObjectiveOutput:
    """-logsig(r_chosen - r_rejected - margin) averaged over pairs (Bradley & Terry 1952; the
    InstructGPT reward loss). `margin` [N] is TRL's optional per-pair margin column;
    `center_rewards_coefficient` (TRL's, default None) adds c * mean((r_chosen + r_rejected)^2),
    which keeps rewards centred on zero (Eisenstein et al. 2023)."""
    difference = chosen_scores - rejected_scores
    losses = -F.logsigmoid(difference if margin is None else difference - margin)
    loss = share(losses, global_pairs)
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * share((chosen_scores + rejected_scores) ** 2, global_pairs)
    metrics = {
        "accuracy": share((difference > 0).to(difference.dtype), global_pairs),
        "margin": share(difference, global_pairs),
        "mean_reward": share(chosen_scores + rejected_scores, 2 * global_pairs),
        "rewards/chosen": share(chosen_scores, global_pairs),
        "rewards/rejected": share(rejected_scores, global_pairs),
    }
    return ObjectiveOutput(loss, detached(metrics))
