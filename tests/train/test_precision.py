"""bf16 autocast and fp16 with dynamic loss scaling, at tiny sizes (this CPU has no bf16/fp16 units)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from ditty.parallel.precision import build_precision
from ditty.train import Trainer
from tests.train.helpers import read_jsonl, small_config, write_prompt_completion


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, tiny_llama_dir, precision):
    config = small_config(
        tmp_path,
        tiny_llama_dir,
        write_prompt_completion(tmp_path / "pc.jsonl", n=24),
        steps=2,
        global_batch_size=4,
        micro_batch_size=2,
        precision=precision,
    )
    result = Trainer(config).train()
    records = read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    assert all(math.isfinite(r["loss"]) for r in records if not r.get("skipped"))
    if precision == "fp16":
        assert all(r["loss_scale"] > 0 for r in records)


def test_autocast_dtype_and_scaler():
    cpu = torch.device("cpu")
    assert build_precision("fp32", cpu).scaler is None
    with build_precision("bf16", cpu).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    fp16 = build_precision("fp16", cpu)
    assert fp16.scaler is not None and fp16.compute_dtype == torch.float16


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    prec = build_precision("fp16", torch.device("cpu"))
    prec.backward((p * float("inf")).sum())
    prec.unscale_(opt)
    scale = prec.loss_scale
    assert prec.step(opt) is False
    assert prec.loss_scale < scale and torch.equal(p.detach(), torch.ones(3))
