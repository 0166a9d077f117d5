"""Small preference recipes over the session's tiny Llama, for the CLI and training tests."""

from __future__ import annotations

import json
from pathlib import Path

PAIRS = [
    {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(3, 9) for b in range(4)
]


def write_pairs(path: Path, rows=PAIRS) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def preference_recipe(
    tmp_path: Path, model_dir: str, data: str, *, extra: str = "", steps: int = 2, batch=(4, 2), run: str = "run"
) -> Path:
    """A recipe training on `data` for `steps` steps of batch = (global, micro) pairs into tmp_path/run."""
    recipe = tmp_path / "dpo.toml"
    recipe.write_text(
        f"""
[run]
output_dir = "{tmp_path / run}"
device = "cpu"
seed = 0

[model]
path = "{model_dir}"

[data]
source = "file"
path = "{data}"
format = "preference"
max_seq_len = 32
val_fraction = 0

[train]
steps = {steps}
global_batch_size = {batch[0]}
micro_batch_size = {batch[1]}
log_every = 1
precision = "fp32"

[logging]
progress = false
{extra}
"""
    )
    return recipe
