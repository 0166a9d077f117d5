"""Plans that fit the machine: `device = "auto"` without a GPU plans the CPU; a classifier's plan
has no vocabulary head."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU: auto means it")
def test_auto_device_on_a_machine_without_a_gpu_plans_the_cpu(capsys):
    assert main(["check", "tiny_sft", "--plan", "--run.device", "auto"]) == 0
    out = capsys.readouterr().out
    assert "on the CPU" in out and "H100" not in out


def test_a_classifier_plan_counts_no_vocabulary_head(tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    config = dict(model_type="bert", architectures=["BertForMaskedLM"], vocab_size=30522, hidden_size=128)
    config.update(num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, max_position_embeddings=512)
    (bert / "config.json").write_text(json.dumps(config))
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a goal", "label": "sport"}\n{"text": "soup", "label": "food"}\n')
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[model]\npath = "{bert}"\ntask = "seq-classification"\n\n'
        f'[data]\nsource = "file"\npath = "{data}"\nformat = "classification"\nmax_seq_len = 512\n\n'
        "[train]\nsteps = 10\nglobal_batch_size = 32\nmicro_batch_size = 32\n"
    )
    assert main(["check", str(recipe), "--plan", "--run.device", "cpu"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    logits = next(line for line in out.splitlines() if "logits and loss" in line)
    assert "30,522" not in logits and "no vocabulary head" in logits
    assert "loss_chunks" not in out
