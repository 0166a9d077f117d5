"""Every model task from the Python API (`Pipeline`): transformers models given as instances with rows
of the task's format, or model and data named in extra_config; final/ holds the tokenizer. Custom
models: only the batch keys their forward takes reach them, under peft too; quantization of a given
instance is applied."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.loss import CrossEntropyLoss
from ditty.pipeline import ModelFactory, Pipeline
from tests.tasks.data import classification_rows, token_rows

COMMON = dict(steps=2, batch_size=4, grad_accum=2, lr=3e-3, device="cpu", num_threads=1, progress=False, log_every=1)


def last_record(run_dir) -> dict:
    return json.loads(open(f"{run_dir}/metrics.jsonl").read().splitlines()[-1])


@pytest.mark.slow
def test_a_classifier_instance_with_rows_trains_and_saves_its_tokenizer_and_labels(tmp_path, task_models):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(task_models["bert"], num_labels=4)
    result = Pipeline(
        model_task="seq-classification",
        model_factory=ModelFactory.from_instance(model),
        dataset=classification_rows(32),
        val_dataset=classification_rows(8, offset=32),
        output_dir=str(tmp_path / "run"),
        **COMMON,
    ).run()
    assert {"val_accuracy", "val_f1"} <= set(last_record(result.run_dir))
    final = tmp_path / "run" / "final"
    # The tokenizer saved beside the given model's checkpoint is found and saved with it.
    assert (
        AutoTokenizer.from_pretrained(final).get_vocab()
        == AutoTokenizer.from_pretrained(task_models["bert"]).get_vocab()
    )
    loaded = AutoModelForSequenceClassification.from_pretrained(final)
    assert loaded.config.id2label == {0: "food", 1: "music", 2: "sport", 3: "weather"}


@pytest.mark.slow
def test_a_token_classifier_instance_with_a_given_tokenizer_and_lora(tmp_path, task_models):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(task_models["distilbert"])
    model = AutoModelForTokenClassification.from_pretrained(task_models["distilbert"], num_labels=5)
    pipeline = Pipeline(
        model_task="token-classification",
        model_factory=model,
        dataset=token_rows(32),
        tokenizer=tokenizer,
        extra_config={"peft": {"kind": "lora", "r": 4}},
        output_dir=str(tmp_path / "run"),
        **COMMON,
    )
    result = pipeline.run()
    trainable = [n for n, p in pipeline.trainer.model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable) and any("classifier" in n and "modules_to_save" in n for n in trainable)
    assert (tmp_path / "run" / "final" / "labels.json").is_file() and result.steps == 2
    wrong = AutoModelForTokenClassification.from_pretrained(task_models["distilbert"], num_labels=3)
    with pytest.raises(Exception, match="classifies into 3 labels and the data has 5"):
        Pipeline(model_task="token-classification", model_factory=wrong, dataset=token_rows(32), tokenizer=tokenizer,
                 output_dir=str(tmp_path / "wrong"), **COMMON).run()  # fmt: skip


@pytest.mark.slow
def test_seq2seq_and_masked_lm_named_in_extra_config(tmp_path, task_models, task_files):
    for task, family, fmt in (("seq2seq", "t5", "seq2seq"), ("masked-lm", "bert", "masked_lm")):
        result = Pipeline(
            model_task=task,
            extra_config={
                "model": {"path": task_models[family]},
                # 128: the tiny BERT's positions (a longer data.max_seq_len is refused)
                "data": {
                    "source": "file",
                    "path": task_files[fmt],
                    "val_path": task_files[f"{fmt}_val"],
                    "max_seq_len": 128,
                },
                "train": {"eval_samples": 4},
            },
            output_dir=str(tmp_path / task),
            **COMMON,
        ).run()
        metric = "val_exact_match" if task == "seq2seq" else "val_perplexity"
        assert metric in last_record(result.run_dir)
        assert (tmp_path / task / "final" / "tokenizer_config.json").is_file()


class Tagger(torch.nn.Module):
    """A custom token tagger whose forward takes input_ids only: no attention_mask, no labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids):
        return self.head(torch.relu(self.proj(self.embed(input_ids))))


class KwargsTagger(Tagger):
    """Takes **kwargs; its contract says it reads input_ids."""

    contract = "input_ids:2:i64 -> logits:3:f32"

    def forward(self, **kwargs):
        assert set(kwargs) == {"input_ids"}, sorted(kwargs)
        return super().forward(kwargs["input_ids"])


def tag_rows(count: int = 32) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (count, 6), generator=generator)
    return [{"input_ids": row, "attention_mask": torch.ones(6, dtype=torch.long), "labels": row % 3} for row in ids]


@pytest.mark.parametrize("model_class", [Tagger, KwargsTagger])
def test_a_custom_model_under_peft_gets_only_the_keys_its_forward_takes(tmp_path, model_class):
    pipeline = Pipeline(
        model_factory=model_class(),
        dataset=tag_rows(),
        loss_calculator=CrossEntropyLoss(target_key="labels", mask_key=None),
        extra_config={"peft": {"kind": "lora", "r": 2, "target_modules": ["proj"]}},
        output_dir=str(tmp_path / "run"),
        **COMMON,
    )
    assert pipeline.run().steps == 2  # labels and attention_mask stay in the batch for the loss only


def test_quantization_of_a_given_instance_is_applied(tmp_path):
    from ditty.models.quant import quantized_linear_count

    pipeline = Pipeline(
        model_factory=Tagger(),
        dataset=tag_rows(),
        loss_calculator=CrossEntropyLoss(target_key="labels", mask_key=None),
        extra_config={"quant": {"kind": "bnb-4bit"}, "peft": {"kind": "lora", "r": 2, "target_modules": ["proj"]}},
        output_dir=str(tmp_path / "run"),
        **COMMON,
    )
    assert pipeline.run().steps == 2
    assert quantized_linear_count(pipeline.trainer.model) == {"Linear4bit": 2, "Linear8bitLt": 0}
