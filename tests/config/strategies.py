"""Hypothesis strategies that draw valid values for any config class, read from its type hints."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from hypothesis import strategies as st

from ditty.config.schema import field_types, is_config_class

# Text TOML can hold: no surrogates (not encodable as UTF-8).
toml_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
toml_keys = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)
toml_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
toml_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
toml_scalars = st.one_of(st.booleans(), toml_ints, toml_floats, toml_text)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(toml_keys, inner, max_size=3)),
    max_leaves=6,
)


def for_type(tp: Any) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if is_config_class(tp):
        return config_strategy(tp)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([st.none() if a is type(None) else for_type(a) for a in args])
    if origin is list:
        return st.lists(for_type(args[0]), max_size=3)
    if origin is tuple:
        return st.tuples(*(for_type(a) for a in args))
    if origin is dict:
        return st.dictionaries(toml_keys, toml_values, max_size=3)
    return {bool: st.booleans(), int: toml_ints, float: toml_floats, str: toml_text}[tp]


def config_strategy(cls: type) -> st.SearchStrategy:
    types_ = field_types(cls)
    return st.builds(cls, **{f.name: for_type(types_[f.name]) for f in dataclasses.fields(cls)})
