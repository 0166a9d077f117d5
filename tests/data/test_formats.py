"""Sources and formats: every file type loads, masks put the loss where it belongs, truncation keeps
the start, tokenization is cached, and every bad input is a RecipeError naming its key."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig
from ditty.data.build import build_data
from ditty.data.tokenizer import byte_tokenizer

ROWS = [{"prompt": f"{a}+{a}=", "completion": str(2 * a)} for a in range(10, 30)]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _write(path, rows, kind):
    if kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        import csv

        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _file_config(path, **fields) -> DataConfig:
    return DataConfig(source="file", path=path, val_fraction=0, **fields)


def _supervised_text(sample, tokenizer) -> str:
    return tokenizer.decode([label for label in sample["labels"] if label != -100])


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_each_file_format_loads_as_prompt_completion(tmp_path, tokenizer, kind):
    path = _write(tmp_path / f"data.{kind}", ROWS, kind)
    train = build_data(_file_config(path), tokenizer, seed=0).train
    assert len(train) == len(ROWS)
    sample = train[0]
    assert tokenizer.decode(sample["input_ids"]) == "<s>10+10=20</s>"
    # The loss sees the completion and its eos only.
    assert _supervised_text(sample, tokenizer) == "20</s>"


def test_text_files_and_glob_patterns_load_with_loss_on_every_token(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n")
    (tmp_path / "b.txt").write_text("third line\n")
    train = build_data(_file_config(str(tmp_path / "*.txt"), format="text"), tokenizer, seed=0).train
    assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in train["input_ids"]] == [
        "first line",
        "second line",
        "third line",
    ]
    sample = train[0]
    assert sample["labels"][0] == -100  # nothing predicts the first token
    assert sample["labels"][1:] == sample["input_ids"][1:]
    assert sample["input_ids"][-1] == tokenizer.eos_token_id


def test_chat_loss_only_on_assistant_turns(tmp_path, tokenizer):
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ciao"},
    ]
    path = _write(tmp_path / "chat.jsonl", [{"messages": conversation}], "jsonl")
    sample = build_data(_file_config(path, format="chat"), tokenizer, seed=0).train[0]
    rendered = "<s>user: hi\nassistant: hello</s>\nuser: bye\nassistant: ciao</s>\n"
    assert tokenizer.decode(sample["input_ids"]) == rendered
    assert _supervised_text(sample, tokenizer) == "hello</s>ciao</s>"


def test_chat_without_generation_markers_finds_assistant_turns_by_prefix(tmp_path, tokenizer):
    plain = byte_tokenizer()
    plain.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ciao"},
    ]
    path = _write(tmp_path / "chat.jsonl", [{"messages": conversation}], "jsonl")
    sample = build_data(_file_config(path, format="chat"), plain, seed=0).train[0]
    assert _supervised_text(sample, plain) == "hello</s>ciao</s>"


def test_truncation_keeps_the_first_max_seq_len_tokens(tmp_path, tokenizer):
    path = _write(tmp_path / "long.jsonl", [{"prompt": "ab=", "completion": "0123456789"}], "jsonl")
    sample = build_data(_file_config(path, max_seq_len=8), tokenizer, seed=0).train[0]
    assert tokenizer.decode(sample["input_ids"]) == "<s>ab=0123"
    assert len(sample["labels"]) == 8


def test_samples_without_a_token_to_learn_are_dropped(tmp_path, tokenizer):
    rows = [{"prompt": "a long prompt that fills everything=", "completion": "x"}, {"prompt": "1=", "completion": "1"}]
    path = _write(tmp_path / "mixed.jsonl", rows, "jsonl")
    train = build_data(_file_config(path, max_seq_len=10), tokenizer, seed=0).train
    assert len(train) == 1


def test_validation_from_a_file_or_a_seeded_fraction(tmp_path, tokenizer):
    path = _write(tmp_path / "train.jsonl", ROWS, "jsonl")
    val_path = _write(tmp_path / "val.jsonl", ROWS[:3], "jsonl")
    assert len(build_data(_file_config(path, val_path=val_path), tokenizer, seed=0).val) == 3

    by_fraction = replace(_file_config(path), val_fraction=0.25)
    first = build_data(by_fraction, tokenizer, seed=0)
    assert (len(first.train), len(first.val)) == (15, 5)
    assert build_data(by_fraction, tokenizer, seed=0).val["input_ids"] == first.val["input_ids"]
    assert build_data(by_fraction, tokenizer, seed=1).val["input_ids"] != first.val["input_ids"]
    assert build_data(replace(by_fraction, shuffle_seed=1), tokenizer, seed=0).seed == 1


def test_tokenization_is_cached_in_cache_dir(tmp_path, tokenizer):
    path = _write(tmp_path / "train.jsonl", ROWS, "jsonl")
    config = replace(_file_config(path), cache_dir=str(tmp_path / "cache"))
    first = build_data(config, tokenizer, seed=0).train
    second = build_data(config, byte_tokenizer(), seed=0).train
    assert first.cache_files and all(f["filename"].startswith(str(tmp_path / "cache")) for f in first.cache_files)
    assert second.cache_files == first.cache_files  # the second build read the first one's result


def _expect_recipe_error(config, tokenizer, key, *words):
    with pytest.raises(RecipeError) as caught:
        build_data(config, tokenizer, seed=0)
    message = str(caught.value)
    assert f"`{key}`" in message
    for word in words:
        assert word in message
    return message


def test_bad_inputs_are_recipe_errors_naming_the_key(tmp_path, tokenizer):
    good = _write(tmp_path / "good.jsonl", ROWS, "jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    (tmp_path / "data.xml").write_text("<a/>")

    _expect_recipe_error(_file_config(str(tmp_path / "nope.jsonl")), tokenizer, "data.path", "no file matches")
    _expect_recipe_error(_file_config(str(empty)), tokenizer, "data.path", "empty")
    _expect_recipe_error(_file_config(str(tmp_path / "data.xml")), tokenizer, "data.path", ".xml")
    _expect_recipe_error(
        _file_config(good, completion_column="answer"), tokenizer, "data.completion_column", "prompt, completion"
    )
    _expect_recipe_error(_file_config(good, format="chat"), tokenizer, "data.messages_column", "columns found")
    _expect_recipe_error(_file_config(good, max_seq_len=4), tokenizer, "data.max_seq_len")
    _expect_recipe_error(_file_config(good, val_path=str(tmp_path / "missing.jsonl")), tokenizer, "data.val_path")
    _expect_recipe_error(replace(_file_config(good), val_fraction=0.99), tokenizer, "data.val_fraction")


def test_chat_format_with_a_tokenizer_without_chat_template_is_a_recipe_error(tmp_path):
    plain = byte_tokenizer()
    plain.chat_template = None
    path = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}], "jsonl")
    _expect_recipe_error(_file_config(path, format="chat"), plain, "data.format", "chat template")


def test_a_hub_dataset_offline_is_a_recipe_error(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _expect_recipe_error(DataConfig(source="hub", name="ditty-test/no-such-dataset"), tokenizer, "data.name", "offline")


def test_a_missing_column_names_the_file_and_whether_it_is_the_held_out_one(tmp_path, tokenizer):
    """The column error says which data lacks it: the training file, or the data.val_path file."""
    import json

    train = tmp_path / "pc.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(8)))
    held = tmp_path / "held.jsonl"
    held.write_text('{"text": "a"}\n{"text": "b"}\n')
    config = DataConfig(source="file", path=str(train), val_path=str(held), format="prompt_completion")
    _expect_recipe_error(config, tokenizer, "data.prompt_column", f"is missing from the held-out rows of '{held}'")
    config = DataConfig(source="file", path=str(held), format="prompt_completion", val_fraction=0)
    _expect_recipe_error(config, tokenizer, "data.prompt_column", f"is missing from '{held}' (data.path)")


def test_a_text_file_s_blank_lines_are_bad_rows_and_its_byte_order_mark_is_not_text(tmp_path, tokenizer):
    """A blank line would train a sample of no text: a bad row named by line (or skipped and counted);
    a byte-order mark (Windows editors write one) is not the first sample's first character."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xef\xbb\xbffirst line\r\n\r\nsecond line\r\n\n")
    _expect_recipe_error(_file_config(str(path), format="text"), tokenizer, "data.path", f"{path}:2: blank line")
    config = replace(_file_config(str(path), format="text"), on_bad_rows="skip")
    bundle = build_data(config, tokenizer, seed=0)
    texts = sorted(tokenizer.decode(ids, skip_special_tokens=True) for ids in bundle.train["input_ids"])
    assert texts == ["first line", "second line"] and bundle.skipped_rows == 1
    path.write_bytes(b"\xef\xbb\xbffirst line\nsecond line\n")
    train = build_data(_file_config(str(path), format="text"), tokenizer, seed=0).train
    assert sorted(tokenizer.decode(ids, skip_special_tokens=True) for ids in train["input_ids"]) == texts
