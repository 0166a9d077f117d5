"""Packed samples do not see each other: a packed row gives, per sample, the logits and loss of that
sample run alone (fp32, within 1e-5); negative controls show the leak when isolation is off.

Packed batches carry no mask, only position ids and cumulative sample lengths; the model's inputs
come from ditty.models.packing.packed_inputs, as in training (ditty.models.inputs.model_inputs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from ditty.data.batching import BatchStream
from ditty.data.collate import pack_rows
from ditty.models.packing import BLOCKED, dense_block_mask, packed_inputs

PAD = 0
LENGTHS = [7, 12, 5, 9]  # first row: the first three samples; second row: the last one, then padding


@pytest.fixture(params=["sdpa", "eager"])
def model(request, tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, attn_implementation=request.param, dtype=torch.float32
    ).eval()


def _forward(model, batch):
    """The model's logits for a batch, packed or padded, with the inputs training gives it."""
    if "cu_seq_lens_q" in batch:
        kwargs = packed_inputs(model, batch)
    else:
        kwargs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    return model(**kwargs, use_cache=False).logits


@pytest.fixture(scope="module")
def samples():
    generator = torch.Generator().manual_seed(0)
    out = []
    for length in LENGTHS:
        ids = torch.randint(3, 259, (length,), generator=generator).tolist()
        labels = [-100] + ids[1:]
        labels[1] = -100  # a masked position inside a sample, as in prompt/completion data
        out.append((ids, labels))
    return out


def _sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Causal-LM loss of one sample: logits at t predict labels at t + 1."""
    return F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100)


def _per_sample(model, batch, samples):
    """(logits, loss) of each sample, cut out of the packed forward pass."""
    with torch.no_grad():
        logits = _forward(model, batch)
    rows = [samples[:3], samples[3:]]
    out = []
    for row_index, row in enumerate(rows):
        start = 0
        for ids, _ in row:
            end = start + len(ids)
            sample_logits = logits[row_index, start:end]
            out.append((sample_logits, _sample_loss(sample_logits, batch["labels"][row_index, start:end])))
            start = end
    return out


def _one_by_one(model, samples):
    out = []
    with torch.no_grad():
        for ids, labels in samples:
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            out.append((logits, _sample_loss(logits, torch.tensor(labels))))
    return out


def _packed(samples):
    return pack_rows([samples[:3], samples[3:]], pad_token_id=PAD)


def test_packed_samples_match_samples_run_one_by_one(model, samples):
    batch = _packed(samples)
    for (packed_logits, packed_loss), (alone_logits, alone_loss) in zip(
        _per_sample(model, batch, samples), _one_by_one(model, samples), strict=True
    ):
        assert (packed_logits - alone_logits).abs().max() < 1e-5
        assert abs(packed_loss.item() - alone_loss.item()) < 1e-5
    # Packing must not hide or add supervised tokens: each sample's first token is never a target.
    expected_targets = sum(sum(label != -100 for label in labels[1:]) for _, labels in samples)
    assert int((batch["labels"] != -100).sum()) == expected_targets


def test_packed_row_layout(samples):
    batch = _packed(samples)
    assert "attention_mask" not in batch  # nothing of T x T size, and no 2D mask either
    assert batch["position_ids"][0].tolist() == list(range(7)) + list(range(12)) + list(range(5))
    # the second row: its sample, then the padding tail as a segment of its own
    assert batch["position_ids"][1].tolist() == list(range(9)) + list(range(15))
    assert batch["cu_seq_lens_q"].tolist() == [0, 7, 19, 24, 33, 48]  # over the flattened rows
    assert batch["cu_seq_lens_q"].dtype == torch.int32 and batch["cu_seq_lens_k"] is batch["cu_seq_lens_q"]
    assert batch["max_length_q"] == batch["max_length_k"] == 15


def test_the_dense_mask_built_from_the_lengths(samples):
    """The fallback for models that need a mask (dense_block_mask): same layout as the samples."""
    batch = _packed(samples)
    mask = dense_block_mask(batch["cu_seq_lens_q"], 2, 24)
    assert mask.shape == (2, 1, 24, 24) and mask.dtype == torch.float32
    allowed = mask[0, 0] == 0
    assert allowed[7, 7] and allowed[8, 7] and not allowed[7, 6]  # a new sample starts at 7
    assert not allowed[10, 3] and not allowed[20, 10]  # no attention across samples
    padding = mask[1, 0, 9:]
    assert (padding[:, :9] == BLOCKED).all()  # padding sees no real token ...
    assert (padding[:, 9:] == 0).equal(torch.ones(15, 15, dtype=torch.bool).tril())  # ... only its own tail
    assert (mask[1, 0, :9, 9:] == BLOCKED).all()  # ... and no real token sees padding


@pytest.mark.parametrize("leaky_mask", ["all_ones_2d", "plain_causal_4d"])
def test_negative_control_without_isolation_the_samples_leak(model, samples, leaky_mask):
    batch = _packed(samples)
    width = batch["input_ids"].shape[1]
    leaky = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    if leaky_mask == "all_ones_2d":  # position ids restart, but the mask lets samples see each other
        leaky["attention_mask"] = torch.ones(2, width, dtype=torch.long)
    else:
        causal = torch.full((width, width), BLOCKED).triu(1)
        leaky["attention_mask"] = causal.expand(2, 1, width, width).clone()
    packed = _per_sample(model, leaky, samples)
    alone = _one_by_one(model, samples)
    # The first sample of a row has nothing before it; the later ones see their predecessors.
    for index in (1, 2):
        assert (packed[index][0] - alone[index][0]).abs().max() > 1e-3
        assert abs(packed[index][1].item() - alone[index][1].item()) > 1e-5


def test_a_packed_batch_stream_step_feeds_the_model_in_isolation(model):
    """End to end through BatchStream: the packed step's loss equals the samples' loss one by one."""
    generator = torch.Generator().manual_seed(1)
    dataset = []
    for length in [6, 11, 4, 9, 13, 5, 8, 7]:
        ids = torch.randint(3, 259, (length,), generator=generator).tolist()
        dataset.append({"input_ids": ids, "labels": [-100] + ids[1:]})
    stream = BatchStream(
        dataset,
        global_batch_size=2,
        micro_batch_size=2,
        rank=0,
        world_size=1,
        seed=0,
        packing=True,
        max_seq_len=24,
        pad_token_id=PAD,
    )
    (batch,) = stream.next_step()
    with torch.no_grad():
        logits = _forward(model, batch)
    shifted = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), reduction="sum")

    # Cut each row back into its samples where the position ids restart; padding ids are PAD.
    unpacked = []
    for ids, positions in zip(batch["input_ids"].tolist(), batch["position_ids"].tolist()):
        for token, position in zip(ids, positions):
            if token == PAD:
                break
            if position == 0:
                unpacked.append([])
            unpacked[-1].append(token)
    assert len(unpacked) == stream.cursor >= 3
    assert all(sample in [entry["input_ids"] for entry in dataset] for sample in unpacked)
    expected = 0.0
    with torch.no_grad():
        for ids in unpacked:
            alone = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            expected += F.cross_entropy(alone[:-1], torch.tensor(ids[1:]), reduction="sum").item()
    assert abs(shifted.item() - expected) < 1e-4
