"""Keys a user brings from the Hugging Face Trainer, TRL, peft or axolotl point to ditty's key."""

from __future__ import annotations

import pytest

from ditty.cli import main
from ditty.config import RecipeError
from ditty.config.aliases import FOREIGN_KEYS
from ditty.config.loader import parse_recipe
from ditty.config.root import TrainerConfig
from ditty.config.schema import walk_leaves


def test_every_alias_points_at_a_real_key():
    leaves = {leaf.path for leaf in walk_leaves(TrainerConfig)}
    assert {target for target, _ in FOREIGN_KEYS.values()} <= leaves


def test_learning_rate_under_optimizer_says_lr(tmp_path, capsys):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[optimizer]\nlearning_rate = 1e-4\n")
    code = main(["check", str(recipe)])
    err = capsys.readouterr().err
    assert code == 2
    assert "optimizer.learning_rate" in err and "did you mean `lr`?" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "section, key, wanted",
    [
        ("train", "num_train_epochs", "`epochs`"),
        ("train", "per_device_train_batch_size", "`micro_batch_size`"),
        ("train", "gradient_accumulation_steps", "`global_batch_size`"),
        ("peft", "lora_r", "`r`"),
        ("peft", "lora_alpha", "`alpha`"),
        ("scheduler", "warmup_ratio", "`warmup_steps`"),
        ("train", "learning_rate", "`optimizer.lr`"),  # another section: the dotted key
        ("data", "max_seq_length", "`max_seq_len`"),
    ],
)
def test_other_tools_keys_name_dittys(section, key, wanted):
    with pytest.raises(RecipeError) as caught:
        parse_recipe(f"[{section}]\n{key} = 1\n", source="r.toml")
    (problem,) = caught.value.problems
    assert problem.key == f"{section}.{key}" and problem.line == 2
    assert f"did you mean {wanted}?" in problem.fix


def test_flag_with_another_tools_name(capsys):
    code = main(["check", "tiny_sft", "--optimizer.learning_rate", "1e-4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "did you mean `--optimizer.lr`?" in err
