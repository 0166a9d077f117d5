"""The preference formats: only completion tokens are scored, each completion ends with eos, chat
messages go through the chat template, bad rows are named by file and line, and mixtures, held-out
sets and streams read pairs like any other format."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig, DataSourceConfig
from ditty.data.build import build_data, build_stream
from ditty.data.tokenizer import byte_tokenizer

PAIRS = [{"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": str(2 * a + 1)} for a in range(10, 30)]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _scored(ids, labels, tokenizer):
    return tokenizer.decode([label for label in labels if label != -100])


def test_pairs_score_only_completions_ending_with_eos(tmp_path, tokenizer):
    data = DataConfig(source="file", path=_jsonl(tmp_path / "p.jsonl", PAIRS), format="preference", val_fraction=0)
    bundle = build_data(data, tokenizer, seed=0)
    sample = bundle.train[0]
    assert tokenizer.decode(sample["input_ids"]) == "<s>10+10=20</s>"
    assert _scored(sample["input_ids"], sample["labels"], tokenizer) == "20</s>"
    assert _scored(sample["rejected_input_ids"], sample["rejected_labels"], tokenizer) == "21</s>"
    batch = bundle.collator([bundle.train[0], bundle.train[1]])
    assert batch["input_ids"].shape[0] == 4  # chosen rows, then rejected rows: one forward
    assert tokenizer.decode(batch["input_ids"][2][batch["attention_mask"][2].bool()]) == "<s>10+10=21</s>"
    assert int(bundle.collator.supervised_count(batch)) == 2  # the denominator is pairs


def test_chat_pairs_render_with_the_chat_template(tmp_path, tokenizer):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    rows = [
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "assistant", "content": "hello"}],
            "rejected": [{"role": "assistant", "content": "go away"}],
        }
    ]
    data = DataConfig(source="file", path=_jsonl(tmp_path / "c.jsonl", rows), format="preference", val_fraction=0)
    sample = build_data(data, tokenizer, seed=0).train[0]
    assert tokenizer.decode(sample["input_ids"]).startswith("<user>hi\n<assistant>hello")
    assert _scored(sample["input_ids"], sample["labels"], tokenizer) == "hello\n</s>"
    assert _scored(sample["rejected_input_ids"], sample["rejected_labels"], tokenizer) == "go away\n</s>"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "1+1=", "chosen": "2"}, "'rejected' is missing"),
        ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "'chosen' equals 'rejected'"),
        ({"prompt": "1+1=", "chosen": "", "rejected": "3"}, "'chosen' is empty"),
    ],
)
def test_bad_pairs_are_named_by_file_and_line(tmp_path, tokenizer, row, reason):
    path = _jsonl(tmp_path / "bad.jsonl", PAIRS[:3] + [row] + PAIRS[3:])
    data = DataConfig(source="file", path=path, format="preference", val_fraction=0)
    with pytest.raises(RecipeError) as caught:
        build_data(data, tokenizer, seed=0)
    message = str(caught.value)
    assert f"{path}:4" in message and reason in message
    skipped = build_data(
        DataConfig(source="file", path=path, format="preference", val_fraction=0, on_bad_rows="skip"), tokenizer, seed=0
    )
    assert len(skipped.train) == len(PAIRS) and skipped.skipped_rows == 1


def test_unpaired_examples_carry_their_label(tmp_path, tokenizer):
    rows = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "1+1=", "completion": "3", "label": False}]
    data = DataConfig(
        source="file", path=_jsonl(tmp_path / "u.jsonl", rows), format="unpaired_preference", val_fraction=0
    )
    bundle = build_data(data, tokenizer, seed=0)
    batch = bundle.collator([bundle.train[0], bundle.train[1]])
    assert batch["label"].tolist() == [1, 0] and batch["input_ids"].shape[0] == 2
    bad = _jsonl(tmp_path / "b.jsonl", rows + [{"prompt": "1+1=", "completion": "3", "label": "yes"}])
    with pytest.raises(RecipeError, match=r"b\.jsonl:3"):
        build_data(DataConfig(source="file", path=bad, format="unpaired_preference", val_fraction=0), tokenizer, seed=0)


def test_unpaired_examples_from_csv_take_their_text_labels(tmp_path, tokenizer):
    """A CSV cell is text: "true"/"false" labels are read as booleans ("false" is not desirable), and
    cells such as "None" or "N/A" stay the text they are instead of becoming empty completions."""
    path = tmp_path / "kto.csv"
    path.write_text("prompt,completion,label\n1+1=,2,true\nIs it one?,N/A,False\nNone,3,false\n")
    data = DataConfig(source="file", path=str(path), format="unpaired_preference", val_fraction=0)
    bundle = build_data(data, tokenizer, seed=0)
    batch = bundle.collator([bundle.train[i] for i in range(3)])
    assert batch["label"].tolist() == [1, 0, 0]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in batch["input_ids"]]
    assert texts[1].startswith("Is it one?N/A") and texts[2].startswith("None3"), texts


def test_held_out_pairs_and_a_mixture_of_pair_files(tmp_path, tokenizer):
    first = _jsonl(tmp_path / "a.jsonl", PAIRS)
    second = _jsonl(tmp_path / "b.jsonl", [dict(p, prompt="x" + p["prompt"]) for p in PAIRS])
    held = _jsonl(tmp_path / "v.jsonl", PAIRS[:4])
    data = DataConfig(
        format="preference",
        sources=[
            DataSourceConfig(source="file", path=first, name="a", weight=1.0, val_path=held),
            DataSourceConfig(source="file", path=second, name="b", weight=1.0),
        ],
    )
    bundle = build_data(data, tokenizer, seed=0)
    assert dict(bundle.val_sets)["a"].num_rows == 4
    stream = build_stream(bundle, data, global_batch_size=4, micro_batch_size=2, rank=0, world_size=1)
    micro = stream.next_step()
    assert len(micro) == 2 and micro[0]["input_ids"].shape[0] == 4  # 2 pairs -> 4 rows
    assert int(bundle.collator.supervised_count(micro[0])) == 2


def test_builtin_addition_pairs_reject_a_wrong_sum(tokenizer):
    data = DataConfig(source="builtin", name="addition", num_samples=200, format="preference")
    bundle = build_data(data, tokenizer, seed=0)
    sample = bundle.train[0]
    chosen = _scored(sample["input_ids"], sample["labels"], tokenizer).removesuffix("</s>")
    rejected = _scored(sample["rejected_input_ids"], sample["rejected_labels"], tokenizer).removesuffix("</s>")
    prompt = tokenizer.decode(sample["input_ids"]).removeprefix("<s>").split("=")[0]
    a, b = map(int, prompt.split("+"))
    assert int(chosen) == a + b and int(rejected) != a + b
    assert bundle.task is not None and bundle.val is not None  # held-out problems: exact match and val pairs


def test_streamed_pairs_with_workers(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "s.jsonl", PAIRS)
    data = DataConfig(source="file", path=path, format="preference", streaming=True, num_workers=1, val_fraction=0)
    bundle = build_data(data, tokenizer, seed=0)
    stream = build_stream(bundle, data, global_batch_size=2, micro_batch_size=2, rank=0, world_size=1)
    (batch,) = stream.next_step()
    assert batch["input_ids"].shape[0] == 4 and int(bundle.collator.supervised_count(batch)) == 2


def _chatml(tokenizer_factory=byte_tokenizer):
    from ditty.data.chat_templates import CHATML

    tokenizer = tokenizer_factory()
    tokenizer.chat_template = CHATML
    return tokenizer


def _turn(role, content):
    return {"role": role, "content": content}


CHAT_PAIR = {
    "prompt": [_turn("user", "hi")],
    "chosen": [_turn("assistant", "hello")],
    "rejected": [_turn("assistant", "go")],
}


def test_a_bad_chat_pair_is_named_by_file_and_line_and_skipped_with_skip(tmp_path):
    bad = [
        ({**CHAT_PAIR, "chosen": [_turn("wizard", "abracadabra")]}, "has the role 'wizard'"),
        ({**CHAT_PAIR, "rejected": [_turn("assistant", 5)]}, "'rejected' message 0 has 'content' a number, not text"),
        ({**CHAT_PAIR, "chosen": [_turn("user", "q"), _turn("assistant", "a")]}, "'chosen' starts with a user turn"),
    ]
    rows = [CHAT_PAIR, bad[0][0], CHAT_PAIR, bad[1][0], bad[2][0], CHAT_PAIR]
    path = _jsonl(tmp_path / "chat_pairs.jsonl", rows)
    data = DataConfig(source="file", path=path, format="preference", val_fraction=0)
    with pytest.raises(RecipeError) as caught:
        build_data(data, _chatml(), seed=0)
    message = str(caught.value)
    for line, (_, reason) in zip((2, 4, 5), bad):
        assert f"{path}:{line}: " in message and reason in message, (line, message)
    skipped = build_data(DataConfig(**{**data.__dict__, "on_bad_rows": "skip"}), _chatml(), seed=0)
    assert len(skipped.train) == 3 and skipped.skipped_rows == 3


def test_conversational_pairs_without_a_prompt_column_take_their_shared_turns_as_the_prompt(tmp_path):
    # TRL's implicit-prompt form: chosen and rejected are whole conversations that share their start.
    start = [_turn("system", "be brief"), _turn("user", "2+2?")]
    implicit = {"chosen": [*start, _turn("assistant", "4")], "rejected": [*start, _turn("assistant", "5")]}
    explicit = {"prompt": start, "chosen": [_turn("assistant", "4")], "rejected": [_turn("assistant", "5")]}
    tokenizer = _chatml()
    read = {}
    for name, row in (("implicit", implicit), ("explicit", explicit)):
        data = DataConfig(source="file", path=_jsonl(tmp_path / f"{name}.jsonl", [row] * 2), format="preference")
        read[name] = build_data(replace(data, val_fraction=0), tokenizer, seed=0).train[0]
    assert read["implicit"] == read["explicit"]
    given = DataConfig(format="preference", val_fraction=0)  # rows from Python (or parquet): checked as a table
    assert build_data(given, tokenizer, seed=0, rows=[implicit] * 2).train[0] == read["explicit"]
    assert _scored(read["implicit"]["input_ids"], read["implicit"]["labels"], tokenizer).startswith("4<|im_end|>")
    no_shared = {"chosen": [_turn("user", "a"), _turn("assistant", "4")], "rejected": [_turn("user", "b")]}
    path = _jsonl(tmp_path / "no_shared.jsonl", [implicit, no_shared])
    with pytest.raises(RecipeError) as caught:
        build_data(DataConfig(source="file", path=path, format="preference", val_fraction=0), tokenizer, seed=0)
    assert f"{path}:2: " in str(caught.value) and "share no turn" in str(caught.value)


def test_pairs_that_are_the_same_once_cut_to_max_seq_len_are_bad_rows(tmp_path, tokenizer):
    # 29 prompt bytes and BOS, then 10 bytes both completions share: 40 tokens alike, then they differ.
    long = {"prompt": "What is ten plus ten? Think: ", "chosen": "so twenty exactly", "rejected": "so twenty maybe"}
    path = _jsonl(tmp_path / "p.jsonl", PAIRS[:5] + [long] + PAIRS[5:])
    data = DataConfig(source="file", path=path, format="preference", val_fraction=0, max_seq_len=40)
    with pytest.raises(RecipeError) as caught:
        build_data(data, tokenizer, seed=0)
    (problem,) = caught.value.problems
    assert problem.key == "data.max_seq_len"
    assert "1 of 21 samples of data.path cannot be used once cut to data.max_seq_len = 40 tokens" in problem.message
    assert "the pair's two sides are the same ('What is ten plus ten?" in problem.message
    skipped = build_data(replace(data, on_bad_rows="skip"), tokenizer, seed=0)
    assert len(skipped.train) == 20 and skipped.skipped_rows == 1
    assert all(s["input_ids"] != s["rejected_input_ids"] for s in skipped.train)
