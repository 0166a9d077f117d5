"""Tiny reward-model runs for the tests: a recipe over built-in addition pairs (or a pairs file) and a
2-layer, 64-wide Llama, random or saved as a user's causal-LM checkpoint (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def save_tiny_causal_lm(path: Path) -> str:
    """A random tiny Llama saved as `LlamaForCausalLM` with ditty's byte tokenizer: the SFT model a
    reward model starts from."""
    from tests.conftest import _save_tiny

    return _save_tiny(path, "llama", **TINY_LLAMA)


def reward_recipe(
    tmp_path: Path,
    *,
    model_dir: Optional[str] = None,
    data: Optional[str] = None,
    steps: int = 3,
    global_pairs: int = 8,
    micro_pairs: int = 8,
    extra: str = "",
) -> str:
    """A reward-model recipe file: built-in addition pairs (or the pairs file `data`), one evaluation
    at the end, the run in tmp_path / "run"."""
    if model_dir:
        model = f'[model]\ntask = "reward-model"\npath = "{model_dir}"\n'
        tokenizer = ""
    else:
        overrides = ", ".join(f"{k} = {json.dumps(v)}" for k, v in TINY_LLAMA.items())
        model = f'[model]\ntask = "reward-model"\ninit = "random"\narchitecture = "llama"\nconfig = {{ {overrides} }}\n'
        tokenizer = '[tokenizer]\nkind = "byte"\n'
    source = (
        f'source = "file"\npath = "{data}"\nval_fraction = 0.25\n'
        if data
        else 'source = "builtin"\nname = "addition"\nnum_samples = 200\nval_fraction = 0.1\n'
    )
    text = f"""[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
num_threads = 1

{model}
{tokenizer}
[data]
{source}format = "preference"
max_seq_len = 32

[train]
steps = {steps}
global_batch_size = {global_pairs}
micro_batch_size = {micro_pairs}
log_every = 1
eval_every = {steps}
max_grad_norm = 0.0

[optimizer]
lr = 1e-3

[scheduler]
kind = "constant"
warmup_steps = 0

[checkpoint]
every = 0

[logging]
progress = false
{extra}
"""
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return str(path)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
