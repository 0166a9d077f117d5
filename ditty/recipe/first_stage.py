"""A second stage checked before its first: the command that makes the missing model directory.

A recipe that starts from another run's final model (tiny_dpo from a short tiny_sft run) names
`RUN/final` as model.path (or as distill.teacher, the model a distillation learns from). Before that
run exists, the check says which command makes it, read from the recipe's own header comment: a line
`#   ditty run RECIPE [flags]` whose run writes RUN (its `--run.output_dir` flag, else that recipe's
`run.output_dir`). The command is written once, where a reader of the recipe looks for it; no table
has to be kept in step with the recipes.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import tomllib

from ditty.config.bundled import find_bundled

COMMAND = "ditty run "


def first_stage_command(recipe_text: str, model_path: str) -> Optional[str]:
    """The `ditty run ...` line of the recipe's comments whose run's final/ is `model_path`, or None."""
    parts = Path(os.path.normpath(model_path)).parts
    if "final" not in parts[-2:]:  # RUN/final, or RUN/final/merged
        return None
    run_dir = os.path.normpath(os.path.join(*parts[: parts.index("final", len(parts) - 2)]) or ".")
    for line in recipe_text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            continue
        command = stripped.lstrip("#").strip()
        if command.startswith(COMMAND) and _writes(command, run_dir):
            return command
    return None


def _writes(command: str, run_dir: str) -> bool:
    try:
        words = shlex.split(command)[2:]
    except ValueError:
        return False
    if not words:
        return False
    output_dir = None
    for index, word in enumerate(words):
        if word == "--run.output_dir" and index + 1 < len(words):
            output_dir = words[index + 1]
        elif word.startswith("--run.output_dir="):
            output_dir = word.split("=", 1)[1]
    if output_dir is None:
        output_dir = _recipe_output_dir(words[0])
    return output_dir is not None and os.path.normpath(output_dir) == run_dir


def _recipe_output_dir(recipe: str) -> Optional[str]:
    path = find_bundled(recipe) or (Path(recipe) if Path(recipe).is_file() else None)
    if path is None:
        return None
    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get("run", {}).get("output_dir")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return value if isinstance(value, str) else None
