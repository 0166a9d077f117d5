"""Command-line flags on top of a recipe: one entry of a table field, and a flag given twice."""

from __future__ import annotations

import pytest

from ditty.config.errors import RecipeError
from ditty.config.loader import parse_recipe
from ditty.config.overrides import apply_overrides

RECIPE = """
[model]
architecture = "llama"
config = { hidden_size = 64, num_hidden_layers = 4, rope_scaling = { factor = 2.0 } }
"""


def test_a_dotted_flag_sets_one_entry_of_a_table_and_keeps_the_rest():
    loaded = apply_overrides(
        parse_recipe(RECIPE),
        [
            "--model.config.hidden_size",
            "32",
            "--model.config.rope_scaling.type",
            "linear",
            "--model.factory_kwargs.w",
            "3",
        ],
    )
    assert loaded.config.model.config == {
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "rope_scaling": {"factor": 2.0, "type": "linear"},
    }
    assert loaded.config.model.factory_kwargs == {"w": 3}
    assert loaded.provenance["model.config"] == "flag"


def test_a_dotted_flag_after_a_whole_table_flag_adds_to_it():
    flags = ["--model.config", "{ hidden_size = 16 }", "--model.config.num_hidden_layers", "2"]
    assert apply_overrides(parse_recipe(RECIPE), flags).config.model.config == {
        "hidden_size": 16,
        "num_hidden_layers": 2,
    }


def test_of_a_flag_given_twice_the_last_wins():
    """A script appends overrides to a command line; the later value is the one it meant."""
    flags = ["--train.steps", "5", "--model.config.hidden_size", "8", "--train.steps", "600"]
    flags += ["--model.config.hidden_size", "16"]
    loaded = apply_overrides(parse_recipe(RECIPE), flags)
    assert loaded.config.train.steps == 600 and loaded.config.model.config["hidden_size"] == 16


def test_a_flag_past_a_plain_field_is_unknown():
    with pytest.raises(RecipeError, match="unknown flag --run.seed.x"):
        apply_overrides(parse_recipe(RECIPE), ["--run.seed.x", "1"])
