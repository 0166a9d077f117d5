"""The optional first-step check: real tensors against a declared contract, stage by stage (`ContractCheck`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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


class ContractCheck:
    """Collects contract.tensor problems of one micro-batch's stages (ditty.contracts.check_tensors).

    The loss is checked like the chain checks it: its first tensor is the prediction its
    `output_index` picks, further tensors are outputs of the producer found by name, and context
    keys it reads may also be batch columns (as `LossCalculator.get_target` finds them). A
    CompositeLoss is checked part by part, each with its own `output_index`.
    """

    def __init__(self) -> None:
        self.problems: list = []
        self.outputs: tuple = ()  # the output specs of the last stage that declared its outputs

    def stage(self, name: str, stage: Any, given: Any, produced: Any, ctx: dict) -> None:
        contract = as_contract(getattr(stage, "contract", None))
        self.outputs = contract.outputs if contract is not None else ()
        if contract is None:
            return
        self.problems += check_tensors(
            contract, bind_tensors(contract, given, ctx, side="inputs"), side="inputs", stage=name
        )
        self.problems += check_tensors(
            contract, bind_tensors(contract, produced, ctx, side="outputs"), side="outputs", stage=name
        )

    def loss(self, loss: Any, output: Any, ctx: dict, name: str = "") -> None:
        name = name or f"pipeline.loss ({type(loss).__name__})"
        contract = as_contract(getattr(loss, "contract", None))
        parts = getattr(loss, "parts", None)
        if parts:
            if contract is not None:
                self._check_loss(name, contract, None, output, ctx)
            for index, (part, _) in enumerate(parts):
                self.loss(part, output, ctx, f"{name} part {index} ({type(part).__name__})")
            return
        if contract is not None:
            self._check_loss(name, contract, loss, output, ctx)

    def _check_loss(self, name: str, contract: Any, loss: Any, output: Any, ctx: dict) -> None:
        bound: dict[str, Any] = {}
        inputs = contract.inputs
        if inputs and loss is not None and hasattr(loss, "get_prediction"):
            try:
                bound[inputs[0].name] = loss.get_prediction(output)
            except (IndexError, KeyError, TypeError) as exc:
                self.problems.append(
                    Problem(name, f"output_index {loss.output_index!r}: {exc}", rule="contract.output-index")
                )
            others = inputs[1:]
        else:
            others = inputs
        by_position = bind_tensors(Contract(outputs=self.outputs), output, side="outputs") if self.outputs else {}
        for spec in others:
            if isinstance(output, Mapping) and spec.name in output:
                bound[spec.name] = output[spec.name]
            elif spec.name in by_position:
                bound[spec.name] = by_position[spec.name]
        for spec in contract.ctx_inputs:
            found, value = _find_in_context(ctx, spec.name)
            if found:
                bound[f"ctx.{spec.name}"] = value
        checked = Contract(inputs=tuple(s for s in inputs if s.name in bound), ctx_inputs=contract.ctx_inputs)
        self.problems += check_tensors(checked, bound, side="inputs", stage=name)

    def raise_errors(self) -> None:
        from ditty.contracts.errors import ContractViolation

        errors = [p for p in self.problems if p.severity == "error"]
        if errors:
            raise ContractViolation(errors)

    @contextmanager
    def before_a_crash(self) -> Iterator[None]:
        """A later stage that crashes on a value an earlier stage's contract already refused (a
        matrix product of the wrong rank in the model's forward) raises the contract's problems,
        which name the stage at fault, with the crash as their cause."""
        try:
            yield
        except Exception as crash:
            if any(p.severity == "error" for p in self.problems):
                from ditty.contracts.errors import ContractViolation

                if not isinstance(crash, ContractViolation):
                    raise ContractViolation([p for p in self.problems if p.severity == "error"]) from crash
            raise


def _find_in_context(ctx: Mapping, key: str) -> tuple[bool, Any]:
    """A dotted context key, or (for a loss) a column of the batch, as `LossCalculator` looks it up."""
    for source in (ctx, ctx.get("batch"), ctx.get("original_batch")):
        value: Any = source
        for part in key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                break
            value = value[part]
        else:
            return True, value
    return False, None
