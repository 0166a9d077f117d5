"""Whether a directory is a ditty run: it holds ditty's `env.json`, written at the start of every run.

Torch-free, so `ditty check RUN_DIR` can tell a run directory (whose code it must not import) from a
user's recipe without loading the trainer.
"""

from __future__ import annotations

import json
import os

RUN_MARKER = "env.json"


def is_ditty_run(path: str) -> bool:
    marker = os.path.join(path, RUN_MARKER)
    if not os.path.isfile(marker):
        return False
    try:
        with open(marker, encoding="utf-8") as f:
            return "ditty_version" in json.load(f)
    except (OSError, ValueError):
        return False
