"""Post-training is read against where it started, on the user's own data: greedy exact match against
each row's reference answer (a chat's last assistant turn, a pair's chosen answer) is on by default
after SFT, evaluated at step 0 too, and drawn with the training reward in curves.png; a setting that
cannot take effect says so."""

from __future__ import annotations

import json

from ditty.cli import main
from ditty.metrics.plot import figure, training_reward_keys

CHAT_PAIRS = [
    {
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "chosen": [{"role": "assistant", "content": str(a + b)}],
        "rejected": [{"role": "assistant", "content": str(a + b + 1)}],
    }
    for a in range(10, 30)
    for b in range(3)
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def recipe(tmp_path, model_dir, data_path, data_format, extra=""):
    path = tmp_path / "r.toml"
    path.write_text(
        f"""
[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
[model]
path = "{model_dir}"
[tokenizer]
chat_template = "plain"
[data]
source = "file"
path = "{data_path}"
format = "{data_format}"
max_seq_len = 48
val_fraction = 0.2
[train]
steps = 2
global_batch_size = 4
micro_batch_size = 4
log_every = 1
eval_every = 2
eval_samples = 8
precision = "fp32"
[logging]
progress = false
{extra}
"""
    )
    return str(path)


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_dpo_on_chat_pairs_reports_exact_match_from_step_0(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", CHAT_PAIRS)
    assert main(["run", recipe(tmp_path, tiny_llama_dir, data, "preference")]) == 0, capsys.readouterr().err
    rows = records(tmp_path)
    assert rows[0]["step"] == 0 and "val_exact_match" in rows[0] and "loss" not in rows[0]  # the baseline
    assert "val_exact_match" in rows[-1] and rows[-1]["step"] == 2


def test_sft_on_chats_scores_the_last_assistant_turn_when_asked(tmp_path, tiny_llama_dir, capsys):
    chats = [{"messages": row["prompt"] + row["chosen"]} for row in CHAT_PAIRS]
    data = write_jsonl(tmp_path / "chats.jsonl", chats)
    path = recipe(tmp_path, tiny_llama_dir, data, "chat")
    assert main(["run", path, "--data.val_exact_match", "true"]) == 0, capsys.readouterr().err
    rows = records(tmp_path)
    assert rows[0]["step"] == 1  # SFT: no step-0 evaluation unless asked
    assert "val_exact_match" in rows[-1]


def test_a_format_without_answers_says_exact_match_cannot_take_effect(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "text.jsonl", [{"text": "hello world"}] * 10)
    assert main(["check", recipe(tmp_path, tiny_llama_dir, data, "text"), "--data.val_exact_match", "true"]) == 0
    err = capsys.readouterr().err
    assert "`data.val_exact_match` has no effect" in err and 'data.format = "text"' in err


def test_curves_draw_the_training_reward_and_a_loss_that_crosses_zero_on_a_linear_axis():
    rows = [
        {"step": s, "loss": (-1) ** s * 1e-10 * s, "lr": 1e-4, "reward": 0.1 * s, "rewards/exact/mean": 0.05 * s}
        for s in range(1, 6)
    ] + [{"step": 5, "val_exact_match": 0.4, "val_reward": 0.4}]
    assert training_reward_keys(rows) == ["reward", "rewards/exact/mean"]
    fig = figure(rows, "grpo")
    axes = fig.get_axes()
    assert axes[0].get_yscale() == "linear"
    assert [ax.get_title() for ax in axes] == ["loss", "learning rate", "training reward", "evaluation"]
