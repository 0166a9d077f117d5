"""`data.max_seq_len` longer than the model's positions: a recipe error before any weight loads."""

from __future__ import annotations

import json

import pytest
import tomllib

from ditty.cli import main


@pytest.fixture
def bert_512(tmp_path) -> str:
    """A BERT directory with 512 learned positions, as bert-base has: its config.json is all the
    compiler reads (no weight is loaded before the refusal)."""
    path = tmp_path / "bert"
    path.mkdir()
    config = dict(model_type="bert", architectures=["BertForMaskedLM"], vocab_size=100, hidden_size=32)
    config.update(num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def recipe(tmp_path, model_dir: str, max_seq_len: int) -> str:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "the team scored", "label": "sport"}\n{"text": "bread soup", "label": "food"}\n')
    path = tmp_path / "r.toml"
    path.write_text(
        f'[model]\npath = "{model_dir}"\ntask = "seq-classification"\n\n'
        f'[data]\nsource = "file"\npath = "{data}"\nformat = "classification"\nmax_seq_len = {max_seq_len}\n\n'
        "[train]\nsteps = 1\nglobal_batch_size = 2\nmicro_batch_size = 2\n"
    )
    return str(path)


def test_check_refuses_2048_tokens_on_a_512_position_model(tmp_path, capsys, bert_512):
    code = main(["check", recipe(tmp_path, bert_512, 2048)])
    err = capsys.readouterr().err
    assert code == 2
    assert "r.toml:9: `data.max_seq_len`" in err
    assert "2048 tokens is longer than the model's 512 positions" in err
    assert "set data.max_seq_len = 512" in err
    assert "Traceback" not in err


def test_run_refuses_it_before_loading_weights(tmp_path, capsys, bert_512):
    code = main(["run", recipe(tmp_path, bert_512, 2048), "--run.output_dir", str(tmp_path / "run")])
    assert code == 2
    assert "512 positions" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_length_within_the_positions_checks(tmp_path, capsys, bert_512):
    assert main(["check", recipe(tmp_path, bert_512, 512)]) == 0, capsys.readouterr().err


def test_init_never_writes_more_tokens_than_positions(tmp_path, capsys, bert_512):
    out = tmp_path / "r.toml"
    assert main(["init", "--data.max_seq_len", "2048", "-o", str(out)]) == 0
    written = tomllib.loads(out.read_text())
    assert written["model"]["config"]["max_position_embeddings"] >= written["data"]["max_seq_len"] == 2048

    named = tmp_path / "named.toml"
    code = main(["init", "--model.path", bert_512, "--data.max_seq_len", "2048", "-o", str(named)])
    assert code == 2 and not named.exists()
    assert "512 positions" in capsys.readouterr().err
