"""Which batch keys a model's forward takes, looking through every wrapper ditty or peft puts around
it, and the forward call of a batch (`call_model`).

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from ditty._utils.modules import unwrap

if TYPE_CHECKING:
    import torch

# Keys of a batch the model's forward takes. Everything else (labels, user keys) stays for the loss:
# passing labels would make Hugging Face models compute a second, unwanted loss over the logits.
# token_type_ids (BERT-style pairs) and the decoder inputs (seq2seq) come from the task formats.
MODEL_INPUTS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "inputs_embeds",
    "token_type_ids",
    "decoder_input_ids",
    "decoder_attention_mask",
)


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


def model_inputs(model: torch.nn.Module, batch: dict) -> dict:
    """The forward's keyword arguments; `use_cache=False` for Hugging Face models (training, and
    packed samples are isolated only without a cache). A packed batch (cumulative sample lengths,
    no mask) gets what the model's attention kernel needs (ditty.models.packing.packed_inputs)."""
    accepted = accepted_inputs(model)  # a model that does not name a key (DistilBERT: token_type_ids) gets none
    if "cu_seq_lens_q" in batch:
        from ditty.models.packing import packed_inputs

        kwargs = packed_inputs(model, batch)
    else:
        kwargs = {k: batch[k] for k in MODEL_INPUTS if k in batch and (accepted is None or k in accepted)}
    # Look through DDP/compile wrappers: DDP has no `.config`, and without use_cache=False the
    # Hugging Face model would build a KV cache in training, which activation checkpointing's
    # recompute then extends a second time (selective checkpointing fails on the extra ops).
    if _caches(unwrap(model, peft=True)) and (accepted is None or "use_cache" in accepted):
        kwargs["use_cache"] = False
    return kwargs


def _caches(model: torch.nn.Module) -> bool:
    """A Hugging Face model whose config has `use_cache` (it would build a KV cache unless told not to)."""
    return getattr(getattr(model, "config", None), "use_cache", None) is not None


def call_model(model: torch.nn.Module, batch: Any, forward_kwargs: dict, *, lm: bool) -> Any:
    """The forward call for each kind of batch.

    LM data: `model(input_ids=..., attention_mask=..., ...)` (MODEL_INPUTS only). Generic data:
    a tensor (or tuple/list) batch is `model(batch, **forward_kwargs)`; a dict batch is
    `model(**batch, **forward_kwargs)`, restricted to the parameters the forward names (unless it
    takes **kwargs and declares no contract) and, for Hugging Face models, without `labels` (no second
    loss inside the model). The forward is the innermost one, under DDP, compile and peft wrappers
    (`innermost_module`), so a custom model wrapped by peft is not handed keys it does not take.
    """
    if lm:
        return model(**model_inputs(model, batch), **forward_kwargs)
    if isinstance(batch, Mapping):
        kwargs = dict(batch)
        inner = innermost_module(model)
        if is_transformers_model(inner) and _caches(inner):
            kwargs.setdefault("use_cache", False)
        return model(**select_inputs(model, kwargs), **forward_kwargs)
    return model(batch, **forward_kwargs)
