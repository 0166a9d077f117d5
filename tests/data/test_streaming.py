"""data.streaming: readers share every row once per pass, a position resumes exactly (windows,
passes, workers, ranks), and positions of another split are refused with the reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig, DataSourceConfig
from ditty.data.build import build_data, build_stream
from ditty.data.mixture import resolve_sources
from ditty.data.streaming import SourceReader, StreamingData
from ditty.data.tokenizer import byte_tokenizer

TOKENIZER = byte_tokenizer()


def _write(path: Path, rows: int, tag: str, column: str = "text") -> str:
    lines = [json.dumps({column: f"{tag} {i} " + "x" * (i % 13)}) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def corpus(tmp_path) -> Path:
    for part, rows in enumerate((37, 42, 47)):
        _write(tmp_path / f"web-{part}.jsonl", rows, f"web{part}")
    _write(tmp_path / "code.jsonl", 61, "code")
    return tmp_path


def _data(corpus: Path, **changes) -> DataConfig:
    sources = [
        DataSourceConfig(path=str(corpus / "web-*.jsonl"), weight=0.7, name="web"),
        DataSourceConfig(path=str(corpus / "code.jsonl"), weight=0.3, name="code"),
    ]
    settings = dict(format="text", max_seq_len=40, packing=True, streaming=True, shuffle_buffer_size=8, sources=sources)
    return DataConfig(**{**settings, **changes})


def _reader(data: DataConfig, source: int, reader: int, readers: int) -> SourceReader:
    resolved = resolve_sources(data)
    spec = StreamingData(tuple(resolved), TOKENIZER, window=data.shuffle_buffer_size)
    return SourceReader(resolved[source], spec, reader=reader, readers=readers, seed=3)


def _text(sample) -> str:
    return TOKENIZER.decode(sample["input_ids"], skip_special_tokens=True)


def _one_pass(reader: SourceReader) -> list[str]:
    texts = []
    while True:
        sample = reader.take()
        if reader.epoch > 0:
            return texts
        texts.append(_text(sample))


@pytest.mark.parametrize("readers", [1, 2, 3, 4])
def test_readers_share_every_row_once_per_pass(corpus, readers):
    """3 files split by file for 1 and 3 readers, by row for 2 and 4; either way no gap, no overlap."""
    data = _data(corpus)
    for source, expected in ((0, 37 + 42 + 47), (1, 61)):
        seen = [text for r in range(readers) for text in _one_pass(_reader(data, source, r, readers))]
        assert len(seen) == len(set(seen)) == expected


def _as(path: Path, suffix: str) -> str:
    """The JSONL rows of `path` rewritten as a .csv, .parquet or .txt file (one text per line)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    target = path.with_suffix(suffix)
    if suffix == ".txt":
        target.write_text("\n".join(texts) + "\n")
    elif suffix == ".csv":
        pyarrow.csv.write_csv(pa.table({"text": texts}), target)
    else:
        pyarrow.parquet.write_table(pa.table({"text": texts}), target, row_group_size=16)
    return str(target)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".txt"])
def test_a_reader_resumes_exactly_inside_windows_and_across_passes(corpus, suffix):
    path = str(corpus / "code.jsonl") if suffix == ".jsonl" else _as(corpus / "code.jsonl", suffix)
    data = _data(corpus, sources=[DataSourceConfig(path=path)])
    reader = _reader(data, 0, 0, 1)
    states, texts = [], []
    for _ in range(150):  # 61 rows a pass: past two pass boundaries
        states.append(json.loads(json.dumps(reader.state_dict())))
        texts.append(_text(reader.take()))
    assert texts[:61] != texts[61:122] and sorted(texts[:61]) == sorted(texts[61:122])  # each pass reshuffled
    for start in (0, 1, 7, 8, 9, 60, 61, 62, 130):
        again = _reader(data, 0, 0, 1)
        again.load_state_dict(states[start])
        assert [_text(again.take()) for _ in range(10)] == texts[start : start + 10], start


def _stream(data: DataConfig, **geometry):
    bundle = build_data(data, TOKENIZER, seed=11)
    settings = dict(global_batch_size=4, micro_batch_size=2, rank=0, world_size=1)
    return build_stream(bundle, data, **{**settings, **geometry})


def _equal(steps, others) -> bool:
    return all(
        a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
        for step, other in zip(steps, others)
        for a, b in zip(step, other)
    )


def test_a_worker_gives_what_the_trainer_process_reads_and_workers_resume_from_what_was_consumed(corpus):
    data = _data(corpus)
    inline = _stream(data)
    expected = [inline.next_step() for _ in range(30)]
    one_worker = _stream(replace(data, num_workers=1))
    assert _equal([one_worker.next_step() for _ in range(30)], expected)
    assert one_worker.source_tokens() == inline.source_tokens()
    tokens = inline.source_tokens()
    assert abs(tokens["web"] / sum(tokens.values()) - 0.7) < 0.02

    two = _stream(replace(data, num_workers=2, prefetch_factor=3))
    before = torch.random.get_rng_state()
    reference = [two.next_step() for _ in range(25)]
    assert torch.equal(torch.random.get_rng_state(), before)  # workers draw nothing from torch's global RNG
    for stop in (0, 5, 12):
        run = _stream(replace(data, num_workers=2, prefetch_factor=3))
        head = [run.next_step() for _ in range(stop)]
        state = json.loads(json.dumps(run.state_dict()))  # the checkpoint sidecar is JSON
        run.close()
        resumed = _stream(replace(data, num_workers=2))
        resumed.load_state_dict(state)
        assert _equal(head + [resumed.next_step() for _ in range(25 - stop)], reference), stop


def test_a_position_of_another_split_is_refused_with_the_reason(corpus):
    data = _data(corpus)
    state = _stream(data).state_dict()
    with pytest.raises(RecipeError) as error:
        _stream(replace(data, num_workers=2)).load_state_dict(state)
    assert "1 rank(s) x 1 reader(s)" in str(error.value) and "data.num_workers = 0" in error.value.problems[0].fix
    moved = {**state, "world_size": 2, "ranks": state["ranks"] * 2}
    with pytest.raises(RecipeError, match="2 rank\\(s\\)"):
        _stream(data).load_state_dict(moved)
    with pytest.raises(RecipeError, match="global sample cursor"):
        _stream(data).load_state_dict({"cursor": 8, "seed": 11, "num_samples": 100})


def test_stream_errors_name_the_source(corpus, tmp_path):
    _write(tmp_path / "other.jsonl", 20, "o", column="body")
    data = replace(
        _data(corpus), sources=[DataSourceConfig(path=str(tmp_path / "other.jsonl"), weight=1.0, name="odd")]
    )
    with pytest.raises(RecipeError) as missing:
        _stream(data).next_step()
    assert missing.value.problems[0].key == "data.sources.0.text_column" and "'text'" in str(missing.value)
    _write(tmp_path / "two.jsonl", 2, "t")
    tiny = _data(tmp_path, sources=[DataSourceConfig(path=str(tmp_path / "two.jsonl"))])
    with pytest.raises(RecipeError, match="gave reader 2 of 4 no sample"):
        _reader(tiny, 0, 2, 4).take()


def _two_ranks(rank: int, world: int, corpus: str) -> list:
    data = _data(Path(corpus))
    stream = _stream(data, rank=rank, world_size=world, micro_batch_size=1)
    head = [stream.next_step() for _ in range(6)]
    state = stream.state_dict()  # gathered from both ranks
    tokens = stream.source_tokens()  # summed over both ranks
    tail = [stream.next_step() for _ in range(4)]
    resumed = _stream(data, rank=rank, world_size=world, micro_batch_size=1)
    resumed.load_state_dict(state)
    return [head, tail, [resumed.next_step() for _ in range(4)], state, tokens]


@pytest.mark.slow
def test_two_ranks_read_disjoint_rows_and_resume_from_the_gathered_position(corpus):
    from tests.parallel.harness import run_ranks

    results = run_ranks(_two_ranks, 2, str(corpus), timeout=300)
    rows = [
        tuple(row) for head, *_ in results for step in head for batch in step for row in batch["input_ids"].tolist()
    ]
    assert len(rows) == len(set(rows))
    for _head, tail, resumed, state, _ in results:
        assert len(state["ranks"]) == 2 and _equal(tail, resumed)
    assert results[0][4] == results[1][4] and sum(results[0][4].values()) == sum(
        int((batch["input_ids"] != 0).sum()) for head, *_ in results for step in head for batch in step
    )


def _same(a, b) -> bool:
    """Equal batch values: tensors element by element; packed rows' max lengths are ints."""
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


def test_a_row_the_stream_cannot_parse_is_a_recipe_error_naming_the_source(corpus):
    """Streams are not scanned ahead, so a malformed row surfaces while reading: as a RecipeError
    (exit 2) naming the source's key and file, never the reader's traceback."""
    lines = (corpus / "code.jsonl").read_text().splitlines()
    lines[30] = "{bad json"
    (corpus / "code.jsonl").write_text("\n".join(lines) + "\n")
    reader = _reader(_data(corpus), 1, 0, 1)
    with pytest.raises(RecipeError) as caught:
        _one_pass(reader)
    problem = caught.value.problems[0]
    assert problem.key == "data.sources.1"
    assert "cannot read source 'code', " in problem.message and "code.jsonl while streaming" in problem.message
    assert "data.streaming = false" in problem.fix


def test_a_malformed_json_line_is_skipped_with_on_bad_rows_skip_and_the_stream_resumes_exactly(corpus, caplog):
    """As when the file is read whole: `on_bad_rows = "skip"` leaves a malformed line out (named by
    file and line in a warning), and the rest of the file streams and resumes as before."""
    lines = (corpus / "code.jsonl").read_text().splitlines()
    lines[30] = '{"text": "cut off'
    (corpus / "code.jsonl").write_text("\n".join(lines) + "\n")
    data = _data(corpus, sources=[DataSourceConfig(path=str(corpus / "code.jsonl"))], on_bad_rows="skip")
    resolved = resolve_sources(data)
    spec = StreamingData(tuple(resolved), TOKENIZER, window=data.shuffle_buffer_size, on_bad_rows="skip")
    reader = SourceReader(resolved[0], spec, reader=0, readers=1, seed=3)
    states, texts = [], []
    with caplog.at_level("WARNING", logger="ditty.data"):
        for _ in range(130):  # 60 good rows a pass: past two pass boundaries
            states.append(json.loads(json.dumps(reader.state_dict())))
            texts.append(_text(reader.take()))
    assert sorted(texts[:60]) == sorted(texts[60:120]) and len(set(texts[:60])) == 60
    assert not any(text.startswith("code 30 ") for text in texts)
    assert f"{corpus / 'code.jsonl'}:31: malformed JSON" in caplog.text
    for start in (0, 9, 30, 59, 61, 125):
        again = SourceReader(resolved[0], spec, reader=0, readers=1, seed=3)
        again.load_state_dict(states[start])
        assert [_text(again.take()) for _ in range(5)] == texts[start : start + 5], start


STREAMED_RUN = """
[run]
output_dir = "{out}"
seed = 0
device = "cpu"
[model]
init = "random"
architecture = "llama"
config = {{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1, num_attention_heads = 2, \
num_key_value_heads = 2, max_position_embeddings = 64, tie_word_embeddings = false }}
[tokenizer]
kind = "byte"
[data]
source = "file"
path = "{path}"
format = "text"
max_seq_len = 32
streaming = true
shuffle_buffer_size = 16
on_bad_rows = "skip"
num_workers = {workers}
[train]
steps = 3
global_batch_size = 8
micro_batch_size = 8
log_every = 1
eval_every = 0
[logging]
progress = false
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_rows_a_stream_skips_are_counted_in_metrics_and_the_summary(tmp_path, workers):
    """docs/data.md: a skipped bad row is counted as skipped_rows in metrics.jsonl and the run summary;
    a streamed source named the line it skipped, and counted nothing. Here one malformed line and one
    row whose text is null, among 60, all read by the 3 steps."""
    from tests.reliability.helpers import ditty

    lines = [json.dumps({"text": f"row {i} " + "y" * (i % 7)}) for i in range(60)]
    lines[5] = '{"text": "cut off'
    lines[11] = json.dumps({"text": None})
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    recipe = tmp_path / "streamed.toml"
    recipe.write_text(STREAMED_RUN.format(out=tmp_path / "run", path=tmp_path / "rows.jsonl", workers=workers))
    result = ditty("run", str(recipe))
    assert result.code == 0, result.err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["skipped_rows"] == 2, records[-1]
    assert 'skipped 2 bad data rows (data.on_bad_rows = "skip")' in result.out, result.out


def test_a_readers_count_of_skipped_rows_is_part_of_its_position(corpus):
    """Each bad row counts once (later passes leave out the same rows), and a reader resumed from any
    position counts what the uninterrupted one counts."""
    lines = (corpus / "code.jsonl").read_text().splitlines()
    lines[3], lines[30] = '{"text": "cut off', json.dumps({"text": None})
    (corpus / "code.jsonl").write_text("\n".join(lines) + "\n")
    data = _data(corpus, sources=[DataSourceConfig(path=str(corpus / "code.jsonl"))], on_bad_rows="skip")
    resolved = resolve_sources(data)
    spec = StreamingData(tuple(resolved), TOKENIZER, window=data.shuffle_buffer_size, on_bad_rows="skip")
    reader = SourceReader(resolved[0], spec, reader=0, readers=1, seed=3)
    states, counts = [], []
    for _ in range(130):  # 59 good rows a pass: past two pass boundaries
        states.append(json.loads(json.dumps(reader.state_dict())))
        reader.take()
        counts.append(reader.skipped)
    assert counts[-1] == 2 and counts[0] == 1 and max(counts[:20]) == 1  # as the windows are read, each once
    for start in (0, 5, 40, 59, 61, 125):
        again = SourceReader(resolved[0], spec, reader=0, readers=1, seed=3)
        again.load_state_dict(states[start])
        again.take()
        assert again.skipped == counts[start], start
