"""A context-parallel rank's slice of a batch: labels shifted over whole rows, rows padded to a multiple
of cp, packed samples' lengths kept over whole rows, and the counts of the slices adding up."""

from __future__ import annotations

import torch

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS
from ditty.data.collate import pack_rows, pad_samples
from ditty.data.context_shard import shard_batch
from ditty.data.formats.base import PaddingCollator
from ditty.stages.loss import CausalLMLoss


def _samples(*lengths: int) -> list[tuple[list[int], list[int]]]:
    out, token = [], 10
    for length in lengths:
        ids = list(range(token, token + length))
        token += length
        out.append((ids, [IGNORE_INDEX] + ids[1:]))  # the formats never score a sample's first token
    return out


def _whole(pieces: list[dict], key: str) -> torch.Tensor:
    return torch.cat([piece[key] for piece in pieces], dim=1)


def test_padded_rows_are_shifted_then_cut_into_equal_pieces():
    batch = pad_samples(_samples(7, 4), pad_token_id=0)  # width 7: padded to 9 for cp = 3
    pieces = [shard_batch(batch, rank, 3, pad_token_id=0) for rank in range(3)]
    assert all(piece["input_ids"].shape == (2, 3) for piece in pieces)
    assert "labels" not in pieces[0]
    shifted = _whole(pieces, SHIFTED_LABELS)
    assert torch.equal(shifted[:, :6], batch["labels"][:, 1:7])  # position t scored on label t + 1
    assert (shifted[:, 6:] == IGNORE_INDEX).all()  # the last position and the padding score nothing
    assert torch.equal(_whole(pieces, "input_ids")[:, :7], batch["input_ids"])
    assert torch.equal(_whole(pieces, "position_ids")[0], torch.arange(9))  # positions count on
    assert _whole(pieces, "attention_mask")[:, 7:].sum() == 0


def test_the_pieces_count_what_the_whole_batch_counts():
    batch = pad_samples(_samples(7, 4, 6), pad_token_id=0)
    pieces = [shard_batch(batch, rank, 2, pad_token_id=0) for rank in range(2)]
    loss, collator = CausalLMLoss(), PaddingCollator(pad_token_id=0)
    assert sum(int(loss.count_tokens(p)) for p in pieces) == int(loss.count_tokens(batch))
    assert sum(int(collator.supervised_count(p)) for p in pieces) == int(collator.supervised_count(batch))
    assert sum(int(collator.input_count(p)) for p in pieces) == int(collator.input_count(batch))


def test_packed_rows_keep_their_sample_lengths_over_whole_padded_rows():
    batch = pack_rows([_samples(3, 2), _samples(4)], pad_token_id=0)  # width 5: row 1 has a padding tail of 1
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 9, 10]
    pieces = [shard_batch(batch, rank, 2, pad_token_id=0) for rank in range(2)]  # padded to 6
    # every row's extra position is a sample of its own, and the lengths still cover whole rows
    assert pieces[0]["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 11, 12]
    assert pieces[1]["cu_seq_lens_q"] is pieces[1]["cu_seq_lens_k"]
    assert pieces[0]["max_length_q"] == 4
    positions = _whole(pieces, "position_ids")
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    collator = PaddingCollator(pad_token_id=0)
    assert sum(int(collator.input_count(p)) for p in pieces) == int(collator.input_count(batch))


def test_an_exact_multiple_is_not_padded():
    batch = pad_samples(_samples(4, 4), pad_token_id=0)
    pieces = [shard_batch(batch, rank, 2, pad_token_id=0) for rank in range(2)]
    assert torch.equal(_whole(pieces, "input_ids"), batch["input_ids"])
