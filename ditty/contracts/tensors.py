"""The optional first-step check: real tensors against a declared contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

from ditty.config.errors import Problem
from ditty.contracts.spec import CTX, Contract, TensorSpec, as_contract, dtype_names


def check_tensors(
    contract: Union[Contract, str], tensors_by_name: Mapping[str, Any], *, side: str = "inputs", stage: str = ""
) -> list[Problem]:
    """Compare real values with one side of a contract: rank (ndim) and dtype of each named tensor.

    `tensors_by_name` maps the contract's names to values; context entries are keyed "ctx.KEY"
    (`bind_tensors` builds this mapping from a batch or model output and the context). A declared
    name that is missing, or a value that is not a tensor, is a problem too.
    """
    import torch

    contract = as_contract(contract)
    if side not in ("inputs", "outputs"):
        raise ValueError(f"side must be 'inputs' or 'outputs', not {side!r}")
    tensors, ctx = (
        (contract.inputs, contract.ctx_inputs) if side == "inputs" else (contract.outputs, contract.ctx_outputs)
    )
    problems = []
    for label, spec in [(s.name, s) for s in tensors] + [(f"{CTX}.{s.name}", s) for s in ctx]:
        if label not in tensors_by_name:
            problems.append(
                Problem(stage, f"declares {side[:-1]} `{label}`, but it was not found", rule="contract.tensor")
            )
            continue
        value = tensors_by_name[label]
        if not torch.is_tensor(value):
            problems.append(
                Problem(
                    stage, f"{side[:-1]} `{label}` is a {type(value).__name__}, not a tensor", rule="contract.tensor"
                )
            )
            continue
        problems += compare_real(stage, side[:-1], label, spec, value)
    return problems


def compare_real(stage: str, what: str, label: str, spec: TensorSpec, value: Any) -> list[Problem]:
    """Rank and dtype of one real tensor against its spec ("f" accepts any float, and so on)."""
    import torch

    if not torch.is_tensor(value):
        return [Problem(stage, f"{what} `{label}` is a {type(value).__name__}, not a tensor", rule="contract.tensor")]
    faults = []
    if spec.rank is not None and value.dim() != spec.rank:
        faults.append(f"rank {spec.rank} declared, but the tensor has shape {tuple(value.shape)}")
    if spec.dtype is not None and str(value.dtype).removeprefix("torch.") not in dtype_names(spec.dtype):
        faults.append(f"dtype {spec.dtype} declared, but the tensor is {str(value.dtype).removeprefix('torch.')}")
    return [
        Problem(stage, f"{what} `{label}`: {fault}", rule="contract.tensor", fix="fix the contract or the stage")
        for fault in faults
    ]


def bind_tensors(
    contract: Union[Contract, str], value: Any, ctx: Optional[Mapping] = None, *, side: str = "inputs"
) -> dict[str, Any]:
    """Name the real values of one side of a stage for `check_tensors`.

    A dict (or Hugging Face ModelOutput) binds by key; a tuple or list by position; a single value
    is the first tensor. Context entries are looked up along their dotted key.
    """
    contract = as_contract(contract)
    tensors, ctx_specs = (
        (contract.inputs, contract.ctx_inputs) if side == "inputs" else (contract.outputs, contract.ctx_outputs)
    )
    bound: dict[str, Any] = {}
    if isinstance(value, Mapping):
        bound.update({s.name: value[s.name] for s in tensors if s.name in value})
    elif isinstance(value, (tuple, list)):
        bound.update({s.name: v for s, v in zip(tensors, value)})
    elif tensors and value is not None:
        bound[tensors[0].name] = value
    for spec in ctx_specs:
        found, entry = _dig(ctx or {}, spec.name.split("."))
        if found:
            bound[f"{CTX}.{spec.name}"] = entry
    return bound


def _dig(mapping: Mapping, path: list[str]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(mapping, Mapping) or part not in mapping:
            return False, None
        mapping = mapping[part]
    return True, mapping
