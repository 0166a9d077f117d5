"""An iterable dataset of the Python API on two DDP ranks trains as one process does: each rank reads
the whole stream and keeps its half of every global batch (ditty.data.iterable)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        from examples.custom_pipeline import make_rows

        return iter(make_rows(40))


def _train(out: str, batch_size: int) -> None:
    from ditty.loss import MSELoss
    from ditty.pipeline import ModelFactory, Pipeline
    from examples.custom_pipeline import Regressor, SplitTarget

    torch.manual_seed(0)
    Pipeline(
        model_factory=ModelFactory.from_instance(Regressor()),
        dataset=Stream(),
        shuffle_buffer_size=16,
        loss_calculator=MSELoss(contract="y:2:f32, ctx.target:2:f32 -> loss:0:f32"),
        preprocessors=[SplitTarget()],
        output_dir=out,
        max_steps=7,  # 40 rows, 8 a step: the stream is read a second time from step 6
        batch_size=batch_size,
        lr_schedule="constant",
        warmup_steps=0,
        log_every=1,
        device="cpu",
        num_threads=1,
        progress=False,
    ).run()


def _rank(rank: int, world: int, out: str) -> None:
    _train(out, batch_size=4)  # 2 ranks x 4 = the single process's 8


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def test_two_ranks_train_an_iterable_dataset_as_one_process_does(tmp_path):
    _train(str(tmp_path / "one"), batch_size=8)
    run_ranks(_rank, 2, str(tmp_path / "two"), timeout=240)
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 7
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5, (one, two)
