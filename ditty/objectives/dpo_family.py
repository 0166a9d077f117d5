"""Preference-optimisation losses as pure functions of per-sequence log-probabilities: DPO (with
conservative label smoothing), IPO, SimPO, ORPO and KTO, each with TRL's defaults and TRL's metric
names (rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen,
logps/rejected), so users' dashboards carry over.

How the trainer plugs them in (`[preference] kind`):
- Inputs are per-sequence SUMS of completion-token log-probabilities and completion lengths, from
  `ditty.objectives.logprobs` (`sequence_logps` of a `concatenate_pairs` batch, `split_pairs`):
  the policy's with gradients, the reference's without ("auto", "precompute" or a separate model;
  SimPO and ORPO take none).
- `global_pairs` (for KTO the examples and the desirable/undesirable counts) are counts over the
  WHOLE global batch, summed over micro-batches and ranks before the forward (the trainer hands them
  to the loss stage, ditty.objectives.preference_loss, as `ctx["global_units"]`). Each loss and
  metric is this split's share (ditty.objectives.output), so the trainer adds the values of all
  micro-batches and ranks.
- KTO's KL estimate z: `kto_kl_share` of the examples it is taken over, summed, then `kto_kl` (no
  gradients). The trainer takes it over each micro-batch (as TRL takes it over each device's batch).

Where ditty and TRL differ on purpose: DPO's `label_smoothing` is the conservative-DPO form
(-(1-e) logsig(b d) - e logsig(-b d)), which TRL keeps for CPO/SimPO and its "robust"/"exo_pair"
DPO variants; ORPO's NLL is each chosen COMPLETION's mean token NLL, averaged over pairs as the paper
writes it (TRL averages over every token of the batch, prompt included); SimPO
adds no behaviour-cloning term (TRL's CPOConfig with loss_type="simpo" and cpo_alpha=0).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ditty.objectives.output import Count, ObjectiveOutput, detached, share

DPO_BETA = 0.1
"""TRL's DPOConfig.beta (also CPOConfig's, ORPOConfig's and KTOConfig's)."""
SIMPO_GAMMA = 0.5
"""TRL's CPOConfig.simpo_gamma: the target reward margin, in reward units (gamma = beta * gamma_beta_ratio)."""


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    reference_chosen_logps: Tensor,
    reference_rejected_logps: Tensor,
    *,
    global_pairs: Count,
    beta: float = DPO_BETA,
    label_smoothing: float = 0.0,
) -> ObjectiveOutput:
    """DPO (Rafailov et al. 2023, eq. 7): -logsig(beta * (chosen log-ratio - rejected log-ratio)),
    with conservative label smoothing e (the probability that a pair's label is flipped)."""
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing is a flip probability in [0, 0.5), not {label_smoothing}")
    chosen_ratio = policy_chosen_logps - reference_chosen_logps
    rejected_ratio = policy_rejected_logps - reference_rejected_logps
    logits = beta * (chosen_ratio - rejected_ratio)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    metrics = pair_metrics(
        beta * chosen_ratio, beta * rejected_ratio, policy_chosen_logps, policy_rejected_logps, global_pairs
    )
    return ObjectiveOutput(share(losses, global_pairs), metrics)


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    reference_chosen_logps: Tensor,
    reference_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    global_pairs: Count,
    beta: float = DPO_BETA,
) -> ObjectiveOutput:
    """IPO (Azar et al. 2023, eq. 17) with beta as tau: (h - 1 / (2 tau))^2, where h is the chosen
    minus the rejected log-ratio, each averaged over its completion tokens (as TRL, and as the IPO
    authors confirmed their results were computed)."""
    chosen_ratio = policy_chosen_logps - reference_chosen_logps
    rejected_ratio = policy_rejected_logps - reference_rejected_logps
    h = chosen_ratio / _lengths(chosen_lengths) - rejected_ratio / _lengths(rejected_lengths)
    losses = (h - 1.0 / (2.0 * beta)) ** 2
    metrics = pair_metrics(
        beta * chosen_ratio, beta * rejected_ratio, policy_chosen_logps, policy_rejected_logps, global_pairs
    )
    return ObjectiveOutput(share(losses, global_pairs), metrics)


def simpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    global_pairs: Count,
    beta: float = DPO_BETA,
    gamma: Optional[float] = None,
    gamma_beta_ratio: Optional[float] = None,
    label_smoothing: float = 0.0,
) -> ObjectiveOutput:
    """SimPO (Meng et al. 2024, eq. 6), reference-free: -logsig(beta/|y_w| log p(y_w) - beta/|y_l|
    log p(y_l) - gamma). The margin is `gamma` (TRL's simpo_gamma, default 0.5) or, as in the
    SimPO authors' code, `gamma_beta_ratio` (gamma = beta * ratio); give at most one."""
    if gamma is not None and gamma_beta_ratio is not None:
        raise ValueError("give gamma or gamma_beta_ratio, not both")
    if gamma is None:
        gamma = SIMPO_GAMMA if gamma_beta_ratio is None else beta * gamma_beta_ratio
    chosen = policy_chosen_logps / _lengths(chosen_lengths)
    rejected = policy_rejected_logps / _lengths(rejected_lengths)
    logits = beta * (chosen - rejected) - gamma
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    metrics = pair_metrics(beta * chosen, beta * rejected, chosen, rejected, global_pairs)
    return ObjectiveOutput(share(losses, global_pairs), metrics)


def orpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    global_pairs: Count,
    beta: float = DPO_BETA,
) -> ObjectiveOutput:
    """ORPO (Hong et al. 2024, eq. 6-7), reference-free: the mean over pairs of L_SFT - beta (lambda in
    the paper) logsig(log odds(y_w) - log odds(y_l)), where L_SFT is the chosen completion's NLL
    averaged over its tokens (the paper's eq. 2, per sequence), odds(y) = P(y) / (1 - P(y)) and P(y)
    is the length-normalised probability exp(mean token logp). A per-pair term, so the loss is a mean
    over pairs like every other kind."""
    chosen = policy_chosen_logps / _lengths(chosen_lengths)
    rejected = policy_rejected_logps / _lengths(rejected_lengths)
    log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    nll = -share(chosen, global_pairs)
    loss = nll - beta * share(ratio, global_pairs)
    metrics = pair_metrics(beta * chosen, beta * rejected, chosen, rejected, global_pairs)
    metrics["nll_loss"] = nll.detach()
    metrics["log_odds_ratio"] = share(ratio, global_pairs).detach()
    metrics["log_odds_chosen"] = share(log_odds, global_pairs).detach()
    return ObjectiveOutput(loss, metrics)


def kto_kl_share(policy_kl_logps: Tensor, reference_kl_logps: Tensor, global_kl_examples: Count) -> Tensor:
    """This split's share of KTO's KL estimate z_ref: the mean, over the `global_kl_examples` it is
    taken over, of the policy's minus the reference's log-probability of (prompt, completion) pairs.
    TRL takes it over each device's batch of MISMATCHED pairs (each prompt with the previous row's
    completion, one more forward); ditty's loss stage (ditty.objectives.preference_loss) takes it over
    each micro-batch's own examples, with no extra forward. No gradients flow through it (the
    paper's z_ref is a baseline, not a term to optimise)."""
    return share((policy_kl_logps - reference_kl_logps).detach(), global_kl_examples)


def kto_kl(kl_share_sum: Tensor) -> Tensor:
    """The global KL estimate from the summed shares, clamped at 0 as in TRL (a KL is not negative)."""
    return kl_share_sum.detach().clamp(min=0)


def kto_loss(
    policy_logps: Tensor,
    reference_logps: Tensor,
    desirable: Tensor,
    kl: Tensor,
    *,
    global_examples: Count,
    global_desirable: Count,
    global_undesirable: Count,
    beta: float = DPO_BETA,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> ObjectiveOutput:
    """KTO (Ethayarajh et al. 2024, eq. 7-8) on unpaired examples: with r = policy - reference
    log-probability, a desirable example costs desirable_weight * (1 - sig(beta (r - z))), an
    undesirable one undesirable_weight * (1 - sig(beta (z - r))), z = `kl` (from `kto_kl`); the loss
    is the mean over every example of the global batch. `desirable` [N] is the label column."""
    desirable = desirable.bool()
    ratio = policy_logps - reference_logps
    kl = kl.detach().to(ratio.dtype)
    chosen_losses = desirable_weight * (1.0 - torch.sigmoid(beta * (ratio - kl)))
    rejected_losses = undesirable_weight * (1.0 - torch.sigmoid(beta * (kl - ratio)))
    losses = torch.where(desirable, chosen_losses, rejected_losses)
    rewards = beta * ratio
    metrics: dict[str, Tensor] = {}
    zero = rewards.new_zeros(())
    if _positive(global_desirable):
        metrics["rewards/chosen"] = share(torch.where(desirable, rewards, zero), global_desirable)
        metrics["logps/chosen"] = share(torch.where(desirable, policy_logps, zero), global_desirable)
    if _positive(global_undesirable):
        metrics["rewards/rejected"] = share(torch.where(desirable, zero, rewards), global_undesirable)
        metrics["logps/rejected"] = share(torch.where(desirable, zero, policy_logps), global_undesirable)
    if "rewards/chosen" in metrics and "rewards/rejected" in metrics:
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    metrics["kl"] = kl * share(torch.ones_like(ratio), global_examples)
    return ObjectiveOutput(share(losses, global_examples), detached(metrics))


def pair_metrics(
    chosen_rewards: Tensor,
    rejected_rewards: Tensor,
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    global_pairs: Count,
) -> dict[str, Tensor]:
    """TRL's metrics of a batch of pairs, each this split's share of the global-batch mean."""
    return detached(
        {
            "rewards/chosen": share(chosen_rewards, global_pairs),
            "rewards/rejected": share(rejected_rewards, global_pairs),
            "rewards/margins": share(chosen_rewards - rejected_rewards, global_pairs),
            "rewards/accuracies": share((chosen_rewards > rejected_rewards).to(chosen_rewards.dtype), global_pairs),
            "logps/chosen": share(chosen_logps, global_pairs),
            "logps/rejected": share(rejected_logps, global_pairs),
        }
    )


def _lengths(lengths: Tensor) -> Tensor:
    return lengths.clamp(min=1)


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Maechler 2012): log(-expm1(x)) near 0,
    log1p(-exp(x)) below -log 2. x is clamped just below 0 (a probability of exactly 1 has no odds)."""
    x = x.clamp(max=-1e-12 if x.dtype == torch.float64 else -1e-7)
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _positive(count: Count) -> bool:
    return bool(count > 0)
