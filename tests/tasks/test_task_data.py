"""The task data formats: rows checked (bad ones named by file and row), labels taken from the
training data, samples tokenized as each task needs, batches collated (decoder inputs, masking)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig
from ditty.data.batching import BatchStream
from ditty.data.build import build_data as build_task_data
from ditty.data.collate import shift_right
from ditty.data.formats.classification import ClassCollator
from ditty.data.labels import LabelSpace
from ditty.data.tokenizer import byte_tokenizer
from tests.tasks.models import wordpiece_tokenizer


@pytest.fixture(scope="module")
def wordpiece():
    return wordpiece_tokenizer()


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def file_data(path, fmt, **fields) -> DataConfig:
    return DataConfig(source="file", path=str(path), format=fmt, max_seq_len=32, val_fraction=0.0, **fields)


def test_classification_labels_come_from_training_and_name_the_classes(tmp_path, wordpiece):
    rows = [{"text": f"the team {i}", "label": label} for i, label in enumerate(["sport", "food", "sport", "music"])]
    data = build_task_data(file_data(write(tmp_path / "t.jsonl", rows), "classification"), wordpiece, 0)
    assert data.labels.names == ("food", "music", "sport")  # sorted names -> ids 0, 1, 2
    assert data.train["labels"] == [2, 0, 2, 1]
    assert set(data.train.column_names) == {"input_ids", "token_type_ids", "attention_mask", "labels"}


def test_a_pretrained_classifiers_label_names_are_kept_when_they_cover_the_data(tmp_path, wordpiece):
    rows = [{"text": "a b", "label": "pos"}, {"text": "c d", "label": "neg"}]
    config = file_data(write(tmp_path / "t.jsonl", rows), "classification")
    data = build_task_data(config, wordpiece, 0, label_hint=["pos", "neu", "neg"])
    assert data.labels.names == ("pos", "neu", "neg") and data.train["labels"] == [0, 2]
    default = build_task_data(config, wordpiece, 0, label_hint=["LABEL_0", "LABEL_1"])
    assert default.labels.names == ("neg", "pos")


def test_integer_labels_are_the_ids_and_a_text_pair_is_encoded_as_a_pair(tmp_path, wordpiece):
    rows = [{"a": "the team", "b": "will score", "y": 2}, {"a": "rain", "b": "fog", "y": 0}]
    config = file_data(
        write(tmp_path / "t.jsonl", rows), "classification", text_column="a", text_pair_column="b", label_column="y"
    )
    data = build_task_data(config, wordpiece, 0)
    assert data.labels.names == ("0", "1", "2") and data.train["labels"] == [2, 0]
    assert 1 in data.train["token_type_ids"][0]  # the second text is segment 1


def test_csv_and_parquet_read_like_jsonl(tmp_path, wordpiece):
    import pandas as pd

    frame = pd.DataFrame({"text": ["the team", "rain fog", "soup"], "label": ["sport", "weather", "food"]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    for name in ("t.csv", "t.parquet"):
        data = build_task_data(file_data(tmp_path / name, "classification"), wordpiece, 0)
        assert data.labels.names == ("food", "sport", "weather") and len(data.train) == 3


def test_bad_rows_are_named_by_file_and_row(tmp_path, wordpiece):
    rows = [
        {"text": "fine", "label": "a"},
        {"text": "", "label": "a"},
        {"label": "b"},
        {"text": "no label"},
    ]
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RecipeError) as error:
        build_task_data(file_data(path, "classification"), wordpiece, 0)
    text = str(error.value)
    assert error.value.problems[0].key == "data.path"
    for row, what in ((2, "'text' is empty"), (3, "'text' is missing"), (4, "'label' is missing")):
        assert f"bad.jsonl:{row}: {what}" in text, text  # one row loader for every format: file:line


def test_a_column_the_format_reads_is_missing_is_an_error_naming_its_key(tmp_path, wordpiece):
    path = write(tmp_path / "data.jsonl", [{"sentence": "fine", "label": "a"}])
    with pytest.raises(RecipeError) as error:
        build_task_data(file_data(path, "classification"), wordpiece, 0)
    assert error.value.problems[0].key == "data.text_column"
    assert "column 'text' is missing from" in str(error.value) and "columns found: sentence, label" in str(error.value)
    data = file_data(path, "classification", text_column="sentence")  # the fix the message names
    assert len(build_task_data(data, wordpiece, 0).train) == 1


def test_data_without_rows_is_an_error_naming_where_it_came_from():
    from datasets import Dataset

    from ditty.data.rows import require_columns

    with pytest.raises(RecipeError) as error:
        require_columns(Dataset.from_list([]), {"data.text_column": "text"}, "the training dataset", "dataset")
    assert error.value.problems[0].key == "dataset"
    assert "the training dataset holds no rows" in str(error.value)


def test_rows_whose_columns_change_type_are_named_by_file_and_line(tmp_path, wordpiece):
    """A column that changes type is caught while the file is read (ditty.data.rows), before the
    task's own checks: one report names every such line."""
    rows = [
        {"text": "fine", "label": "a"},
        {"text": ["a", "list"], "label": "a"},
        {"text": "fine", "label": 1.5},
    ]
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RecipeError) as error:
        build_task_data(file_data(path, "classification"), wordpiece, 0)
    text = str(error.value)
    assert error.value.problems[0].key == "data.path"
    assert "bad.jsonl:2: 'text' is a list here but a string on line 1" in text, text
    assert "bad.jsonl:3: 'label' is a number here but a string on line 1" in text, text


def test_bad_rows_can_be_skipped_and_are_counted(tmp_path, wordpiece):
    rows = [{"text": f"good {i}", "label": "a" if i % 2 else "b"} for i in range(6)]
    rows[1:1] = [{"text": "", "label": "a"}, {"label": "b"}]  # rows 2 and 3 are bad
    path = write(tmp_path / "bad.jsonl", rows)
    config = replace(file_data(path, "classification"), on_bad_rows="skip")
    built = build_task_data(config, wordpiece, 0)
    assert built.skipped_rows == 2
    assert len(built.train) + (len(built.val) if built.val is not None else 0) == 6
    assert built.labels.names == ("a", "b")
    every_row_bad = write(tmp_path / "all_bad.jsonl", [{"text": "", "label": "a"}, {"label": "b"}])
    with pytest.raises(RecipeError, match=r"every row"):
        build_task_data(replace(file_data(every_row_bad, "classification"), on_bad_rows="skip"), wordpiece, 0)


def test_a_validation_label_training_never_saw_is_an_error_naming_the_row(tmp_path, wordpiece):
    train = write(tmp_path / "train.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    val = write(tmp_path / "val.jsonl", [{"text": "c", "label": "x"}, {"text": "d", "label": "z"}])
    config = replace(file_data(train, "classification"), val_path=val)
    with pytest.raises(RecipeError) as error:
        build_task_data(config, wordpiece, 0)
    assert "val.jsonl, row 2: label 'z' never occurs in the training data" in str(error.value)
    assert error.value.problems[0].key == "data.val_path"


def test_token_classification_scores_only_the_first_piece_of_each_word(tmp_path, wordpiece):
    rows = [{"tokens": ["the", "xyzzy", "team"], "tags": ["O", "B", "I"]}]
    data = build_task_data(file_data(write(tmp_path / "t.jsonl", rows), "token_classification"), wordpiece, 0)
    ids, labels = data.train["input_ids"][0], data.train["labels"][0]
    pieces = wordpiece.convert_ids_to_tokens(ids)
    assert pieces[:3] == ["[CLS]", "the", "x"] and pieces[-2:] == ["team", "[SEP]"]
    o, b, i = (data.labels.names.index(t) for t in ("O", "B", "I"))
    # [CLS] the x ##y ##z ##z ##y team [SEP]: one label per word, on its first piece
    assert labels == [-100, o, b, -100, -100, -100, -100, i, -100]


def test_token_classification_rows_need_one_tag_per_word(tmp_path, wordpiece):
    path = write(tmp_path / "t.jsonl", [{"tokens": ["a", "b"], "tags": ["O"]}])
    with pytest.raises(RecipeError, match=r"t.jsonl:1: 2 words but 1 tags"):
        build_task_data(file_data(path, "token_classification"), wordpiece, 0)


def test_seq2seq_targets_end_with_eos_and_the_decoder_reads_them_shifted(tmp_path):
    tokenizer = byte_tokenizer()
    path = write(tmp_path / "t.jsonl", [{"source": "rev abc=", "target": "cba"}, {"source": "x", "target": "yz"}])
    data = build_task_data(file_data(path, "seq2seq"), tokenizer, 0, decoder_start_token_id=0)
    assert data.train["labels"][0][-1] == tokenizer.eos_token_id
    batch = data.collator([data.train[0], data.train[1]])
    assert batch["labels"].shape == batch["decoder_input_ids"].shape
    assert (batch["decoder_input_ids"][:, 0] == 0).all()
    assert torch.equal(batch["decoder_input_ids"][0, 1:], batch["labels"][0, :-1].clamp_min(0))
    assert (batch["labels"][1, len(data.train[1]["labels"]) :] == -100).all()  # padded targets score nothing
    assert torch.equal(shift_right(torch.tensor([[5, -100]]), 9, 0), torch.tensor([[9, 5]]))


def test_masked_lm_masks_by_bert_rule_and_the_same_sample_the_same_way_in_any_batch(tmp_path, wordpiece):
    text = " ".join(["the team will score again"] * 4)
    rows = [{"text": text}, {"text": "rain"}, {"text": text + " today"}]
    config = replace(file_data(write(tmp_path / "t.jsonl", rows), "masked_lm", mask_probability=0.5), max_seq_len=64)
    data = build_task_data(config, wordpiece, 0)
    together = data.collator([data.train[0], data.train[1]], positions=[7, 8])
    alone = data.collator([data.train[0]], positions=[7])
    width = alone["input_ids"].shape[1]
    assert torch.equal(together["input_ids"][0, :width], alone["input_ids"][0])  # padding changes nothing
    assert torch.equal(together["labels"][0, :width], alone["labels"][0])
    labels, original = alone["labels"][0], torch.tensor(data.train[0]["input_ids"])
    masked = labels != -100
    assert masked.any() and not masked[0] and not masked[-1]  # [CLS] and [SEP] are never masked
    assert torch.equal(labels[masked], original[masked])
    assert (alone["input_ids"][0][masked] == wordpiece.mask_token_id).float().mean() > 0.5
    other = data.collator([data.train[0]], positions=[9])
    assert not torch.equal(other["labels"], alone["labels"])  # another position in the order, another mask


def test_masked_lm_needs_a_mask_token(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"text": "abc"}])
    with pytest.raises(RecipeError, match="needs a tokenizer with a mask token"):
        build_task_data(file_data(path, "masked_lm"), byte_tokenizer(), 0)


def test_the_builtin_topics_dataset_holds_out_whole_sentences(wordpiece):
    config = DataConfig(source="builtin", name="topics", format="classification", num_samples=400, val_fraction=0.1)
    data = build_task_data(config, wordpiece, 0)
    assert data.labels.names == ("food", "music", "sport", "weather")
    train_texts = {tuple(ids) for ids in data.train["input_ids"]}
    assert len(data.val) > 0 and not any(tuple(ids) in train_texts for ids in data.val["input_ids"])
    with pytest.raises(RecipeError, match="cannot be read as"):
        build_task_data(replace(config, name="addition"), wordpiece, 0)


def test_the_task_stream_order_does_not_depend_on_the_world_size(tmp_path, wordpiece):
    rows = [{"text": f"word {i} " * (1 + i % 5), "label": str(i % 3)} for i in range(24)]
    data = build_task_data(file_data(write(tmp_path / "t.jsonl", rows), "classification"), wordpiece, 0)

    def labels_of(world, micro):
        streams = [
            BatchStream(data.train, collator=data.collator, global_batch_size=8, micro_batch_size=micro, rank=r,
                        world_size=world, seed=3)
            for r in range(world)
        ]  # fmt: skip
        return [torch.cat([b["labels"] for s in streams for b in s.next_step()]).tolist() for _ in range(4)]

    assert labels_of(1, 8) == labels_of(2, 4) == labels_of(2, 2)


def test_label_space_round_trips_through_json():
    space = LabelSpace.from_values({2, 0})
    assert space.names == ("0", "1", "2") and space.id_of(1) is None and space.id_of(2) == 2
    assert LabelSpace.from_json(json.loads(json.dumps(space.to_json()))) == space


def test_collator_pads_classification_labels_as_one_per_sample():
    collate = ClassCollator(pad_token_id=0)
    batch = collate([{"input_ids": [1, 2, 3], "labels": 1}, {"input_ids": [4], "labels": 0}])
    assert batch["labels"].tolist() == [1, 0] and batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
