"""The loss is the mean over supervised tokens of the whole global batch (docs/ARCHITECTURE.md, the flow):
any micro x accumulation cut of the same 8 samples gives the same loss and gradient norm."""

from __future__ import annotations

import pytest
import torch

from ditty.data.collate import pad_samples
from ditty.stages.loss import LossOutput
from ditty.train import Trainer
from ditty.train.step import LossNormaliser
from tests.train.helpers import small_config, with_train, write_prompt_completion


def _global_batch(pad_id: int) -> list[tuple[list[int], list[int]]]:
    """8 samples of lengths 5..33 with different numbers of supervised tokens (1 to 28)."""
    g = torch.Generator().manual_seed(0)
    samples = []
    for length, prompt in [(5, 2), (33, 4), (9, 8), (17, 3), (12, 11), (28, 6), (7, 1), (21, 15)]:
        ids = torch.randint(3, 250, (length,), generator=g).tolist()
        labels = [-100] * prompt + ids[prompt:]
        samples.append((ids, labels))
    return samples


def _cut(samples, micro: int, pad_id: int) -> list[dict]:
    return [pad_samples(samples[i : i + micro], pad_id) for i in range(0, len(samples), micro)]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("accum")
    data = write_prompt_completion(tmp / "pc.jsonl")
    config = with_train(small_config(tmp, tiny_llama_dir, data), max_grad_norm=None)
    return Trainer(config)


def _step(trainer, micro_batches, weights):
    trainer.model.load_state_dict(weights)
    out = trainer.train_step(micro_batches)
    return out.loss, out.grad_norm


def test_any_cut_of_the_global_batch_gives_the_same_loss_and_grad_norm(trainer):
    pad = trainer.tokenizer.pad_token_id
    samples = _global_batch(pad)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    results = {micro: _step(trainer, _cut(samples, micro, pad), weights) for micro in (8, 4, 2, 1)}
    loss_ref, norm_ref = results[8]
    for micro, (loss, norm) in results.items():
        assert loss == pytest.approx(loss_ref, abs=1e-5, rel=1e-5), micro
        assert norm == pytest.approx(norm_ref, abs=1e-5, rel=1e-5), micro
    trainer.model.load_state_dict(weights)


def test_naive_mean_of_micro_batch_means_differs(trainer):
    """Negative control: averaging per-micro-batch means weights short samples too much."""
    pad = trainer.tokenizer.pad_token_id
    samples = _global_batch(pad)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(weights)
    ctx = trainer.make_context(index=0, count=1, training=False)
    with torch.no_grad():
        outs = [trainer.forward(b, ctx) for b in _cut(samples, 1, pad)]
    naive = torch.stack([o.loss / o.num_tokens for o in outs]).mean().item()
    token_mean = (sum(o.loss for o in outs) / sum(o.num_tokens for o in outs)).item()
    loss_ref, _ = _step(trainer, _cut(samples, 8, pad), weights)
    assert token_mean == pytest.approx(loss_ref, abs=1e-5)
    assert abs(naive - loss_ref) > 1e-3


def test_normaliser_weights_mean_losses_by_samples():
    """Losses without num_tokens (means) are weighted by their micro-batch's share of the rows."""
    batches = [{"input_ids": torch.zeros(3, 4, dtype=torch.long)}, {"input_ids": torch.zeros(1, 4, dtype=torch.long)}]
    norm = LossNormaliser.for_step(batches, lambda b: torch.tensor(5), world_size=1)
    assert norm.global_tokens.item() == 10
    assert norm.scale(LossOutput(torch.tensor(2.0)), 3).item() == pytest.approx(1.5)
    assert norm.scale(LossOutput(torch.tensor(20.0), num_tokens=10), 3).item() == pytest.approx(2.0)


def test_a_share_of_the_global_loss_is_only_scaled_by_the_world():
    """A loss over global counts returns its share already: the normaliser undoes DDP's mean, nothing more."""
    batches = [{"input_ids": torch.zeros(2, 4, dtype=torch.long)}]
    norm = LossNormaliser.for_step(batches, lambda b: {"pairs": torch.tensor(2), "tokens": torch.tensor(7)}, 3)
    assert [float(v) for v in norm.global_units.values()] == [2.0, 7.0] and norm.global_tokens.item() == 2
    assert norm.scale(LossOutput(torch.tensor(0.25), share=True), 2).item() == pytest.approx(0.75)
