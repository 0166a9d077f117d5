"""Every model task on two processes with FSDP (real gloo ranks), with and without LoRA: the same
per-step losses and validation metrics as one process (the data order and the loss are global, and
dropout is off in the test models), and a final/ gathered from the shards that computes the logits of
the one-process model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ditty.models.tasks import model_task, transformers_class
from ditty.train.pipeline import call_model
from tests.parallel.harness import run_ranks
from tests.tasks.helpers import CASES, losses, records
from tests.tasks.workers import train_cases

# One worker runs the module: its fixture trains every case on two ranks, which each xdist worker
# handed a case would otherwise do again (two 2-rank jobs at once on two cores).
pytestmark = pytest.mark.xdist_group("task_fsdp")


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory, task_models, task_files):
    root = tmp_path_factory.mktemp("fsdp")
    results = run_ranks(
        train_cases,
        2,
        [c.id for c in CASES],
        str(root),
        task_models,
        task_files,
        timeout=600.0,
        collective_timeout=120.0,
    )
    return results[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fsdp_on_two_ranks_trains_like_one_process(fsdp_runs, trained, task_models, case):
    one = trained[case.id]
    two = fsdp_runs[case.id]
    one_losses = losses(one["run_dir"])
    assert [s for s, _ in two["losses"]] == [s for s, _ in one_losses]
    for (_, a), (_, b) in zip(two["losses"], one_losses):
        assert a == pytest.approx(b, rel=1e-5)
    single = records(one["run_dir"])[-1]
    for key, value in single.items():
        if key.startswith("val_"):
            assert two["last"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    final = Path(two["run_dir"]) / "final"
    auto = transformers_class(model_task(case.task))
    if case.adapter:
        from peft import PeftModel

        labels = {}
        if (final / "labels.json").is_file():
            saved = json.loads((final / "labels.json").read_text())
            labels = {"id2label": {int(i): n for i, n in saved["id2label"].items()}, "label2id": saved["label2id"]}
        model = PeftModel.from_pretrained(auto.from_pretrained(task_models[case.family], **labels), final)
    else:
        model = auto.from_pretrained(final)
    with torch.no_grad():
        logits = call_model(model.eval(), one["batch"], {}, lm=True).logits
    torch.testing.assert_close(logits, one["logits"], atol=1e-4, rtol=1e-4)
