"""The MTP loss (ditty.models.mtp.loss) as the trainer runs it: the pipeline's forward, the loss, the
global-batch scaling and the backward. Depth 0 is the row's loss itself and weight 0 equals it bit
for bit; with the main loss weighted 0 and the trunk detached only the heads learn; each depth's
targets stay inside their packed sample, and a packed row scores as its samples alone; the held-out
acceptance is the share of drafts the main head repeats."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from ditty.config.mtp import MTPConfig
from ditty.config.sections import TrainConfig
from ditty.models.mtp.heads import MTP_MODULE, heads_of, run_depths
from ditty.models.mtp.loss import HeldOutTally, MTPLoss, with_mtp
from ditty.models.mtp.targets import depth_targets, sample_ids
from ditty.models.tasks import causal_lm_loss
from ditty.stages.fused_loss import head_projection, output_head
from ditty.stages.loss import LossOutput
from ditty.train.pipeline import StageChain, run_pipeline
from ditty.train.step import LossNormaliser
from tests.models.mtp_helpers import SAMPLES, mtp_config, packed_batch, padded_batch, tiny_model


def train_step(model, loss, batch) -> torch.Tensor:
    """One micro-batch as the trainer takes it: counts first, forward, loss, scaled backward."""
    from ditty.stages.processors import Context

    counter = getattr(loss, "count_units", None) or loss.count_tokens
    norm = LossNormaliser.for_step([batch], counter, 1)
    ctx = Context(model=model, training=True, step=0, micro_step=0, num_micro_steps=1)
    if norm.global_units:
        ctx["global_units"] = norm.global_units
    out = run_pipeline(StageChain(loss=loss), model, batch, ctx, nullcontext)
    scaled = norm.scale(out, batch["input_ids"].shape[0])
    scaled.backward()
    return scaled.detach()


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_depth_zero_is_the_rows_own_loss():
    loss = causal_lm_loss(TrainConfig())
    assert with_mtp(loss, MTPConfig(depth=0), TrainConfig()) is loss


@pytest.mark.parametrize("chunks", [0, 4])
def test_weight_zero_gives_the_plain_loss_and_gradients_bit_for_bit(chunks):
    train = TrainConfig(loss_chunks=chunks)
    batch = padded_batch()
    model = tiny_model("llama", depth=2)
    plain = train_step(model, causal_lm_loss(train), batch)
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    with_heads = train_step(model, with_mtp(causal_lm_loss(train), mtp_config(weight=0.0), train), batch)
    got = gradients(model)
    assert torch.equal(plain, with_heads)
    trunk = [name for name in expected if MTP_MODULE not in name]
    assert trunk and all(torch.equal(got[name], expected[name]) for name in trunk)
    assert all(not got[name].any() for name in got if MTP_MODULE in name)  # weight 0: the heads learn nothing


class Weighted:
    """The row's loss times `weight` (a main loss weighted 0, for the test)."""

    def __init__(self, main, weight: float) -> None:
        self.main, self.weight = main, weight
        self.uses_head_input = getattr(main, "uses_head_input", False)
        self.name = "weighted"

    def count_tokens(self, batch):
        return self.main.count_tokens(batch)

    def compute(self, output, ctx):
        out = self.main.compute(output, ctx)
        return LossOutput(out.loss * self.weight, num_tokens=out.num_tokens)


@pytest.mark.parametrize("trunk_gradient", [False, True])
def test_with_the_main_loss_weighted_zero_only_the_heads_learn_unless_the_trunk_takes_their_gradient(
    trunk_gradient,
):
    train = TrainConfig(loss_chunks=4)
    model = tiny_model("llama", depth=2)
    config = mtp_config(trunk_gradient=trunk_gradient)
    train_step(model, MTPLoss(Weighted(causal_lm_loss(train), 0.0), config, chunks=4), padded_batch())
    heads = {n: p.grad for n, p in model.named_parameters() if MTP_MODULE in n}
    trunk = {n: p.grad for n, p in model.named_parameters() if MTP_MODULE not in n}
    assert heads and all(g is not None and g.abs().sum() > 0 for g in heads.values())
    moved = {n for n, g in trunk.items() if g is not None and g.abs().sum() > 0}
    if trunk_gradient:  # DeepSeek-V3's way: the heads' loss reaches the trunk, embedding and output head
        assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= moved
        assert any(".layers.1." in n for n in moved)
    else:
        assert moved == set()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_no_target_crosses_a_packed_sample_boundary(depth):
    batch = packed_batch()
    labels, positions = batch["labels"], batch["position_ids"]
    targets = depth_targets(labels, positions, depth)
    samples = sample_ids(positions, labels.shape, labels.device)
    shift = depth + 1
    for row, column in (targets != -100).nonzero().tolist():
        assert samples[row, column] == samples[row, column + shift]
        assert targets[row, column] == labels[row, column + shift]
    # and every label k + 1 ahead inside its own sample is a target
    expected = sum(max(0, len(s) - max(2, shift)) for s in SAMPLES)  # the first 2 tokens of a sample are its prompt
    assert int((targets != -100).sum()) == expected


def held_out(model, loss, batch) -> torch.Tensor:
    """The loss's held-out tally (loss sum, count, accepted, scored per depth) of one batch."""
    from ditty.stages.processors import Context

    loss.held_out.reset()
    ctx = Context(model=model, training=False, step=0, micro_step=0, num_micro_steps=1)
    with torch.no_grad():
        run_pipeline(StageChain(loss=loss), model, batch, ctx, nullcontext)
    return loss.held_out.sums.clone()


@pytest.mark.parametrize("chunks", [0, 4])
def test_a_packed_row_scores_as_its_samples_alone(chunks):
    train = TrainConfig(loss_chunks=chunks)
    model = tiny_model("llama", depth=2).eval()
    loss = with_mtp(causal_lm_loss(train), mtp_config(depth=2), train)
    packed = held_out(model, loss, packed_batch())
    alone = sum(held_out(model, loss, packed_batch([sample])) for sample in SAMPLES)
    assert torch.equal(packed[1], alone[1]) and torch.equal(packed[3], alone[3])  # the same targets
    assert torch.allclose(packed[0], alone[0], rtol=1e-5)  # the same cross-entropy
    assert torch.equal(packed[2], alone[2])  # the same drafts accepted


def test_acceptance_is_the_share_of_drafts_the_main_head_would_emit():
    model = tiny_model("llama", depth=2).eval()
    batch = padded_batch()
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        trunk = heads_of(model).capture.take()
        projection = head_projection(output_head(model))
        targets = [depth_targets(batch["labels"], batch["position_ids"], k) for k in (1, 2)]
        score = MTPLoss(causal_lm_loss(), mtp_config(), chunks=1)._score
        # drafts that are the main head's own states k positions on: every draft is accepted
        ahead = [torch.cat([trunk.hidden[:, k:], trunk.hidden[:, :k]], dim=1) for k in (1, 2)]
        tally = HeldOutTally(2)
        tally.add(trunk.hidden, ahead, targets, projection, score)
        accepted = {"val_mtp_acceptance/1": 1.0, "val_mtp_acceptance/2": 1.0}
        assert tally.result(lambda t: t) == pytest.approx(
            {**tally_losses(ahead, targets, projection, score), **accepted}
        )
        # the heads' own drafts: the share counted by hand
        hiddens = run_depths(heads_of(model), trunk)
        tally.add(trunk.hidden, hiddens, targets, projection, score)
        result = tally.result(lambda t: t)
        main = (trunk.hidden @ projection.weight.T).argmax(-1)
        for k, (hidden, target) in enumerate(zip(hiddens, targets), start=1):
            scored = target != -100
            drafts = (hidden @ projection.weight.T).argmax(-1)
            agree = drafts[:, :-k] == main[:, k:]
            expected = float(agree[scored[:, :-k]].float().mean())
            assert result[f"val_mtp_acceptance/{k}"] == pytest.approx(expected)
            assert 0.0 <= expected < 1.0


def tally_losses(hiddens, targets, projection, score) -> dict[str, float]:
    out = {}
    for k, (hidden, target) in enumerate(zip(hiddens, targets), start=1):
        total, count = score(hidden, projection, target)
        out[f"val_mtp_loss/{k}"] = float(total / count)
    return out
