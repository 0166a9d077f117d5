"""Fuzzing the loader: whatever the bytes, it raises nothing but RecipeError."""

from __future__ import annotations

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ditty.config import RecipeError, TrainerConfig
from ditty.config.bundled import bundled_recipes
from ditty.config.loader import parse_recipe
from ditty.config.schema import walk_leaves
from tests.config.strategies import toml_values

KNOWN_NAMES = sorted({part for leaf in walk_leaves(TrainerConfig) for part in leaf.path.split(".")} | {"trainer"})
keys = st.one_of(st.sampled_from(KNOWN_NAMES), st.text(min_size=1, max_size=6))
documents = st.recursive(
    st.dictionaries(keys, toml_values, max_size=4),
    lambda inner: st.dictionaries(
        keys, st.one_of(toml_values, inner, st.lists(inner, min_size=1, max_size=2)), max_size=4
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_or_recipe_error(raw) -> None:
    try:
        parse_recipe(raw, source="fuzz.toml")
    except RecipeError as error:
        assert error.problems and error.format()


@FUZZ
@given(documents)
def test_random_toml_documents(document):
    load_or_recipe_error(tomli_w.dumps(document))


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(raw):
    load_or_recipe_error(raw)


BUNDLED = [recipe.path.read_text() for recipe in bundled_recipes()] or ["[train]\nsteps = 1\n"]


@FUZZ
@given(st.sampled_from(BUNDLED), st.data())
def test_mutated_bundled_recipes(text, data):
    lines = text.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        if not lines:
            break
        index = data.draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        mutation = data.draw(st.sampled_from(["delete", "duplicate", "swap_char", "insert", "truncate"]))
        if mutation == "delete":
            del lines[index]
        elif mutation == "duplicate":
            lines.insert(index, line)
        elif mutation == "truncate":
            lines[index] = line[: data.draw(st.integers(0, len(line)))]
        else:
            position = data.draw(st.integers(0, len(line)))
            char = data.draw(st.sampled_from(list("=[]{}\"'.,#x0 \\\n-")))
            if mutation == "insert":
                lines[index] = line[:position] + char + line[position:]
            else:
                lines[index] = line[:position] + char + line[position + 1 :]
    load_or_recipe_error("\n".join(lines))
