"""Training a reward model through `ditty run` (in-process): split invariance over micro-batches,
pair metrics, a LoRA reward model whose final/ transformers loads alone, and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from tests.reward.helpers import records, reward_recipe, save_tiny_causal_lm

PAIRS = [
    {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(10, 14) for b in range(5)
]


def run(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def write_pairs(path, pairs) -> str:
    path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return str(path)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory) -> str:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("sft") / "model")


@pytest.mark.slow  # two 3-step runs of a tiny Llama
def test_micro_batches_of_2_and_8_pairs_give_the_same_losses(capsys, tmp_path):
    losses = {}
    for micro in (2, 8):
        directory = tmp_path / str(micro)
        directory.mkdir()
        code, out = run(capsys, "run", reward_recipe(directory, steps=3, global_pairs=8, micro_pairs=micro))
        assert code == 0, out
        logged = records(directory / "run")
        losses[micro] = [r["loss"] for r in logged if "loss" in r]
        assert len(losses[micro]) == 3
        last = logged[-1]
        for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
            assert name in last, name
        assert last["rewards/margins"] == pytest.approx(last["rewards/chosen"] - last["rewards/rejected"], abs=1e-5)
        assert 0.0 <= last["val_accuracy"] <= 1.0 and "val_loss" in last
    assert losses[2] == pytest.approx(losses[8], abs=1e-6)
    assert losses[8][0] == pytest.approx(0.6931, abs=0.05)  # a fresh score head: -log sigmoid(~0)


@pytest.mark.slow  # a 2-step LoRA run, merged, exported and loaded three ways
def test_a_lora_reward_model_final_loads_with_transformers_alone(capsys, tmp_path, sft_dir):
    from peft import AutoPeftModelForSequenceClassification
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    recipe = reward_recipe(
        tmp_path,
        model_dir=sft_dir,
        steps=2,
        extra='[peft]\nkind = "lora"\nr = 4\nalpha = 8\ntarget_modules = "all-linear"',
    )
    code, out = run(capsys, "run", recipe)
    assert code == 0, out
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file()
    with safe_open(str(final / "adapter_model.safetensors"), "pt") as weights:
        assert any("score" in name for name in weights.keys())  # the new head trains fully beside the adapter
    merged = AutoModelForSequenceClassification.from_pretrained(str(final / "merged")).eval()
    assert merged.config.num_labels == 1 and merged.config.pad_token_id is not None
    tokenizer = AutoTokenizer.from_pretrained(str(final / "merged"))
    texts = ["12+3=15" + tokenizer.eos_token, "12+3=16" + tokenizer.eos_token, "10+10=20" + tokenizer.eos_token]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)
    labels = json.loads((final / "labels.json").read_text())  # as the model card loads an adapter of a classifier
    assert labels["num_labels"] == 1
    id2label = {int(i): name for i, name in labels["id2label"].items()}
    adapter = AutoPeftModelForSequenceClassification.from_pretrained(
        str(final), id2label=id2label, label2id=labels["label2id"]
    ).eval()
    with torch.no_grad():
        merged_scores = merged(**inputs).logits
        adapter_scores = adapter(**inputs).logits
    assert merged_scores.shape == (3, 1)
    assert torch.allclose(merged_scores, adapter_scores, atol=1e-5)
    card = (final / "README.md").read_text()
    assert "task `reward-model`" in card and 'pipeline("text-classification", model="final/merged")' in card

    from ditty.train.final import final_model_task

    assert final_model_task(str(tmp_path / "run")).name == "reward-model"  # what export and push go by
    exported = tmp_path / "exported"
    code, out = run(capsys, "export", tmp_path / "run", "-o", exported, "--merge-lora")
    assert code == 0, out
    again = AutoModelForSequenceClassification.from_pretrained(str(exported)).eval()
    with torch.no_grad():
        assert torch.allclose(again(**inputs).logits, merged_scores, atol=1e-5)


def test_a_pair_missing_rejected_exits_2_with_file_and_line(capsys, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:2] + [{"prompt": "1+1=", "chosen": "2"}] + PAIRS[2:])
    before = open(data).read()
    code, out = run(capsys, "run", reward_recipe(tmp_path, data=data))
    assert code == 2, out
    assert f"{data}:3" in out and "'rejected' is missing" in out
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "final").exists()
    assert open(data).read() == before  # nothing the user has is touched


@pytest.mark.slow  # a 2-step run from the Python API
def test_the_python_api_trains_a_reward_model_instance_on_rows(tmp_path, sft_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ditty.pipeline import ModelFactory, Pipeline

    model = AutoModelForSequenceClassification.from_pretrained(sft_dir, num_labels=1)
    result = Pipeline(
        model_task="reward-model",
        model_factory=ModelFactory.from_instance(model),
        dataset=PAIRS[:16],
        val_dataset=PAIRS[16:],
        tokenizer=AutoTokenizer.from_pretrained(sft_dir),
        output_dir=str(tmp_path / "run"),
        steps=2,
        batch_size=4,
        grad_accum=2,
        lr=1e-3,
        device="cpu",
        num_threads=1,
        progress=False,
        log_every=1,
    ).run()
    last = records(tmp_path / "run")[-1]
    assert {"rewards/accuracies", "val_accuracy", "val_loss"} <= set(last), last
    assert result.run_dir == str(tmp_path / "run")
    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "run" / "final"))
    assert loaded.config.num_labels == 1


@pytest.mark.slow  # two gloo ranks and one process, 3 steps each
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_give_the_losses_of_one_process(capsys, tmp_path, parallel):
    from tests.parallel.harness import run_ranks
    from tests.reward.workers import train_reward

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    code, out = run(capsys, "run", reward_recipe(one, steps=3, global_pairs=8, micro_pairs=4))
    assert code == 0, out
    single = records(one / "run")
    recipe = reward_recipe(two, steps=3, global_pairs=8, micro_pairs=2)  # 2 ranks x 2 pairs x 2 accumulation
    losses, last = run_ranks(train_reward, 2, recipe, parallel, timeout=600.0)[0]
    assert losses == pytest.approx([r["loss"] for r in single if "loss" in r], abs=1e-6)
    assert last["val_accuracy"] == pytest.approx(single[-1]["val_accuracy"], abs=1e-9)
    assert last["val_loss"] == pytest.approx(single[-1]["val_loss"], abs=1e-6)


def test_export_of_a_reward_model_does_not_call_its_trained_head_random(capsys, caplog, tmp_path, sft_dir):
    with caplog.at_level("WARNING", logger="ditty.models"):
        code, out = run(capsys, "run", reward_recipe(tmp_path, model_dir=sft_dir, steps=1))
        assert code == 0, out
        assert "new task head for reward-model (randomly initialised" in caplog.text  # true while training
        caplog.clear()
        code, out = run(capsys, "export", tmp_path / "run", "-o", tmp_path / "exported")
    assert code == 0, out
    assert "randomly initialised" not in caplog.text + out  # the head comes from the checkpoint
