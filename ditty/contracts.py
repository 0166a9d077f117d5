"""Stage contracts: what each pipeline stage takes and gives, checked before anything runs.

A stage (preprocessor, model, postprocessor, loss) may declare a terse contract string:

    "x:4:f32, ctx.t:1:i64 -> eps:4:f32 | ctx.target:4:f32"

Grammar (spaces are allowed around every token):

    contract  := tensors "->" tensors [ "|" adds ]
    tensors   := [ item ("," item)* ]              an empty side is allowed ("-> loss:0:f32")
    item      := NAME spec                          a tensor passed along the pipeline
               | "ctx." KEY spec                    (input side only) a context entry the stage reads
    adds      := "ctx." KEY spec ("," "ctx." KEY spec)*   context entries the stage adds
    spec      := [ ":" [RANK] [ ":" DTYPE ] ]
    NAME      := [A-Za-z_][A-Za-z0-9_]*             ("ctx" is reserved)
    KEY       := NAME ("." NAME)*                    a dotted path: ctx.forward_kwargs.t is ctx["forward_kwargs"]["t"]
    RANK      := a non-negative integer (number of dimensions, batch dimension included) | "*"
    DTYPE     := f64 f32 f16 bf16 i64 i32 i16 i8 u8 bool | "*"

An omitted rank or dtype means "any", the same as "*": `x`, `x:*:*` and `x::` are one spec.
`str(contract)` writes the canonical form (tensors first, then ctx reads; "*" for any), which
parses back to an equal Contract.

How stages chain (`check_chain`): each tensor a stage takes is matched with the tensor of the same
name that the previous stage (or the batch) produces, else with the one at the same position. A
stage may ignore some of what it is given (a model ignores a batch's labels) but cannot take more
tensors than there are. Real values bind the same way (`bind_tensors`): a dict by key, a tuple by
position. The context is a dict that travels alongside: a stage may read only keys that the
trainer or an earlier stage provides. The loss sees the model's (post-processed) output through its `output_index`, so its
first tensor input is compared with that one output only. A stage without a contract is allowed;
it is reported as unchecked, and what comes after it is checked against unknown shapes.

Layer 1: stdlib only at import time; torch is imported inside `check_tensors`' helpers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

from ditty.config.errors import Problem

DTYPES: dict[str, str] = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "bool": "bool",
}
"""Dtype codes of the contract syntax -> torch dtype attribute names."""

ANY = "*"
CTX = "ctx"
TRAINER_CTX_KEYS = ("forward_kwargs", "original_batch", "batch")
"""Context keys the trainer provides before the first stage runs (see ditty.processors.Context).
forward_kwargs starts empty, so ctx.forward_kwargs.t must still come from a stage; entries under
batch and original_batch are the batch's own and are not checked."""


class ContractSyntaxError(ValueError):
    """A contract string that does not parse; the message draws a caret under the bad character."""

    def __init__(self, text: str, position: int, reason: str) -> None:
        self.text = text
        self.position = position
        """0-based index of the offending character (len(text) when the string ended too early)."""
        self.column = position + 1
        self.reason = reason
        super().__init__(f"contract syntax error at column {self.column}: {reason}\n  {text}\n  {' ' * position}^")


@dataclass(frozen=True)
class TensorSpec:
    """One declared tensor: a name (or context key), its rank and dtype code; None means any."""

    name: str
    rank: Optional[int] = None
    dtype: Optional[str] = None

    def __str__(self) -> str:
        if self.rank is None and self.dtype is None:
            return self.name
        rank = ANY if self.rank is None else str(self.rank)
        return f"{self.name}:{rank}" if self.dtype is None else f"{self.name}:{rank}:{self.dtype}"


@dataclass(frozen=True)
class Contract:
    """A parsed contract. `inputs`/`outputs` are the tensors passed along, by position;
    `ctx_inputs` are the context keys the stage reads, `ctx_outputs` those it adds."""

    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    ctx_outputs: tuple[TensorSpec, ...] = ()
    ctx_inputs: tuple[TensorSpec, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Contract":
        return parse_contract(text)

    def __str__(self) -> str:
        left = [str(s) for s in self.inputs] + [f"{CTX}.{s}" for s in self.ctx_inputs]
        text = f"{', '.join(left)} -> {', '.join(str(s) for s in self.outputs)}".strip()
        if self.ctx_outputs:
            text += " | " + ", ".join(f"{CTX}.{s}" for s in self.ctx_outputs)
        return text


# --- parsing ----------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[0-9]+")
_DTYPE = re.compile(r"[A-Za-z0-9_]+|\*")


class _Scanner:
    """A cursor over the contract text; every failure is raised at the cursor's column."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, literal: str) -> bool:
        self.skip_spaces()
        return self.text.startswith(literal, self.pos)

    def accept(self, literal: str) -> bool:
        if self.peek(literal):
            self.pos += len(literal)
            return True
        return False

    def match(self, pattern: re.Pattern) -> Optional[str]:
        self.skip_spaces()
        found = pattern.match(self.text, self.pos)
        if not found:
            return None
        self.pos = found.end()
        return found.group()

    def at_end(self) -> bool:
        self.skip_spaces()
        return self.pos >= len(self.text)

    def at_item_end(self) -> bool:
        """Whether the current tensor item is over (what may follow an omitted rank or dtype)."""
        return self.at_end() or any(self.peek(token) for token in (",", "->", "|"))

    def fail(self, reason: str, position: Optional[int] = None) -> ContractSyntaxError:
        self.skip_spaces()
        return ContractSyntaxError(self.text, self.pos if position is None else position, reason)

    def what_is_here(self) -> str:
        return "the end of the contract" if self.at_end() else repr(self.text[self.pos])


def parse_contract(text: str) -> Contract:
    """Parse the terse syntax of the module docstring; raise ContractSyntaxError pointing at the fault."""
    if not isinstance(text, str):
        raise TypeError(f"a contract is a string, not {type(text).__name__}")
    scan = _Scanner(text)
    inputs, ctx_inputs = _parse_side(scan, side="input")
    if not scan.accept("->"):
        raise scan.fail(f"expected ',' or '->' between inputs and outputs, found {scan.what_is_here()}")
    outputs, _ = _parse_side(scan, side="output")
    ctx_outputs: list[TensorSpec] = []
    if scan.accept("|"):
        ctx_outputs = _parse_adds(scan)
    if not scan.at_end():
        expected = "',' or the end" if ctx_outputs else "',', '|' or the end"
        raise scan.fail(f"expected {expected}, found {scan.what_is_here()}")
    return Contract(tuple(inputs), tuple(outputs), tuple(ctx_outputs), tuple(ctx_inputs))


def parse_specs(text: str) -> tuple[TensorSpec, ...]:
    """A bare comma-separated tensor list ("input_ids:2:i64, labels:2:i64"), e.g. a batch's."""
    scan = _Scanner(text)
    specs, _ = _parse_side(scan, side="output")
    if not scan.at_end():
        raise scan.fail(f"expected ',' or the end, found {scan.what_is_here()}")
    return tuple(specs)


def _parse_side(scan: _Scanner, side: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    tensors: list[TensorSpec] = []
    reads: list[TensorSpec] = []
    if scan.at_end() or scan.peek("->") or scan.peek("|"):
        return tensors, reads
    while True:
        scan.skip_spaces()
        start = scan.pos
        is_ctx, spec = _parse_item(scan)
        if is_ctx and side == "output":
            raise scan.fail("context keys a stage adds go after '|' (\"... -> y | ctx.key:1:i64\")", start)
        _reject_duplicate(scan, reads if is_ctx else tensors, spec, start)
        (reads if is_ctx else tensors).append(spec)
        if not scan.accept(","):
            return tensors, reads


def _parse_adds(scan: _Scanner) -> list[TensorSpec]:
    adds: list[TensorSpec] = []
    while True:
        scan.skip_spaces()
        start = scan.pos
        is_ctx, spec = _parse_item(scan)
        if not is_ctx:
            raise scan.fail(f"after '|' come context keys: write ctx.{spec.name}", start)
        _reject_duplicate(scan, adds, spec, start)
        adds.append(spec)
        if not scan.accept(","):
            return adds


def _parse_item(scan: _Scanner) -> tuple[bool, TensorSpec]:
    scan.skip_spaces()
    start = scan.pos
    name = scan.match(_NAME)
    if name is None:
        raise scan.fail(f"expected a tensor name or ctx.KEY, found {scan.what_is_here()}")
    is_ctx = name == CTX
    if is_ctx:
        if not scan.text.startswith(".", scan.pos):
            raise scan.fail("'ctx' is reserved for context keys: write ctx.KEY", start)
        name = _parse_key(scan)
    rank, dtype = _parse_spec(scan)
    return is_ctx, TensorSpec(name, rank, dtype)


def _parse_key(scan: _Scanner) -> str:
    parts = []
    while scan.text.startswith(".", scan.pos):
        scan.pos += 1
        found = _NAME.match(scan.text, scan.pos)
        if not found:
            raise scan.fail("expected a key name after '.'", scan.pos)
        parts.append(found.group())
        scan.pos = found.end()
    return ".".join(parts)


def _parse_spec(scan: _Scanner) -> tuple[Optional[int], Optional[str]]:
    if not scan.accept(":"):
        return None, None
    rank = None
    if scan.accept(ANY):
        pass
    elif (digits := scan.match(_INT)) is not None:
        rank = int(digits)
    elif not (scan.peek(":") or scan.at_item_end()):
        raise scan.fail(f"expected a rank (a non-negative integer or '*'), found {scan.what_is_here()}")
    if not scan.accept(":"):
        return rank, None
    scan.skip_spaces()
    start = scan.pos
    code = scan.match(_DTYPE)
    if code is None:
        if scan.at_item_end():
            return rank, None
        raise scan.fail(f"expected a dtype code, found {scan.what_is_here()}")
    if code != ANY and code not in DTYPES:
        raise scan.fail(f"unknown dtype {code!r}; use one of {', '.join(DTYPES)} or '*'", start)
    return rank, (None if code == ANY else code)


def _reject_duplicate(scan: _Scanner, seen: list[TensorSpec], spec: TensorSpec, start: int) -> None:
    if any(other.name == spec.name for other in seen):
        raise scan.fail(f"{spec.name!r} is declared twice on this side", start)


def as_contract(value: Union[Contract, str, None]) -> Optional[Contract]:
    """A Contract from a stage's `contract` attribute (a string, a Contract, or None)."""
    return parse_contract(value) if isinstance(value, str) else value


# --- checking a chain of stages ---------------------------------------------------------------

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
    batch_names: frozenset[str] = frozenset()
    batch_known: bool = False


def check_chain(
    stages: Sequence[Union[Stage, tuple]],
    *,
    batch_spec: Union[str, Sequence[TensorSpec], None] = None,
    model_output_count: Optional[int] = None,
) -> list[Problem]:
    """Walk preprocessors -> model -> postprocessors -> loss and report every misfit at once.

    `batch_spec` describes what the data loader yields (None: unknown, the first stage is trusted).
    `model_output_count` says how many outputs the model returns when its contract does not.
    Problems carry the stage name as their key and a rule id: contract.mismatch (rank, dtype or
    count), contract.ctx-missing, contract.output-index, contract.syntax, contract.unchecked.
    """
    specs = parse_specs(batch_spec) if isinstance(batch_spec, str) else batch_spec
    flow = _Flow(
        tensors=None if specs is None else tuple(specs),
        producer="the batch",
        ctx={},
        batch_names=frozenset(s.name for s in specs or ()),
        batch_known=specs is not None,
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
    try:
        contract = as_contract(stage.contract)
    except ContractSyntaxError as exc:
        problems.append(Problem(stage.name, f"its contract does not parse: {exc}", rule="contract.syntax",
                                fix="see the contract grammar in ditty/contracts.py"))
        contract = None
    if stage.role == "loss":
        problems += _check_output_index(stage, flow)
    if contract is None:
        if stage.contract is None:  # (a contract that failed to parse is reported above)
            problems.append(Problem(stage.name, "declares no contract; its inputs and outputs are unchecked",
                                    severity="warning", rule="contract.unchecked",
                                    fix='give it a contract such as "x:4:f32 -> y:4:f32"'))
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
        return _compare(stage.name, contract.inputs[0], chosen, f"output {indices[0]!r} of {flow.producer}")
    if len(contract.inputs) > len(flow.tensors):
        return [Problem(stage.name, f"takes {len(contract.inputs)} tensor(s) but {flow.producer} produces "
                        f"{len(flow.tensors)} ({', '.join(map(str, flow.tensors)) or 'none'})",
                        rule="contract.mismatch", fix="make the two contracts list the same tensors")]
    problems = []
    by_name = {spec.name: (index, spec) for index, spec in enumerate(flow.tensors)}
    for index, wanted in enumerate(contract.inputs):
        index, given = by_name.get(wanted.name, (index, flow.tensors[index]))
        problems += _compare(stage.name, wanted, given, f"{flow.producer}'s `{given.name}` (position {index})")
    return problems


def _check_ctx_reads(stage: Stage, contract: Contract, flow: _Flow) -> list[Problem]:
    problems = []
    for wanted in contract.ctx_inputs:
        provided, given = _provided(flow, wanted.name)
        if provided:
            if given is not None:
                problems += _compare(stage.name, wanted, given, f"ctx.{wanted.name} as provided")
            continue
        if flow.ctx_open:
            continue  # an unchecked stage ran before: it may have provided the key
        if stage.role == "loss" and wanted.name in flow.batch_names:
            continue  # a loss falls back to the batch's columns (ditty.loss._lookup)
        if stage.role == "loss" and not flow.batch_known:
            problems.append(Problem(stage.name, f"reads ctx.{wanted.name}, which no earlier stage provides; "
                                    "fine only if the batch has that column", severity="warning",
                                    rule="contract.ctx-missing"))
            continue
        problems.append(Problem(stage.name, f"reads ctx.{wanted.name} before any stage provides it",
                                rule="contract.ctx-missing",
                                fix=f"add a stage that declares '| ctx.{wanted.name}', or read another key"))
    return problems


def _check_output_index(stage: Stage, flow: _Flow) -> list[Problem]:
    if flow.tensors is None:
        return []
    names = ", ".join(f"{i}: {s}" for i, s in enumerate(flow.tensors)) or "none"
    return [Problem(stage.name, f"output_index {index!r} does not exist: {flow.producer} declares "
                    f"{len(flow.tensors)} output(s) ({names})", rule="contract.output-index",
                    fix=f"use an output_index between 0 and {len(flow.tensors) - 1}" if flow.tensors else "")
            for index in _output_indices(stage) if _chosen_output(index, flow.tensors) is None]


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
    if wanted.dtype is not None and given.dtype is not None and wanted.dtype != given.dtype:
        faults.append(f"dtype {wanted.dtype}, but {source} is {given.dtype}")
    return [Problem(stage, f"expects `{wanted.name}` with {fault}", rule="contract.mismatch",
                    fix="make the producer and the consumer declare the same rank and dtype")
            for fault in faults]


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
    flow.ctx_open = True
    if stage.role == "loss":
        return
    flow.producer = f"`{stage.name}`"
    if stage.role == "model" and model_output_count is not None:
        flow.tensors = tuple(TensorSpec(f"output{i}") for i in range(model_output_count))
    else:
        flow.tensors = None


# --- checking real tensors (the optional first-step check) ------------------------------------

def check_tensors(contract: Union[Contract, str], tensors_by_name: Mapping[str, Any], *,
                  side: str = "inputs", stage: str = "") -> list[Problem]:
    """Compare real values with one side of a contract: rank (ndim) and dtype of each named tensor.

    `tensors_by_name` maps the contract's names to values; context entries are keyed "ctx.KEY"
    (`bind_tensors` builds this mapping from a batch or model output and the context). A declared
    name that is missing, or a value that is not a tensor, is a problem too.
    """
    import torch

    contract = as_contract(contract)
    if side not in ("inputs", "outputs"):
        raise ValueError(f"side must be 'inputs' or 'outputs', not {side!r}")
    tensors, ctx = ((contract.inputs, contract.ctx_inputs) if side == "inputs"
                    else (contract.outputs, contract.ctx_outputs))
    problems = []
    for label, spec in [(s.name, s) for s in tensors] + [(f"{CTX}.{s.name}", s) for s in ctx]:
        if label not in tensors_by_name:
            problems.append(Problem(stage, f"declares {side[:-1]} `{label}`, but it was not found",
                                    rule="contract.tensor"))
            continue
        value = tensors_by_name[label]
        if not torch.is_tensor(value):
            problems.append(Problem(stage, f"{side[:-1]} `{label}` is a {type(value).__name__}, not a tensor",
                                    rule="contract.tensor"))
            continue
        problems += _compare_real(stage, side[:-1], label, spec, value)
    return problems


def _compare_real(stage: str, what: str, label: str, spec: TensorSpec, value: Any) -> list[Problem]:
    import torch

    faults = []
    if spec.rank is not None and value.dim() != spec.rank:
        faults.append(f"rank {spec.rank} declared, but the tensor has shape {tuple(value.shape)}")
    if spec.dtype is not None and value.dtype != getattr(torch, DTYPES[spec.dtype]):
        faults.append(f"dtype {spec.dtype} declared, but the tensor is {str(value.dtype).removeprefix('torch.')}")
    return [Problem(stage, f"{what} `{label}`: {fault}", rule="contract.tensor",
                    fix="fix the contract or the stage") for fault in faults]


def bind_tensors(contract: Union[Contract, str], value: Any, ctx: Optional[Mapping] = None, *,
                 side: str = "inputs") -> dict[str, Any]:
    """Name the real values of one side of a stage for `check_tensors`.

    A dict (or Hugging Face ModelOutput) binds by key; a tuple or list by position; a single value
    is the first tensor. Context entries are looked up along their dotted key.
    """
    contract = as_contract(contract)
    tensors, ctx_specs = ((contract.inputs, contract.ctx_inputs) if side == "inputs"
                          else (contract.outputs, contract.ctx_outputs))
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
