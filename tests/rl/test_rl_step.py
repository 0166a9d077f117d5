"""One GRPO step on fixed rollouts (rewards, the sampling and reference log-probabilities given)
through the trainer's own step (`Trainer.train_step`: the rollout stream's micro-batches, the
GRPO loss stage, the global-batch normaliser, backward, SGD) equals each variant written here
from its paper in plain torch: the loss to 1e-6 and the update to 1e-6.

The model runs in float64 so the comparison measures the formulas, not rounding.
"""

from __future__ import annotations

import pytest
import torch

from ditty.objectives.sampling.batch import RolloutBatch
from ditty.train import Trainer
from tests.rl.helpers import grpo_config

GROUP = 4
EPS_STD = 1e-4  # TRL's: added to the group's std


def paper_loss(logps, old, ref, advantages, mask, *, loss, importance, low, high, beta, max_new_tokens):
    """GRPO (Shao et al. 2024), DAPO (Yu et al. 2025), Dr. GRPO (Liu et al. 2025), GSPO (Zheng et
    al. 2025) and the k3 KL (Schulman 2020), term by term."""
    terms, lengths = [], mask.sum(-1)
    for i in range(logps.shape[0]):
        m = mask[i]
        if importance == "token":
            ratio = torch.exp(logps[i] - old[i])
        else:  # GSPO: one ratio per sequence, the geometric mean of its token ratios
            ratio = torch.exp(((logps[i] - old[i]) * m).sum() / m.sum()).expand_as(logps[i])
        a = advantages[i]
        surrogate = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
        if beta:
            d = ref[i] - logps[i]
            surrogate = surrogate + beta * (torch.exp(d) - d - 1)
        terms.append(surrogate * m)
    terms = torch.stack(terms)
    if loss == "grpo":  # mean over sequences of each sequence's token mean
        return (terms.sum(-1) / lengths).mean()
    if loss == "dapo":  # every token of the batch weighs the same
        return terms.sum() / mask.sum()
    return terms.sum() / (logps.shape[0] * max_new_tokens)  # Dr. GRPO: a constant


def fixed_rollouts(tokenizer, seed=0):
    """8 completions of 2 prompts (4 per group), of different lengths; two are truncated."""
    g = torch.Generator().manual_seed(seed)
    prompts = [tokenizer("12+47=")["input_ids"], tokenizer("3+5=")["input_ids"]]
    done = RolloutBatch([], [], [], [])
    for p, prompt in enumerate(prompts):
        for k in range(GROUP):
            length = 1 + (p + 2 * k) % 4
            ids = torch.randint(48, 58, (length,), generator=g).tolist()
            truncated = k == 3
            done.prompt_ids.append(prompt)
            done.completion_ids.append(ids if truncated else ids + [tokenizer.eos_token_id])
            done.texts.append(tokenizer.decode(ids))
            done.truncated.append(truncated)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 2.0, 1.0, 1.0], dtype=torch.float64)
    return done, rewards


def assemble(trainer, rollouts, rewards, drop_idle=True):
    """The run's own RL parts on given rollouts: advantages over the global batch, then micro-batches."""
    rollouts.rewards = rewards
    trainer.stream.estimate(rollouts)
    return trainer.stream.assembler(rollouts, drop_idle=drop_idle)


def plain_logps(model, batch, temperature=1.0):
    """log p(label t | tokens before t) from the full logits (divided by the sampling temperature),
    0 where no label; the scored mask."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logits = logits / temperature
    labels = batch["labels"]
    logps = torch.zeros(labels.shape, dtype=logits.dtype)
    scored = torch.zeros(labels.shape, dtype=torch.bool)
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] != -100:
                logps[b, t] = log_probs[b, t - 1, labels[b, t]]
                scored[b, t] = True
    return logps, scored


VARIANTS = {
    "grpo": dict(loss="grpo", importance="token", clip_low=0.2, clip_high=None, beta=0.0),
    "dapo_clip_higher": dict(loss="dapo", importance="token", clip_low=0.2, clip_high=0.28, beta=0.0),
    "dr_grpo": dict(loss="dr_grpo", importance="token", clip_low=0.2, clip_high=None, beta=0.0, scale_rewards="none"),
    "gspo": dict(loss="grpo", importance="sequence", clip_low=3e-4, clip_high=4e-4, beta=0.0),
    "grpo_k3_kl": dict(loss="grpo", importance="token", clip_low=0.2, clip_high=None, beta=0.1),
    "grpo_temperature": dict(loss="grpo", importance="token", clip_low=0.2, clip_high=None, temperature=0.7),
    "dapo_mask_truncated": dict(loss="dapo", importance="token", clip_low=0.2, clip_high=0.28, mask_truncated=True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_step_on_fixed_rollouts_equals_the_papers_formula(tmp_path, name):
    rl = dict(VARIANTS[name])
    torch.manual_seed(0)
    config = grpo_config(
        tmp_path, train=dict(steps=1), optimizer=dict(kind="sgd", lr=1.0, weight_decay=0.0), **rl, max_new_tokens=4
    )
    trainer = Trainer(config)
    trainer.model.double()
    model = trainer.engine.unwrap(trainer.model)
    done, rewards = fixed_rollouts(trainer.tokenizer)
    batches = assemble(trainer, done, rewards, drop_idle=False)  # every row, as the formula sees them
    assert len(batches) == 2  # two micro-batches of 4: the normaliser sums over both

    # The sampling and the reference policy: the live one, nudged, so ratios and the KL are not trivial.
    noise = torch.Generator().manual_seed(1)
    olds, refs = [], []
    for batch in batches:
        logps, scored = plain_logps(model, batch, rl.get("temperature", 1.0))
        spread = 0.3 if rl["importance"] == "token" else 1e-3
        batch["old_logps"] = (logps + spread * torch.randn(logps.shape, generator=noise, dtype=torch.float64)).detach()
        batch["ref_logps"] = (logps + 0.3 * torch.randn(logps.shape, generator=noise, dtype=torch.float64)).detach()
        olds.append(batch["old_logps"])
        refs.append(batch["ref_logps"])

    # The formula on the whole batch at once (no micro-batches), its gradient by autograd.
    grouped = rewards.reshape(-1, GROUP)
    centred = grouped - grouped.mean(1, keepdim=True)
    scale = rl.get("scale_rewards", "group")
    advantages = (centred / (grouped.std(1, keepdim=True) + EPS_STD) if scale == "group" else centred).reshape(-1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected = 0.0
    values = []
    for index, batch in enumerate(batches):
        logps, scored = plain_logps(model, batch, rl.get("temperature", 1.0))
        mask = scored.double()
        if rl.get("mask_truncated"):
            mask = mask * (~batch["truncated"])[:, None].double()
        values.append((logps, olds[index], refs[index], advantages[4 * index : 4 * index + 4], mask))
    width = max(v[0].shape[1] for v in values)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
    whole = [torch.cat([pad(v[k]) if v[k].dim() == 2 else v[k] for v in values]) for k in range(5)]
    formula = paper_loss(
        whole[0],
        whole[1],
        whole[2],
        whole[3],
        whole[4],
        loss=rl["loss"],
        importance=rl["importance"],
        low=rl["clip_low"],
        high=rl["clip_high"] if rl.get("clip_high") is not None else rl["clip_low"],
        beta=rl.get("beta", 0.0),
        max_new_tokens=4,
    )
    formula.backward()
    expected = float(formula.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad()

    out = trainer.train_step(batches)  # the trainer's step: stages, normaliser, backward, SGD with lr 1
    assert out.loss == pytest.approx(expected, abs=1e-6, rel=0), (out.loss, expected)
    worst = max(float((before[n] - p.detach() - grads[n]).abs().max()) for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert any(float(g.abs().max()) > 1e-3 for g in grads.values())  # the step moved the model
    if rl.get("beta"):
        assert out.metrics["kl"] > 0
    if name == "dapo_clip_higher":  # the fixture clips on both sides
        assert 0 < out.metrics["clip_ratio/region_mean"] < 1
    trainer.run_lock.release()


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
def test_rows_of_advantage_zero_are_skipped_without_changing_the_step(tmp_path, loss):
    """With beta 0 the rollout stream leaves out the rows whose advantage is 0 (here the whole first
    group, which scored alike, and two rows of the second that equal its mean): the forward and
    backward see fewer rows, and the loss and the update equal the step on every row to 1e-6."""
    steps = []
    for drop_idle in (False, True):
        config = grpo_config(
            tmp_path / str(drop_idle),
            train=dict(steps=1),
            optimizer=dict(kind="sgd", lr=1.0, weight_decay=0.0),
            loss=loss,
            clip_high=0.28,
        )
        trainer = Trainer(config)
        trainer.model.double()
        model = trainer.engine.unwrap(trainer.model)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        done, _ = fixed_rollouts(trainer.tokenizer)
        rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 1.0, 1.0], dtype=torch.float64)
        batches = assemble(trainer, done, rewards, drop_idle=drop_idle)
        rows = [len(b["advantages"]) for b in batches]
        out = trainer.train_step(batches)
        update = {n: before[n] - p.detach() for n, p in model.named_parameters()}
        steps.append((rows, out, update, before))
        trainer.run_lock.release()
    (full_rows, full, full_update, start), (kept_rows, kept, kept_update, kept_start) = steps
    assert all(torch.equal(start[n], kept_start[n]) for n in start)  # the same model before the step
    assert full_rows == [4, 4] and kept_rows == [1, 2]  # a micro-batch of idle rows keeps one row
    assert kept.loss == pytest.approx(full.loss, abs=1e-6, rel=0)
    assert kept.supervised_tokens == full.supervised_tokens  # the same denominator
    assert max(float(full_update[n].abs().max()) for n in full_update) > 1e-3  # the step moved the model
    worst = max(float((full_update[n] - kept_update[n]).abs().max()) for n in full_update)
    assert worst < 1e-6, worst
