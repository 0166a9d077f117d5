"""Checking that the declared contracts of a chain of stages fit together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

from ditty.config.errors import Problem
from ditty.contracts.errors import ContractSyntaxError
from ditty.contracts.spec import TRAINER_CTX_KEYS, Contract, TensorSpec, as_contract, dtypes_overlap, parse_specs

ROLES = ("preprocessor", "model", "postprocessor", "loss", "stage")


OutputIndex = Union[int, str]


class Stage(NamedTuple):
    """One stage of the pipeline for `check_chain`. A plain `(name, contract)` tuple is a Stage of
    role "stage" (passes tensors on, like a processor).

    `output_index` is the loss's (LossCalculator.output_index, 0 when None); a CompositeLoss
    passes the tuple of its parts' indices, each of which must exist.
    """

    name: str
    contract: Union[Contract, str, None]
    role: str = "stage"
    output_index: Union[OutputIndex, Sequence[OutputIndex], None] = None


@dataclass
class _Flow:
    """What the walk knows between two stages: the tensors in flight (None: unknown) and the
    context keys provided so far (`ctx_open`: an unchecked stage may have added any key)."""

    tensors: Optional[tuple[TensorSpec, ...]]
    producer: str
    ctx: dict[str, Optional[TensorSpec]]
    ctx_open: bool = False
    ctx_open_by: str = ""
    batch_names: frozenset[str] = frozenset()
    batch_known: bool = False


def check_chain(
    stages: Sequence[Union[Stage, tuple]],
    *,
    batch_spec: Union[str, Sequence[TensorSpec], None] = None,
    model_output_count: Optional[int] = None,
    batch_columns: Optional[Sequence[str]] = None,
) -> list[Problem]:
    """Walk preprocessors -> model -> postprocessors -> loss and report every misfit at once.

    `batch_spec` describes what the data loader yields (None: unknown, the first stage is trusted).
    `model_output_count` says how many outputs the model returns when its contract does not.
    `batch_columns` names the batch's columns when its tensors are not described (() for none): a
    loss reading a context key that neither a stage nor the batch provides is then an error.
    Problems carry the stage name as their key and a rule id: contract.mismatch (rank, dtype or
    count), contract.ctx-missing, contract.output-index, contract.syntax, contract.unchecked.
    """
    specs = parse_specs(batch_spec) if isinstance(batch_spec, str) else batch_spec
    flow = _Flow(
        tensors=None if specs is None else tuple(specs),
        producer="the batch",
        ctx={},
        batch_names=frozenset(s.name for s in specs or ()) | frozenset(batch_columns or ()),
        batch_known=specs is not None or batch_columns is not None,
    )
    problems: list[Problem] = []
    for item in stages:
        stage = item if isinstance(item, Stage) else Stage(*item)
        if stage.role not in ROLES:
            raise ValueError(f"stage {stage.name!r}: role {stage.role!r} is not one of {ROLES}")
        problems += _check_stage(stage, flow, model_output_count)
    return problems


def _check_stage(stage: Stage, flow: _Flow, model_output_count: Optional[int]) -> list[Problem]:
    problems: list[Problem] = []
    parsed = True
    try:
        contract = as_contract(stage.contract)
    except ContractSyntaxError as exc:
        parsed = False
        problems.append(
            Problem(
                stage.name,
                f"its contract does not parse: {exc}",
                rule="contract.syntax",
                fix="see the contract grammar in the docstring of ditty/contracts/__init__.py",
            )
        )
        contract = None
    if stage.role == "loss":
        problems += _check_output_index(stage, flow)
    if contract is None:
        if parsed:  # no contract (None or ""); one that failed to parse is reported above
            problems.append(
                Problem(
                    stage.name,
                    "declares no contract; its inputs and outputs are unchecked",
                    severity="warning",
                    rule="contract.unchecked",
                    fix='give it a contract such as "x:4:f32 -> y:4:f32"',
                )
            )
        _forget(flow, stage, model_output_count)
        return problems
    problems += _check_inputs(stage, contract, flow)
    problems += _check_ctx_reads(stage, contract, flow)
    _advance(flow, stage, contract)
    return problems


def _check_inputs(stage: Stage, contract: Contract, flow: _Flow) -> list[Problem]:
    if flow.tensors is None:
        return []
    if stage.role == "loss":
        indices = _output_indices(stage)
        chosen = _chosen_output(indices[0], flow.tensors) if len(indices) == 1 else None
        if chosen is None or not contract.inputs:
            return []  # a composite loss's parts each pick their own output: no single prediction
        problems = _compare(stage.name, contract.inputs[0], chosen, f"output {indices[0]!r} of {flow.producer}")
        return problems + _check_other_loss_inputs(stage, contract, flow)
    if len(contract.inputs) > len(flow.tensors):
        return [
            Problem(
                stage.name,
                f"takes {len(contract.inputs)} tensor(s) but {flow.producer} produces "
                f"{len(flow.tensors)} ({', '.join(map(str, flow.tensors)) or 'none'})",
                rule="contract.mismatch",
                fix="make the two contracts list the same tensors",
            )
        ]
    problems = []
    by_name = {spec.name: (index, spec) for index, spec in enumerate(flow.tensors)}
    for index, wanted in enumerate(contract.inputs):
        index, given = by_name.get(wanted.name, (index, flow.tensors[index]))
        problems += _compare(stage.name, wanted, given, f"{flow.producer}'s `{given.name}` (position {index})")
    return problems


def _check_other_loss_inputs(stage: Stage, contract: Contract, flow: _Flow) -> list[Problem]:
    """A loss's tensors after the first (the original Ditty's "logits:4:f, z0_pred:4:f -> loss")
    are other outputs of the producer, found by name."""
    problems = []
    by_name = {spec.name: spec for spec in flow.tensors or ()}
    for wanted in contract.inputs[1:]:
        given = by_name.get(wanted.name)
        if given is None:
            problems.append(
                Problem(
                    stage.name,
                    f"takes `{wanted.name}`, which {flow.producer} does not produce "
                    f"({', '.join(map(str, flow.tensors or ())) or 'no outputs'})",
                    rule="contract.mismatch",
                    fix="name an output the producer declares, or drop it from the loss's contract",
                )
            )
        else:
            problems += _compare(stage.name, wanted, given, f"{flow.producer}'s `{given.name}`")
    return problems


def _check_ctx_reads(stage: Stage, contract: Contract, flow: _Flow) -> list[Problem]:
    problems = []
    for wanted in contract.ctx_inputs:
        provided, given = _provided(flow, wanted.name)
        if provided:
            if given is not None:
                problems += _compare(stage.name, wanted, given, f"ctx.{wanted.name} as provided")
            continue
        if flow.ctx_open:  # a stage without a contract ran before: it may have provided the key
            problems.append(
                Problem(
                    stage.name,
                    f"reads ctx.{wanted.name}, which no stage that declares a contract provides; "
                    f"fine only if {flow.ctx_open_by} (no contract) adds it",
                    severity="warning",
                    rule="contract.ctx-missing",
                    fix=f"give {flow.ctx_open_by} a contract that declares '| ctx.{wanted.name}'",
                )
            )
            continue
        if stage.role == "loss" and wanted.name in flow.batch_names:
            continue  # a loss falls back to the batch's columns (ditty.loss._lookup)
        if stage.role == "loss" and not flow.batch_known:
            problems.append(
                Problem(
                    stage.name,
                    f"reads ctx.{wanted.name}, which no earlier stage provides; fine only if the batch has that column",
                    severity="warning",
                    rule="contract.ctx-missing",
                )
            )
            continue
        problems.append(
            Problem(
                stage.name,
                f"reads ctx.{wanted.name} before any stage provides it",
                rule="contract.ctx-missing",
                fix=f"add a stage that declares '| ctx.{wanted.name}', or read another key",
            )
        )
    return problems


def _check_output_index(stage: Stage, flow: _Flow) -> list[Problem]:
    if flow.tensors is None:
        return []
    names = ", ".join(f"{i}: {s}" for i, s in enumerate(flow.tensors)) or "none"
    return [
        Problem(
            stage.name,
            f"output_index {index!r} does not exist: {flow.producer} declares {len(flow.tensors)} output(s) ({names})",
            rule="contract.output-index",
            fix=f"use an output_index between 0 and {len(flow.tensors) - 1}" if flow.tensors else "",
        )
        for index in _output_indices(stage)
        if _chosen_output(index, flow.tensors) is None
    ]


def _output_indices(stage: Stage) -> tuple[OutputIndex, ...]:
    index = stage.output_index
    if index is None:
        return (0,)
    return (index,) if isinstance(index, (int, str)) else tuple(index)


def _chosen_output(index: OutputIndex, tensors: tuple[TensorSpec, ...]) -> Optional[TensorSpec]:
    if isinstance(index, str):
        return next((s for s in tensors if s.name == index), None)
    return tensors[index] if -len(tensors) <= index < len(tensors) else None


def _compare(stage: str, wanted: TensorSpec, given: TensorSpec, source: str) -> list[Problem]:
    """Rank and dtype of what a stage consumes against what it is given; "any" matches anything."""
    faults = []
    if wanted.rank is not None and given.rank is not None and wanted.rank != given.rank:
        faults.append(f"rank {wanted.rank}, but {source} is rank {given.rank}")
    if wanted.dtype is not None and given.dtype is not None and not dtypes_overlap(wanted.dtype, given.dtype):
        faults.append(f"dtype {wanted.dtype}, but {source} is {given.dtype}")
    return [
        Problem(
            stage,
            f"expects `{wanted.name}` with {fault}",
            rule="contract.mismatch",
            fix="make the producer and the consumer declare the same rank and dtype",
        )
        for fault in faults
    ]


def _provided(flow: _Flow, key: str) -> tuple[bool, Optional[TensorSpec]]:
    """Whether `key` is in the context: added by a stage (or under a dotted prefix a stage added:
    ctx.forward_kwargs covers ctx.forward_kwargs.t), or provided by the trainer. The spec is
    returned only for an exact match with a stage's declaration."""
    if key in flow.ctx:
        return True, flow.ctx[key]
    parts = key.split(".")
    if key in TRAINER_CTX_KEYS or parts[0] in ("batch", "original_batch"):
        return True, None
    return any(".".join(parts[:n]) in flow.ctx for n in range(1, len(parts))), None


def _advance(flow: _Flow, stage: Stage, contract: Contract) -> None:
    flow.ctx.update({spec.name: spec for spec in contract.ctx_outputs})
    if stage.role == "model" and flow.tensors is not None:
        # the loss's fallback also looks in ctx["batch"], the batch as the model received it
        flow.batch_names |= {spec.name for spec in flow.tensors}
    if stage.role != "loss":
        flow.tensors, flow.producer = contract.outputs, f"`{stage.name}`"


def _forget(flow: _Flow, stage: Stage, model_output_count: Optional[int]) -> None:
    """After an unchecked stage: tensors unknown (their count too, except a model's declared count),
    and any context key may now exist."""
    if stage.role == "loss":
        return  # a loss (or a composite loss's part) adds nothing that a later stage reads
    flow.ctx_open, flow.ctx_open_by = True, flow.ctx_open_by or f"`{stage.name}`"
    flow.producer = f"`{stage.name}`"
    if stage.role == "model" and model_output_count is not None:
        flow.tensors = tuple(TensorSpec(f"output{i}") for i in range(model_output_count))
    else:
        flow.tensors = None
