"""Every way into training runs the same compiler before anything is built: `ditty run`, `Trainer(config)`,
a Trainer subclass, the Python `Pipeline`, and `ditty export`. One recipe that one rule refuses goes
through each, and each reports that rule's id and leaves nothing behind."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.writer import recipe_to_toml
from ditty.train import Trainer
from tests.train.helpers import small_config, write_prompt_completion

RULE = "compat.bnb-8bit-optimizer-fsdp"


def refused(config):
    """bitsandbytes' 8-bit AdamW under FSDP: refused on any world size, before a weight loads."""
    return replace(
        config,
        optimizer=replace(config.optimizer, kind="adamw8bit", backend="bnb"),
        parallel=replace(config.parallel, kind="fsdp"),
    )


def rule_ids(error: RecipeError) -> set[str]:
    return {p.rule for p in error.problems if p.severity == "error"}


@pytest.fixture
def config(tmp_path, tiny_llama_dir):
    return small_config(tmp_path, tiny_llama_dir, write_prompt_completion(tmp_path / "pc.jsonl"), steps=2)


def test_cli_run_refuses_it(config, tmp_path, capsys):
    from ditty.cli import commands as cli

    path = tmp_path / "recipe.toml"
    path.write_text(recipe_to_toml(refused(config)), encoding="utf-8")
    with pytest.raises(RecipeError) as caught:
        cli.cmd_run([str(path)])
    assert RULE in rule_ids(caught.value)
    assert cli.main(["run", str(path)]) == 2
    assert "8-bit AdamW fails on FSDP" in capsys.readouterr().err
    assert not os.path.exists(config.run.output_dir)


def test_trainer_refuses_it(config):
    with pytest.raises(RecipeError) as caught:
        Trainer(refused(config))
    assert RULE in rule_ids(caught.value)
    assert not os.path.exists(config.run.output_dir)


@dataclass(frozen=True)
class Extra:
    word: str = "hi"
    """A field of the subclass's own section."""


class ExtraTrainer(Trainer):
    @dataclass(frozen=True)
    class Config(Trainer.Config):
        extra: Extra = field(default_factory=Extra)


def test_a_trainer_subclass_refuses_it(config):
    base = refused(config)
    sub_config = ExtraTrainer.Config(**{name: getattr(base, name) for name in base.__dataclass_fields__})
    with pytest.raises(RecipeError) as caught:
        ExtraTrainer(sub_config)
    assert RULE in rule_ids(caught.value)
    assert not os.path.exists(config.run.output_dir)


def test_the_pipeline_refuses_it(tmp_path):
    from ditty import FSDPConfig, ModelFactory, Pipeline
    from ditty.loss import MSELoss

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    data = [(torch.randn(4), torch.randn(4)) for _ in range(8)]
    with pytest.raises(RecipeError) as caught:
        Pipeline(
            model_factory=ModelFactory.from_instance(model, fsdp_config=FSDPConfig(enabled=True)),
            dataset=data,
            loss_calculator=MSELoss(),
            use_8bit_optim=True,
            optim_backend="bnb",
            output_dir=str(tmp_path / "pipeline"),
        )
    assert RULE in rule_ids(caught.value)
    assert not (tmp_path / "pipeline").exists()


def test_export_refuses_a_checkpoint_whose_recipe_it_refuses(config, tmp_path):
    from ditty.cli.export import export

    config = replace(config, checkpoint=replace(config.checkpoint, every=2))
    Trainer(config).train()
    sidecar = os.path.join(config.run.output_dir, "checkpoints", "step-2", "ditty_state.json")
    with open(sidecar, encoding="utf-8") as f:
        doc = json.load(f)
    doc["recipe_toml"] = recipe_to_toml(refused(config))  # as if written by a recipe the compiler refuses
    with open(sidecar, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    from pathlib import Path

    from ditty.checkpoint.manifest import describe_all

    describe_all(Path(sidecar).parent)  # sealed again: a checkpoint that recipe wrote, not a damaged one
    with pytest.raises(RecipeError) as caught:
        export(config.run.output_dir, tmp_path / "exported")
    assert RULE in rule_ids(caught.value)
    assert not (tmp_path / "exported").exists()
