"""`ditty check` prints the optimizer's parameter groups; the planner's groups (from the model's
config, no weights) equal the groups the optimizer builder makes from the real model."""

from __future__ import annotations

import pytest

from ditty.config import TrainerConfig
from ditty.config.sections import ModelConfig, OptimizerConfig, PeftConfig, RunConfig


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama")
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def built_groups(config) -> list[tuple[str, bool, float, int, int]]:
    from ditty.models.adapters import LoraConverter
    from ditty.models.build import build_model
    from ditty.optim.groups import group_parameters, module_parameters

    model = build_model(config.model, device="cpu", quant=config.quant)
    if config.peft.kind != "none":
        model = LoraConverter(config.peft).convert(model)
    groups = group_parameters([info for info, _ in module_parameters(model)], config.optimizer)
    return [(g.algorithm, g.decay, g.lr_factor, len(g.names), g.numel) for g in groups]


@pytest.mark.parametrize(
    "changes",
    [
        dict(optimizer=OptimizerConfig(kind="muon", weight_decay=0.1, lr_multipliers={"head": 2.0})),
        dict(
            peft=PeftConfig(kind="lora", r=4), optimizer=OptimizerConfig(kind="muon", lr_multipliers={"lora_B": 16.0})
        ),
        dict(optimizer=OptimizerConfig(kind="adafactor", weight_decay=0.1, no_decay=["bias", "mlp"])),
    ],
    ids=["muon", "lora-muon-loraplus", "adafactor-patterns"],
)
def test_planned_groups_equal_the_built_optimizers(llama_dir, changes):
    from ditty.plan.groups import planned_groups

    config = TrainerConfig(run=RunConfig(device="cpu"), model=ModelConfig(path=llama_dir), **changes)
    planned = [(g.algorithm, g.decay, g.lr_factor, len(g.names), g.numel) for g in planned_groups(config)]
    assert planned == built_groups(config)


def test_check_prints_the_groups_and_what_muon_takes(capsys):
    from ditty.cli import main

    assert main(["check", "tiny_sft", "--optimizer.kind", "muon", "--optimizer.weight_decay", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "optimizer groups:" in out
    assert "  adamw, no decay: 10 tensors, 34,304 parameters" in out  # embeddings and norms
    assert "  muon, decay: 28 tensors, 655,360 parameters" in out
    assert "      model.layers.N.mlp.down_proj.weight" in out
    assert "  adamw, decay: 1 tensor, 33,152 parameters" in out  # the head
    assert (
        sum(
            int(line.rsplit(", ", 1)[1].split()[0].replace(",", ""))
            for line in out.splitlines()
            if line.startswith("  adamw") or line.startswith("  muon")
        )
        == 722_816
    )  # every parameter


def test_check_prints_the_groups_of_a_bert_classifier(capsys):
    from ditty.cli import main

    assert main(["check", "tiny_bert_topics", "--optimizer.kind", "muon"]) == 0
    out = capsys.readouterr().out
    assert "      bert.encoder.layer.N.attention.self.query.weight" in out
    assert "classifier" not in out.split("optimizer groups:")[1].split("ok:")[0]  # the head is AdamW's
