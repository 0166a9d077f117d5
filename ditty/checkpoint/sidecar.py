"""`ditty_state.json`: everything in a checkpoint that is not a tensor, as plain JSON.

Layout (version 1):
```
{
  "format": "ditty-checkpoint", "version": 1,
  "step": 200, "world_size": 2, "saved_at": "2026-11-21T23:59:00+00:00",
  "rng": {"0": {...}, "1": {...}},            every rank's generators, keyed by rank
  "non_tensor_state": {"[\"optim\", \"param_groups\", 0, \"lr\"]": 0.0003, ...},
  ... the trainer's own fields: data cursor, tokens seen, scheduler, loss scaler, recipe text ...
}
```
RNG states are gathered to rank 0 and written in this one file (one writer, one file to make
complete) rather than one sidecar per rank; the gather is a small collective (about 20 KB per rank)
at save time. `non_tensor_state` holds the app state's non-tensor leaves (optimizer hyper-parameters)
and is taken from rank 0, where those values are the same on every rank.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Mapping

from .layout import SIDECAR

FORMAT = "ditty-checkpoint"
VERSION = 1
RESERVED = ("format", "version", "step", "world_size", "saved_at", "rng", "non_tensor_state")


def build(
    step: int,
    fields: Mapping[str, Any],
    *,
    world_size: int,
    rng_by_rank: list[Any],
    non_tensor_state: Mapping[str, Any],
) -> str:
    clash = sorted(set(fields) & set(RESERVED))
    if clash:
        raise ValueError(f"sidecar fields {clash} are reserved for the checkpoint manager")
    for key, value in fields.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"checkpoint sidecar field {key!r} is not JSON-serialisable ({e}); "
                f"convert it to numbers, text, lists and dicts"
            ) from None
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "world_size": int(world_size),
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rng": {str(r): state for r, state in enumerate(rng_by_rank)},
        "non_tensor_state": dict(non_tensor_state),
        **fields,
    }
    return json.dumps(doc, indent=1) + "\n"


def read(path: Path) -> dict[str, Any]:
    """Parse a checkpoint's sidecar (the file itself or its step directory). JSON only."""
    from ditty.config.errors import RecipeError

    path = Path(path)
    if path.is_dir():
        path = path / SIDECAR
    fix = "name a checkpoint written by this version of ditty (a checkpoints/step-N directory of a ditty run)"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # a missing, unreadable or non-JSON file is the user's path
        raise RecipeError.single(
            f"cannot read checkpoint sidecar {path}: {error}", key="checkpoint.resume", fix=fix
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("step"), int):
        raise RecipeError.single(f"{path} is not a ditty checkpoint sidecar", key="checkpoint.resume", fix=fix)
    if doc.get("version") != VERSION:
        raise RecipeError.single(
            f"{path} has sidecar version {doc.get('version')}; this ditty reads {VERSION}",
            key="checkpoint.resume",
            fix=fix,
        )
    return doc
