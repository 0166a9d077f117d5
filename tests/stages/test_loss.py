"""Loss calculators and processors: CausalLMLoss against transformers' own loss, LossOutput's sum /
mean semantics, how predictions and targets are found, the built-ins and CompositeLoss."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from ditty.loss import (
    IGNORE_INDEX,
    CausalLMLoss,
    CompositeLoss,
    CrossEntropyLoss,
    L1Loss,
    LossCalculator,
    LossOutput,
    MSELoss,
)
from ditty.processors import Context, PostProcessor, PreProcessor

VOCAB = 259


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def _forward(model, ids, labels=None):
    with torch.no_grad():
        return model(input_ids=ids, labels=labels, use_cache=False)


def test_causal_lm_loss_equals_transformers_loss(tiny_model):
    ids = torch.randint(3, VOCAB, (3, 11))
    reference = _forward(tiny_model, ids, labels=ids)
    out = CausalLMLoss().compute(reference, Context(labels=ids))
    assert out.num_tokens == 3 * 10  # every position but the first of each row is predicted
    assert out.mean_loss().item() == pytest.approx(reference.loss.item(), abs=1e-6)


def test_causal_lm_loss_ignores_minus_100(tiny_model):
    ids = torch.randint(3, VOCAB, (2, 9))
    labels = ids.clone()
    labels[0, :5] = IGNORE_INDEX  # a prompt
    labels[1, 7:] = IGNORE_INDEX  # padding
    reference = _forward(tiny_model, ids, labels=labels)
    out = CausalLMLoss().compute(reference, Context(labels=labels))
    assert out.num_tokens == (labels[:, 1:] != IGNORE_INDEX).sum()
    assert out.mean_loss().item() == pytest.approx(reference.loss.item(), abs=1e-6)
    # The ignored positions truly take no part: changing their logits changes nothing.
    noisy = reference.logits.clone()
    noisy[0, :3] += 100.0
    assert CausalLMLoss().compute(
        CausalLMOutputWithPast(logits=noisy), Context(labels=labels)
    ).loss.item() == pytest.approx(out.loss.item())


def test_causal_lm_loss_counts_tokens_like_it_sums_them():
    labels = torch.tensor([[5, 6, IGNORE_INDEX, 7], [IGNORE_INDEX, 8, 9, IGNORE_INDEX]])
    out = CausalLMLoss().compute({"logits": torch.randn(2, 4, 10)}, Context(labels=labels))
    assert (
        int(CausalLMLoss().count_tokens({"labels": labels})) == int(out.num_tokens) == 4
    )  # position 0 is never predicted


def test_causal_lm_loss_computes_in_fp32():
    logits = torch.randn(2, 6, 50)
    labels = torch.randint(0, 50, (2, 6))
    full = CausalLMLoss().compute({"logits": logits}, {"labels": labels})
    half = CausalLMLoss().compute({"logits": logits.bfloat16()}, {"labels": labels})
    assert half.loss.dtype == torch.float32
    assert half.loss.item() == pytest.approx(full.loss.item(), rel=1e-2)


def test_summed_losses_make_any_split_of_a_batch_agree():
    """LossOutput semantics: sums over micro-batches / their total count = the whole batch's mean,
    whatever the split, while the mean of micro-batch means differs when counts differ."""
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 20)
    labels = torch.randint(0, 20, (4, 7))
    labels[0, 2:] = IGNORE_INDEX
    labels[3, 5:] = IGNORE_INDEX
    loss = CausalLMLoss()
    whole = loss.compute({"logits": logits}, {"labels": labels}).mean_loss()
    parts = [loss.compute({"logits": logits[i : i + 2]}, {"labels": labels[i : i + 2]}) for i in (0, 2)]
    summed = sum(p.loss for p in parts) / sum(p.num_tokens for p in parts)
    assert summed.item() == pytest.approx(whole.item(), abs=1e-6)
    assert torch.stack([p.mean_loss() for p in parts]).mean().item() != pytest.approx(whole.item(), abs=1e-3)


def test_loss_output_mean():
    assert LossOutput(loss=torch.tensor(6.0), num_tokens=3).mean_loss().item() == 2.0
    assert LossOutput(loss=torch.tensor(0.0), num_tokens=torch.tensor(0)).mean_loss().item() == 0.0
    mean = LossOutput(loss=torch.tensor(1.5))
    assert mean.mean_loss().item() == 1.5 and mean.metrics == {} and mean.num_tokens is None


class _Identity(LossCalculator):
    def compute(self, model_output, ctx):
        return LossOutput(loss=self.get_prediction(model_output))


@pytest.mark.parametrize(
    ("output", "index", "expected"),
    [
        (torch.tensor(1.0), 0, 1.0),
        ((torch.tensor(1.0), torch.tensor(2.0)), 1, 2.0),
        ([torch.tensor(1.0), torch.tensor(2.0)], -1, 2.0),
        ({"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, "b", 2.0),
        (CausalLMOutputWithPast(logits=torch.tensor(3.0)), "logits", 3.0),
        (CausalLMOutputWithPast(logits=torch.tensor(3.0)), 0, 3.0),  # ModelOutput: its non-None fields in order
        (CausalLMOutputWithPast(loss=torch.tensor(4.0), logits=torch.tensor(3.0)), 1, 3.0),
    ],
)
def test_get_prediction(output, index, expected):
    assert _Identity(output_index=index).get_prediction(output).item() == expected


@pytest.mark.parametrize(
    ("output", "index", "error"),
    [
        (torch.tensor(1.0), 1, IndexError),
        ((torch.tensor(1.0),), 2, IndexError),
        ({"a": torch.tensor(1.0)}, 0, TypeError),
        (CausalLMOutputWithPast(logits=torch.tensor(3.0)), "hidden", KeyError),
    ],
)
def test_get_prediction_explains_a_missing_output(output, index, error):
    with pytest.raises(error, match="_Identity"):
        _Identity(output_index=index).get_prediction(output)


def test_targets_and_masks_come_from_the_context_then_the_batch():
    loss = _Identity()
    assert loss.get_target(Context(target=1, batch={"target": 2})) == 1
    assert loss.get_target(Context(batch={"target": 2}, original_batch={"target": 3})) == 2
    assert loss.get_target(Context(original_batch={"target": 3})) == 3
    assert loss.get_mask(Context()) is None
    with pytest.raises(KeyError, match="no 'target'"):
        loss.get_target(Context())


def test_mse_and_l1_with_a_mask_over_leading_dimensions():
    prediction = torch.tensor([[[1.0, 1.0], [3.0, 3.0]]])  # [B=1, T=2, D=2]
    target = torch.zeros(1, 2, 2)
    assert MSELoss().compute(prediction, Context(target=target)).loss.item() == pytest.approx(5.0)
    mask = torch.tensor([[True, False]])  # only the first position counts
    assert MSELoss().compute(prediction, Context(target=target, mask=mask)).loss.item() == pytest.approx(1.0)
    assert L1Loss().compute(prediction, Context(target=target, mask=mask)).loss.item() == pytest.approx(1.0)
    assert L1Loss().compute(prediction, Context(target=target)).loss.item() == pytest.approx(2.0)


def test_cross_entropy_is_a_mean_over_counted_targets():
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[1, 2, IGNORE_INDEX], [0, 4, 3]])
    mask = torch.tensor([[True, True, True], [True, False, True]])
    out = CrossEntropyLoss().compute(logits, Context(target=target, mask=mask))
    keep = torch.tensor([[True, True, False], [True, False, True]])
    expected = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    assert out.num_tokens is None
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_composite_loss_weights_parts_and_reports_each():
    prediction = torch.tensor([1.0, 3.0])
    ctx = Context(target=torch.zeros(2))
    composite = CompositeLoss([(MSELoss(), 1.0), (L1Loss(), 0.5), (MSELoss(), 2.0)])
    out = composite.compute(prediction, ctx)
    assert out.loss.item() == pytest.approx(5.0 + 0.5 * 2.0 + 2.0 * 5.0)
    assert out.metrics == {"mse_0": 5.0, "l1": 2.0, "mse_2": 5.0}
    assert out.num_tokens is None


def test_composite_loss_turns_token_sums_into_means():
    logits = torch.randn(1, 4, 6, requires_grad=True)
    labels = torch.tensor([[1, 2, 3, 4]])
    token_loss = CausalLMLoss().compute({"logits": logits}, {"labels": labels})
    out = CompositeLoss([(CausalLMLoss(), 1.0)]).compute({"logits": logits}, {"labels": labels})
    assert out.loss.item() == pytest.approx(token_loss.loss.item() / 3)
    out.loss.backward()
    assert logits.grad is not None


def test_context_and_processors():
    ctx = Context(step=3)
    assert ctx.forward_kwargs == {} and ctx.original_batch is None and ctx["step"] == 3
    ctx.forward_kwargs["t"] = 1
    assert ctx["forward_kwargs"] == {"t": 1}

    class AddOne(PreProcessor):
        def __init__(self):
            super().__init__(contract="batch:1:f32 -> batch:1:f32")

        def process(self, batch, ctx):
            return batch + 1, ctx

    class Halve(PostProcessor):
        def process(self, model_output, ctx):
            ctx["target"] = model_output / 2
            return model_output, ctx

    batch, ctx = AddOne().process(torch.ones(2), ctx)
    output, ctx = Halve().process(batch, ctx)
    assert AddOne().contract == "batch:1:f32 -> batch:1:f32" and Halve().contract is None
    assert torch.equal(ctx["target"], torch.ones(2))
    with pytest.raises(TypeError):
        PreProcessor()  # abstract: process must be written
