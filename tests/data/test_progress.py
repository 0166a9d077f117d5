"""Data preparation shows `datasets`' progress bars on rank 0 only (every rank tokenizes the same data)."""

from __future__ import annotations

import datasets
import pytest

from ditty.config.sections import DataConfig
from ditty.data.build import build_data
from ditty.data.tokenizer import byte_tokenizer


@pytest.mark.parametrize("rank, shown", [("0", True), ("1", False)])
def test_tokenizing_bar_on_rank_zero_only(monkeypatch, capfd, rank, shown):
    monkeypatch.setenv("RANK", rank)  # no process group: the rank comes from torchrun's environment
    datasets.enable_progress_bars()
    build_data(DataConfig(name="addition", num_samples=50, val_fraction=0.1), byte_tokenizer(), seed=0)
    assert ("tokenizing" in capfd.readouterr().err) is shown
    assert not datasets.are_progress_bars_disabled()  # turned back on after
