"""ditty's objectives against TRL's own loss code on the same fixed log-probabilities: DPO and IPO
(DPOTrainer._compute_loss), SimPO (CPOTrainer.cpo_loss), ORPO (ORPOTrainer.odds_ratio_loss), KTO
(KTOTrainer._compute_loss) and every GRPO variant (GRPOTrainer._compute_loss). TRL's methods run
unbound on a stand-in `self` holding only the settings they read, and a stand-in model returning the
per-token log-probabilities TRL's fused head would; nothing is trained."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")
# Importing TRL's trainers (transformers, accelerate, datasets) takes about 45 s of wall time here.
pytestmark = pytest.mark.slow

from ditty.objectives.dpo_family import dpo_loss, ipo_loss, orpo_loss, simpo_loss  # noqa: E402
from ditty.objectives.rl.grpo import grpo_loss  # noqa: E402

TOL = 1e-6


class Accelerator:
    """What TRL's loss code asks of accelerate on one process."""

    device = torch.device("cpu")
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def gather(self, tensor):
        return tensor if tensor.dim() else tensor[None]

    gather_for_metrics = gather

    def reduce(self, tensor, reduction="sum"):
        return tensor


def fixed_pairs(pairs=5, width=9, seed=0):
    """Per-token completion log-probabilities of chosen and rejected (completion after a 3-token
    prompt, varying lengths) for a policy and a reference."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(2 * pairs, width, dtype=torch.long)
    for row in range(2 * pairs):
        mask[row, 3 : 3 + 2 + (row * 3) % (width - 4)] = 1
    policy = -torch.rand(2 * pairs, width - 1, generator=generator, dtype=torch.float64) * 3
    reference = -torch.rand(2 * pairs, width - 1, generator=generator, dtype=torch.float64) * 3
    shifted_mask = mask[:, 1:]
    return mask, policy * shifted_mask, reference * shifted_mask


def trl_dpo(loss_type, beta, mask, policy_tokens, reference_tokens):
    from trl.trainer.dpo_trainer import DPOTrainer

    reference = (reference_tokens * mask[:, 1:]).sum(-1)
    ref_chosen, ref_rejected = reference.chunk(2)
    model = SimpleNamespace(training=True)
    trainer = SimpleNamespace(
        model=model,
        accelerator=Accelerator(),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(),
    )

    def forward(**kwargs):
        zeros = torch.zeros_like(policy_tokens)
        return SimpleNamespace(log_probs=policy_tokens, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    inputs = {
        "input_ids": torch.ones_like(mask),
        "attention_mask": torch.ones_like(mask),
        "completion_mask": mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    loss = DPOTrainer._compute_loss(trainer, forward, inputs, return_outputs=False)
    return loss.item(), {name: values[-1] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("beta", [0.1, 0.7])
def test_dpo_matches_trl(beta):
    mask, policy_tokens, reference_tokens = fixed_pairs()
    want, trl_metrics = trl_dpo("sigmoid", beta, mask, policy_tokens, reference_tokens)
    policy, reference = policy_tokens.sum(-1), reference_tokens.sum(-1)
    out = dpo_loss(*policy.chunk(2), *reference.chunk(2), global_pairs=5, beta=beta)
    assert abs(out.loss.item() - want) < TOL
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        assert abs(out.metrics[name].item() - trl_metrics[name]) < TOL, name


def test_ipo_matches_trl():
    mask, policy_tokens, reference_tokens = fixed_pairs(seed=1)
    want, _ = trl_dpo("ipo", 0.1, mask, policy_tokens, reference_tokens)
    policy, reference, lengths = policy_tokens.sum(-1), reference_tokens.sum(-1), mask.sum(-1)
    out = ipo_loss(*policy.chunk(2), *reference.chunk(2), *lengths.chunk(2), global_pairs=5, beta=0.1)
    assert abs(out.loss.item() - want) < TOL


@pytest.mark.parametrize("beta,gamma", [(0.1, 0.5), (2.0, 1.0)])
def test_simpo_matches_trl_cpo(beta, gamma):
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    mask, policy_tokens, _ = fixed_pairs(seed=2)
    sums, lengths = policy_tokens.sum(-1), mask.sum(-1)
    trainer = SimpleNamespace(
        alpha=0.0, accelerator=Accelerator(), loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=0.0
    )
    losses, chosen_rewards, _ = CPOTrainer.cpo_loss(trainer, *(sums / lengths).chunk(2))
    out = simpo_loss(*sums.chunk(2), *lengths.chunk(2), global_pairs=5, beta=beta, gamma=gamma)
    assert abs(out.loss.item() - losses.mean().item()) < TOL
    assert abs(out.metrics["rewards/chosen"].item() - chosen_rewards.mean().item()) < TOL


def test_orpo_odds_ratio_term_matches_trl():
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    mask, policy_tokens, _ = fixed_pairs(seed=3)
    sums, lengths = policy_tokens.sum(-1), mask.sum(-1)
    trainer = SimpleNamespace(beta=0.1, accelerator=Accelerator())
    losses, _, _, log_odds_ratio, log_odds_chosen = ORPOTrainer.odds_ratio_loss(trainer, *(sums / lengths).chunk(2))
    out = orpo_loss(*sums.chunk(2), *lengths.chunk(2), global_pairs=5, beta=0.1)
    # TRL: loss = NLL - mean(beta * logsig(log odds)); its NLL is averaged over the batch's tokens (the
    # paper and ditty average each completion's, then the pairs), so compare the rest.
    assert abs((out.loss - out.metrics["nll_loss"]).item() + losses.mean().item()) < TOL
    assert abs(out.metrics["log_odds_ratio"].item() - log_odds_ratio.item()) < TOL
    assert abs(out.metrics["log_odds_chosen"].item() - log_odds_chosen.item()) < TOL


def grpo_rollouts(seed=4, sequences=6, width=7):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(sequences, width, dtype=torch.long)
    for row in range(sequences):
        mask[row, : 2 + (row * 2) % (width - 1)] = 1
    new = -torch.rand(sequences, width, generator=generator, dtype=torch.float64) * 2
    old = new + (torch.rand(sequences, width, generator=generator, dtype=torch.float64) - 0.5) * 0.8
    reference = new + (torch.rand(sequences, width, generator=generator, dtype=torch.float64) - 0.5) * 0.4
    advantages = torch.randn(sequences, generator=generator, dtype=torch.float64)
    return mask, new, old, reference, advantages


def trl_grpo_loss(rollouts, *, importance="token", beta=0.0, loss="dapo", epsilon_high=0.2, weights=None):
    """(TRL's GRPOTrainer._compute_loss on `rollouts` (grpo_rollouts' tuple), its metrics): the
    trainer is a namespace holding what that method reads; `weights` enter as TRL's vLLM
    importance-sampling ratio."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    mask, new, old, reference, advantages = rollouts
    trainer = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=importance,
        beta=beta,
        loss_type=loss,
        epsilon_low=0.2,
        epsilon_high=epsilon_high,
        use_vllm=weights is not None,
        vllm_importance_sampling_correction=weights is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=new.shape[1],
        accelerator=Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
    )
    inputs = {
        "prompt_ids": torch.ones(len(mask), 2, dtype=torch.long),
        "prompt_mask": torch.ones(len(mask), 2, dtype=torch.long),
        "completion_ids": torch.ones_like(mask),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": reference,
        **({"importance_sampling_ratio": weights} if weights is not None else {}),
        "num_items_in_batch": mask.sum(),
    }
    value = GRPOTrainer._compute_loss(trainer, None, inputs).item()
    return value, {name: values[-1] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
@pytest.mark.parametrize("beta,clip_high", [(0.0, None), (0.04, 0.28)])
def test_grpo_matches_trl(loss, importance, beta, clip_high):
    rollouts = grpo_rollouts()
    mask, new, old, reference, advantages = rollouts
    max_new = 7
    epsilon_high = 0.2 if clip_high is None else clip_high
    want, trl_metrics = trl_grpo_loss(rollouts, importance=importance, beta=beta, loss=loss, epsilon_high=epsilon_high)
    out = grpo_loss(
        new,
        old,
        advantages,
        mask.bool(),
        global_sequences=6,
        global_tokens=int(mask.sum()),
        reference_logps=reference,
        beta=beta,
        clip_high=clip_high,
        importance=importance,
        loss=loss,
        max_new_tokens=max_new,
    )
    assert abs(out.loss.item() - want) < TOL
    names = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"] + (["kl"] if beta else [])
    for name in names:
        assert abs(out.metrics[name].item() - trl_metrics[name]) < TOL, name


def test_kto_matches_trl():
    from trl.trainer.kto_trainer import KTOTrainer

    from ditty.objectives.dpo_family import kto_kl, kto_kl_share, kto_loss

    examples, width = 6, 8
    generator = torch.Generator().manual_seed(5)
    mask = torch.zeros(examples, width, dtype=torch.long)
    mask[:, 3:] = 1
    policy = -torch.rand(examples, width - 1, generator=generator, dtype=torch.float64) * 2
    kl_policy = -torch.rand(examples, width - 1, generator=generator, dtype=torch.float64) * 2
    reference = policy.sum(-1) + torch.randn(examples, generator=generator, dtype=torch.float64)
    # A reference that likes the mismatched completions less: a positive KL estimate, not clamped away.
    kl_reference = kl_policy.sum(-1) - torch.rand(examples, generator=generator, dtype=torch.float64)
    labels = torch.tensor([True, False, True, True, False, False])

    def forward(input_ids, **kwargs):
        tokens = kl_policy if int(input_ids[0, 0]) == 2 else policy
        zeros = torch.zeros_like(tokens)
        return SimpleNamespace(log_probs=tokens, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=Accelerator(),
        calculate_KL=True,
        precompute_ref_logps=True,
        loss_type="kto",
        beta=0.1,
        desirable_weight=1.33,
        undesirable_weight=0.9,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(),
    )
    trainer._compute_kl_logps = lambda model, batch: KTOTrainer._compute_kl_logps(trainer, model, batch)
    inputs = {
        "input_ids": torch.ones_like(mask),
        "attention_mask": torch.ones_like(mask),
        "completion_mask": mask,
        "KL_input_ids": torch.full_like(mask, 2),
        "KL_attention_mask": torch.ones_like(mask),
        "KL_completion_mask": mask,
        "label": labels,
        "ref_logps": reference,
        "ref_KL_logps": kl_reference,
    }
    result = KTOTrainer._compute_loss(trainer, forward, inputs, return_outputs=False)
    want = (result[0] if isinstance(result, tuple) else result).item()
    trl_metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}

    kl = kto_kl(kto_kl_share(kl_policy.sum(-1), kl_reference, examples))
    out = kto_loss(
        policy.sum(-1),
        reference,
        labels,
        kl,
        global_examples=examples,
        global_desirable=3,
        global_undesirable=3,
        beta=0.1,
        desirable_weight=1.33,
        undesirable_weight=0.9,
    )
    assert kl.item() > 0
    assert abs(out.loss.item() - want) < TOL
    for name in ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert abs(out.metrics[name].item() - trl_metrics[name]) < TOL, name


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_grpo_with_the_sampler_correction_matches_trl(kind):
    """rl.sampler_correction's weights (ditty.objectives.sampling.correction: TRL's ratio, checked in
    tests/rl/test_sampler_correction.py) enter the loss as TRL's `importance_sampling_ratio` does."""
    from ditty.objectives.sampling.correction import correction_weights

    mask, new, old, reference, advantages = grpo_rollouts(seed=7)
    sampler = new + (torch.rand(new.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64) - 0.5)
    weights = correction_weights(new, sampler, mask.bool(), kind, 1.5)
    want, _ = trl_grpo_loss((mask, new, old, reference, advantages), beta=0.04, weights=weights)
    out = grpo_loss(
        new,
        old,
        advantages,
        mask.bool(),
        global_sequences=6,
        global_tokens=int(mask.sum()),
        reference_logps=reference,
        beta=0.04,
        loss="dapo",
        token_weights=weights,
    )
    assert abs(out.loss.item() - want) < TOL
