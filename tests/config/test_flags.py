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


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--train.steps", "5", "--train.steps", "600"], "`train.steps` --train.steps is given twice"),
        (["--model.config.hidden_size", "8", "--model.config.hidden_size", "16"], "is given twice"),
        (["--run.seed.x", "1"], "unknown flag --run.seed.x"),
    ],
)
def test_a_flag_given_twice_or_past_a_plain_field_is_refused(flags, words):
    with pytest.raises(RecipeError, match=words):
        apply_overrides(parse_recipe(RECIPE), flags)
