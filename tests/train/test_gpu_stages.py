"""The stages after SFT, and the 8-bit optimizers, on a CUDA GPU (marker `gpu`: skipped, and counted,
without one): DPO with each kind of reference, reference-free kinds, a reward model and GRPO's sampled
rollouts, in bf16 on the session's tiny Llama. The CPU suite checks their arithmetic to 1e-6 in fp32;
these check that the same code runs on CUDA (devices of the frozen copy, the precomputed file, the
generation cache, the score head) and still learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


DEVICE, PRECISION = "cuda", "bf16"


def train(
    tmp_path: Path,
    name: str,
    model_dir: str,
    *,
    data: str,
    sections: str,
    steps: int = 4,
    model: str = "",
    optimizer: str = "",
) -> list[dict]:
    """The metrics records of a `steps`-step bf16 run of the built-in addition data on CUDA."""
    from ditty.config.loader import parse_recipe
    from ditty.train.trainer import Trainer

    text = f"""
[run]
output_dir = "{tmp_path / name}"
seed = 0
device = "{DEVICE}"
[model]
path = "{model_dir}"
{model}
[data]
source = "builtin"
name = "addition"
format = "{data}"
num_samples = 256
val_fraction = 0.125
max_seq_len = 32
[train]
steps = {steps}
global_batch_size = 8
micro_batch_size = 4
precision = "{PRECISION}"
log_every = 1
eval_every = {steps}
eval_samples = 16
[optimizer]
lr = 1e-3
{optimizer}
[scheduler]
kind = "constant"
[logging]
progress = false
{sections}
"""
    result = Trainer(parse_recipe(text, source=name).config).train()
    lines = (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def losses(records: list[dict]) -> list[float]:
    values = [r["loss"] for r in records if "loss" in r]
    assert values and all(math.isfinite(v) for v in values), values
    return values


LORA = '[peft]\nkind = "lora"\nr = 8\nalpha = 16\n'


@pytest.mark.parametrize(
    ("reference", "peft"),
    [("auto", LORA), ("precompute", LORA), ("auto", "")],
    ids=["lora-adapter-off", "lora-precompute", "full-frozen-copy"],
)
def test_dpo_trains_on_cuda_with_each_reference(tmp_path, tiny_llama_dir, reference, peft):
    records = train(
        tmp_path,
        "dpo",
        tiny_llama_dir,
        data="preference",
        sections=f'{peft}[preference]\nkind = "dpo"\nbeta = 0.5\nreference = "{reference}"\n',
    )
    losses(records)
    trained = [r for r in records if "loss" in r]
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"):
        assert all(name in r for r in trained), (name, trained[-1])
    assert any("val_rewards/accuracies" in r for r in records), records[-1]
    # At step 1 the policy is its own reference: every reward is 0 whatever the device.
    assert abs(trained[0]["rewards/margins"]) < 1e-2, trained[0]


@pytest.mark.parametrize("kind", ["ipo", "simpo", "orpo"])
def test_the_other_pair_losses_train_on_cuda(tmp_path, tiny_llama_dir, kind):
    sections = f'{LORA}[preference]\nkind = "{kind}"\n'
    records = train(tmp_path, kind, tiny_llama_dir, data="preference", sections=sections)
    losses(records)


def test_a_reward_model_trains_on_cuda_and_final_scores_through_transformers(tmp_path, tiny_llama_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    records = train(
        tmp_path, "reward", tiny_llama_dir, data="preference", sections="", steps=6, model='task = "reward-model"'
    )
    losses(records)
    assert any("val_accuracy" in r for r in records), records[-1]
    final = tmp_path / "reward" / "final"
    model = AutoModelForSequenceClassification.from_pretrained(final).to(DEVICE)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.num_labels == 1
    batch = tokenizer(["12+47=59", "12+47=60"], return_tensors="pt", padding=True).to(DEVICE)
    with torch.no_grad():
        scores = model(**batch).logits
    assert scores.shape == (2, 1) and torch.isfinite(scores).all()


@pytest.mark.parametrize("loss", ["grpo", "dapo"])
def test_grpo_samples_groups_and_trains_on_cuda(tmp_path, tiny_llama_dir, loss):
    records = train(
        tmp_path,
        f"grpo-{loss}",
        tiny_llama_dir,
        data="prompt",
        sections=(
            '[rl]\nkind = "grpo"\ngroup_size = 4\nmax_new_tokens = 4\n'
            f'loss = "{loss}"\nrewards = ["ditty.objectives.rewards.builtin_rewards:exact_match"]\n'
        ),
    )
    losses(records)
    assert all("reward" in r for r in records if "loss" in r), records[-1]


@pytest.mark.parametrize("backend", ["torchao", "bnb"])
def test_8bit_adamw_trains_on_cuda(tmp_path, tiny_llama_dir, backend):
    pytest.importorskip("bitsandbytes" if backend == "bnb" else "torchao")
    records = train(
        tmp_path,
        f"adamw8bit-{backend}",
        tiny_llama_dir,
        data="prompt_completion",
        sections="",
        steps=8,
        optimizer=f'kind = "adamw8bit"\nbackend = "{backend}"',
    )
    values = losses(records)
    assert values[-1] < values[0], values
