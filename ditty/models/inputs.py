"""Which batch keys a model's forward takes, looking through every wrapper ditty or peft puts around it.

A batch carries more than a model takes (labels for the loss, a user's own columns). Passing a key
the forward does not name fails (`unexpected keyword argument 'labels'`), and passing `labels` to a
Hugging Face model makes it compute a second loss. So the trainer asks `accepted_inputs(model)`:
the keyword parameters of the innermost module's forward, found under torch.compile (`_orig_mod`),
DDP and DeepSpeed (`.module`) and peft (`get_base_model()`: a PeftModel's own forward takes
`*args, **kwargs` and hands everything to the user's module). A forward that takes `**kwargs`
accepts anything, unless the module declares a contract (ditty.contracts): then the contract's
input names are what it takes.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from ditty._utils.modules import unwrap


def innermost_module(model: Any) -> Any:
    """The user's module under compile, DDP/DeepSpeed and peft wrappers."""
    return unwrap(model, peft=True)


def is_transformers_model(model: Any) -> bool:
    """A transformers PreTrainedModel (it has a config and computes its own loss from `labels`)."""
    return getattr(model, "config", None) is not None and hasattr(model, "can_generate")


def accepted_inputs(model: Any) -> Optional[frozenset[str]]:
    """Keyword names the innermost forward takes; None when it takes any keyword (and has no contract)."""
    inner = innermost_module(model)
    try:
        parameters = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return None
    named = frozenset(
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return named
    contract = _contract_inputs(inner)
    return named | contract if contract else None


def _contract_inputs(module: Any) -> frozenset[str]:
    contract = getattr(module, "contract", None)
    if not contract:
        return frozenset()
    from ditty.contracts import as_contract

    try:
        parsed = as_contract(contract)
    except ValueError:
        return frozenset()
    return frozenset(spec.name for spec in parsed.inputs)


def select_inputs(model: Any, batch: dict, *, drop_labels: Optional[bool] = None) -> dict:
    """The items of `batch` the model's forward takes; `labels` never reaches a transformers model
    (ditty's loss is computed from the logits), unless `drop_labels` says otherwise."""
    inner = innermost_module(model)
    if drop_labels is None:
        drop_labels = is_transformers_model(inner)
    accepted = accepted_inputs(model)
    return {
        key: value
        for key, value in batch.items()
        if (accepted is None or key in accepted) and not (drop_labels and key == "labels")
    }
