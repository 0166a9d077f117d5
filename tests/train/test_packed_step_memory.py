"""A packed training step (forward, backward, optimizer) allocates no tensor of T x T elements: the
rows carry cumulative sample lengths, not a mask, and attention runs within each sample. The control
(a model type that keeps the dense mask) does allocate one, so the probe can see it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ditty.train import Trainer
from tests.train.helpers import small_config, write_prompt_completion

WIDTH = 512


class SquareAllocations(TorchDispatchMode):
    """Tensors that aten ops return while active with two dimensions of the row width (a T x T
    score or mask), and the largest tensor of all."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.square, self.largest = width, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                if list(t.shape).count(self.width) >= 2:
                    self.square.append((str(func), tuple(t.shape)))
        return out


def packed_trainer(tmp_path, model_dir: str, loss_chunks: int = 0) -> Trainer:
    config = small_config(tmp_path, model_dir, write_prompt_completion(tmp_path / "pc.jsonl", n=256), steps=2)
    config = replace(config, data=replace(config.data, packing=True, max_seq_len=WIDTH))
    train = replace(config.train, global_batch_size=2, micro_batch_size=2, loss_chunks=loss_chunks)
    return Trainer(replace(config, train=train))


def square_tensors_in_a_step(trainer: Trainer) -> tuple[int, SquareAllocations]:
    micro_batches = trainer.stream.next_step()
    width = micro_batches[0]["input_ids"].shape[1]
    trainer.model.train()
    with SquareAllocations(width) as probe:
        trainer.train_step(micro_batches)
    return width, probe


def test_a_packed_step_allocates_nothing_of_t_squared(tmp_path, tiny_llama_dir):
    """With the chunked loss too, nothing in the step is even T^2 elements large."""
    trainer = packed_trainer(tmp_path, tiny_llama_dir, loss_chunks=4)
    width, probe = square_tensors_in_a_step(trainer)
    assert width > 400  # rows of many samples (about 15 tokens each)
    assert probe.square == [] and probe.largest < width * width


@pytest.fixture
def tiny_gemma2_dir(tmp_path_factory):
    from tests.conftest import _save_tiny

    return _save_tiny(tmp_path_factory.mktemp("tiny-gemma2"), "gemma2", attn_implementation="eager")


def test_control_the_dense_mask_path_does(tmp_path, tiny_gemma2_dir):
    """gemma2 softcaps its attention scores, so it keeps the [B, 1, T, T] mask (and eager scores)."""
    width, probe = square_tensors_in_a_step(packed_trainer(tmp_path, tiny_gemma2_dir))
    assert probe.square and probe.largest >= width * width
