"""Every model type of ditty.models.mtp.support takes MTP heads: built of its own decoder block and
initialised by its own rule, they attend as the trunk does, so a packed row (or, for the types ditty
does not pack, a padded batch) drafts exactly what each sample drafts alone, and they train."""

from __future__ import annotations

import pytest
import torch

from ditty.config.sections import TrainConfig
from ditty.models.inputs import model_inputs
from ditty.models.mtp.heads import heads_of, run_depths
from ditty.models.mtp.loss import with_mtp
from ditty.models.mtp.support import MTP_MODEL_TYPES
from ditty.models.packing import PACKED_MASK_MODEL_TYPES
from ditty.models.tasks import causal_lm_loss
from tests.models.mtp_helpers import FAMILIES, SAMPLES, mtp_config, packed_batch, padded_batch, tiny_model
from tests.models.test_mtp_loss import train_step


def test_every_supported_type_is_covered_here():
    assert set(FAMILIES) == set(MTP_MODEL_TYPES)


@pytest.mark.parametrize("model_type", sorted(MTP_MODEL_TYPES))
def test_heads_draft_each_sample_as_if_it_were_alone(model_type):
    model = tiny_model(model_type, depth=2).eval()
    heads = heads_of(model)
    assert type(heads.layers[0].mtp_block) is type(model.get_decoder().layers[-1])
    assert all(torch.isfinite(p).all() for p in heads.parameters())
    packed = model_type in PACKED_MASK_MODEL_TYPES
    batch = packed_batch() if packed else padded_batch()
    with torch.no_grad():
        model(**model_inputs(model, batch))
        together = run_depths(heads, heads.capture.take())
        start = 0
        for row, sample in enumerate(SAMPLES):
            model(input_ids=torch.tensor([sample]), use_cache=False)
            alone = run_depths(heads, heads.capture.take())
            for depth in range(2):
                scored = len(sample) - (depth + 1)  # positions whose token k + 1 ahead is in the sample
                got = together[depth][0, start : start + scored] if packed else together[depth][row, :scored]
                torch.testing.assert_close(got, alone[depth][0, :scored], rtol=1e-5, atol=2e-6)
            start += len(sample)


@pytest.mark.parametrize("model_type", sorted(MTP_MODEL_TYPES))
def test_heads_train(model_type):
    train = TrainConfig(loss_chunks=4)
    model = tiny_model(model_type, depth=2)
    loss = with_mtp(causal_lm_loss(train), mtp_config(), train)
    before = {k: v.clone() for k, v in heads_of(model).state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    values = []
    for _ in range(3):
        optimizer.zero_grad()
        values.append(float(train_step(model, loss, padded_batch())))
        optimizer.step()
    assert values[-1] < values[0]
    after = heads_of(model).state_dict()
    assert any(not torch.equal(after[k], v) for k, v in before.items())
