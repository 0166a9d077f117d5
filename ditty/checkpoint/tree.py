"""Split a state tree into its tensors (for DCP) and its other leaves (for the JSON sidecar).

Why: DCP stores any non-tensor value as a pickle and reads it back with
`torch.load(weights_only=False)`, which runs arbitrary code from the file. An optimizer state dict
always has such values (`param_groups`: lr, betas, eps, ...). So ditty hands DCP a tree of tensors
only and keeps every other leaf as JSON; resuming never unpickles anything.

The tensor tree keeps the nesting of the original (keys become text, list positions become "0",
"1", ...), so DCP's flattened names stay readable ("optim.state.0.weight.exp_avg") and stable.
Other leaves are keyed by their JSON-encoded path. Merging walks the *current* state as the
template, so containers come back as the types the owner expects (tuples stay tuples).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

import torch

log = logging.getLogger(__name__)

JSON_LEAF = (type(None), bool, int, float, str)


def _path_key(path: tuple) -> str:
    return json.dumps(list(path))


def split(tree: Any, path: tuple = ()) -> tuple[Any, dict[str, Any]]:
    """Return (tensor-only nested dict, {json path: JSON leaf}). Raises TypeError on other leaves."""
    extras: dict[str, Any] = {}
    tensors = _split(tree, path, extras)
    return tensors, extras


def _split(node: Any, path: tuple, extras: dict[str, Any]) -> Any:
    if isinstance(node, torch.Tensor):
        return node
    if isinstance(node, Mapping):
        items = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    elif isinstance(node, JSON_LEAF):
        extras[_path_key(path)] = node
        return None
    else:
        raise TypeError(
            f"checkpoint state at {'.'.join(map(str, path)) or '<root>'} is a "
            f"{type(node).__name__}; only tensors and JSON values (numbers, text, "
            f"booleans, None, lists, dicts) can be saved"
        )
    out: dict[str, Any] = {}
    for key, value in items:
        if not isinstance(key, (str, int)):
            raise TypeError(f"checkpoint state key {key!r} at {path} must be text or an integer")
        sub = _split(value, path + (key,), extras)
        if sub is None:
            continue
        name = str(key)
        if name in out:
            raise TypeError(f"checkpoint state at {path} has keys {key!r} and {name!r} that collide")
        out[name] = sub
    return out


def merge(template: Any, extras: Mapping[str, Any], path: tuple = (), used: set | None = None) -> Any:
    """Rebuild `template` with its non-tensor leaves taken from `extras`.

    Tensors are returned as they are: DCP has already loaded them in place. A leaf missing from the
    checkpoint keeps the template's value, with a warning (a field added to an optimizer since).
    """
    if isinstance(template, torch.Tensor):
        return template
    if isinstance(template, Mapping):
        merged = {k: merge(v, extras, path + (k,), used) for k, v in template.items()}
        return merged if type(template) is dict else type(template)(merged)
    if isinstance(template, (list, tuple)):
        values = [merge(v, extras, path + (i,), used) for i, v in enumerate(template)]
        if isinstance(template, list):
            return values
        return type(template)(*values) if hasattr(template, "_fields") else type(template)(values)
    key = _path_key(path)
    if key not in extras:
        log.warning("checkpoint has no value for %s; keeping the current %r", ".".join(map(str, path)), template)
        return template
    if used is not None:
        used.add(key)
    return extras[key]
