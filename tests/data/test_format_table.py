"""The one table of data formats: every `data.format` the recipe accepts is one `DataFormat` object,
and every format answers the same questions (columns, row check, encoder, collator)."""

from __future__ import annotations

import typing

from ditty.config.sections import DataConfig, DataFormat
from ditty.data.formats import FORMATS
from ditty.data.formats.base import Collator
from ditty.data.rows import RowCheck, row_problem
from ditty.data.tokenizer import byte_tokenizer
from ditty.models.tasks import TASKS


def test_the_recipe_accepts_exactly_the_formats_of_the_table():
    # A built-in-only format (the digits' images) is implied by data.name, never written as data.format.
    nameable = {name for name, fmt in FORMATS.items() if not fmt.builtin_only}
    assert set(typing.get_args(DataFormat)) == nameable
    assert {fmt for task in TASKS.values() for fmt in task.data_formats} == nameable
    assert set(FORMATS) - nameable == {"images"}


def test_every_format_names_its_columns_checks_a_row_and_collates():
    tokenizer = byte_tokenizer()
    for name, fmt in FORMATS.items():
        data = DataConfig(format=name)
        columns = fmt.columns(data)
        assert columns and all(key.startswith("data.") for key in columns), name
        check = fmt.row_check(data)
        assert isinstance(check, RowCheck) and set(check.fields) <= set(columns.values()) | {data.text_column}, name
        assert row_problem({}, check) is not None, name  # a row without the format's columns is bad
        assert isinstance(fmt.collator(tokenizer, data, seed=0, decoder_start_token_id=0), Collator), name
        # causal-LM rows pack; preference samples (a pair, or an example whose label weights it) do not,
        # and prompts (format "prompt", for [rl]) are generated from, not packed
        unpacked = name in ("preference", "unpaired_preference", "prompt")
        assert fmt.packable == (name in TASKS["causal-lm"].data_formats and not unpacked), name
