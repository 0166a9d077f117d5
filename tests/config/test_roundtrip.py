"""`ditty init` output loads back into an identical config, for any valid config."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import HealthCheck, given, settings

from ditty.config import TrainerConfig
from ditty.config.loader import from_config, parse_recipe
from ditty.config.overrides import apply_overrides
from ditty.config.schema import walk_leaves
from ditty.config.writer import format_value, recipe_to_toml
from tests.config.strategies import config_strategy

KIND_FIELDS = [leaf for leaf in walk_leaves(TrainerConfig) if typing.get_origin(leaf.type) is typing.Literal]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_strategy(TrainerConfig))
def test_write_then_load_is_identity(config):
    assert parse_recipe(recipe_to_toml(config)).config == config


@pytest.mark.parametrize("leaf", KIND_FIELDS, ids=lambda leaf: leaf.path)
def test_every_choice_of_every_kind_round_trips(leaf):
    from ditty.config.overrides import replace_path

    for choice in typing.get_args(leaf.type):
        config = replace_path(TrainerConfig(), leaf.path, choice)
        assert parse_recipe(recipe_to_toml(config)).config == config


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_strategy(TrainerConfig))
def test_flags_reach_every_field(config):
    """Setting each field that differs from the default by a flag gives the same config."""
    default = TrainerConfig()
    flags = []
    for leaf in walk_leaves(TrainerConfig):
        value, base = config, default
        for part in leaf.path.split("."):
            value, base = getattr(value, part), getattr(base, part)
        if value != base and value is not None:
            flags += [f"--{leaf.path}", format_value(value)]
        elif value is None and base is not None:
            pytest.skip("TOML has no null: an optional field is unset by omission only")
    assert apply_overrides(from_config(default), flags).config == config


def test_optional_fields_default_to_none():
    """An unset optional field is written as a comment; that only round-trips if None is its default."""
    for leaf in walk_leaves(TrainerConfig):
        if type(None) in typing.get_args(leaf.type):
            assert leaf.default is None, leaf.path


def test_every_field_is_documented():
    for leaf in walk_leaves(TrainerConfig):
        assert leaf.doc, f"{leaf.path} has no docstring (it becomes --help and `ditty init` text)"
    for field in dataclasses.fields(TrainerConfig):
        assert field.name in recipe_to_toml(TrainerConfig())


def test_a_key_ending_in_a_newline_is_quoted():
    # Found by the round-trip property: `^...$` accepted "0\n" as a bare key.
    from ditty.config import TrainerConfig
    from ditty.config.loader import parse_recipe
    from ditty.config.sections import ModelConfig
    from ditty.config.writer import recipe_to_toml

    config = TrainerConfig(model=ModelConfig(factory_kwargs={"0\n": []}))
    assert parse_recipe(recipe_to_toml(config, comments=False)).config.model.factory_kwargs == {"0\n": []}
