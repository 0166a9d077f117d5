"""The contract types and the parser of the terse syntax (grammar in the package docstring)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ditty.contracts.errors import ContractSyntaxError, ContractViolation

DTYPES: dict[str, str] = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u8": "uint8",
    "bool": "bool",
}
"""Dtype codes of the contract syntax -> torch dtype attribute names."""

DTYPE_WILDCARDS: dict[str, tuple[str, ...]] = {
    "f": ("float16", "bfloat16", "float32", "float64"),
    "i": ("int8", "int16", "int32", "int64"),
    "b": ("bool",),
}
"""Codes that stand for several dtypes (the original Ditty's): any float, any signed int, bool."""

ANY = "*"
CTX = "ctx"
TRAINER_CTX_KEYS = ("forward_kwargs", "original_batch", "batch")
"""Context keys the trainer provides before the first stage runs (see ditty.processors.Context).
forward_kwargs starts empty, so ctx.forward_kwargs.t must still come from a stage; entries under
batch and original_batch are the batch's own and are not checked."""


def dtype_names(code: str) -> tuple[str, ...]:
    """The torch dtype names a dtype code accepts ("f32" -> float32; "f" -> every float)."""
    return DTYPE_WILDCARDS.get(code) or (DTYPES[code],)


def dtypes_overlap(a: str, b: str) -> bool:
    """Whether two declared codes can describe the same tensor ("f" and "f32" can; "f" and "i64" cannot)."""
    return bool(set(dtype_names(a)) & set(dtype_names(b)))


@dataclass(frozen=True)
class TensorSpec:
    """One declared tensor: a name (or context key), its rank and dtype code; None means any.

    `is_ctx` marks a context entry (the original Ditty's field); it is informational and does not
    take part in equality: a Contract keeps context entries in `ctx_inputs` / `ctx_outputs`.
    """

    name: str
    rank: Optional[int] = None
    dtype: Optional[str] = None
    is_ctx: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        if self.rank is None and self.dtype is None:
            return self.name
        rank = ANY if self.rank is None else str(self.rank)
        return f"{self.name}:{rank}" if self.dtype is None else f"{self.name}:{rank}:{self.dtype}"

    def validate(self, tensor: Any) -> None:
        """Raise ContractViolation when `tensor` does not have this rank and dtype."""
        from ditty.contracts.tensors import compare_real

        label = f"{CTX}.{self.name}" if self.is_ctx else self.name
        problems = compare_real("", "tensor", label, self, tensor)
        if problems:
            raise ContractViolation(problems)


@dataclass(frozen=True)
class Contract:
    """A parsed contract. `inputs`/`outputs` are the tensors passed along, by position;
    `ctx_inputs` are the context keys the stage reads, `ctx_outputs` those it adds.
    `raw` is the text it was parsed from (not part of equality)."""

    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    ctx_outputs: tuple[TensorSpec, ...] = ()
    ctx_inputs: tuple[TensorSpec, ...] = ()
    raw: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> "Contract":
        return parse_contract(text)

    def __str__(self) -> str:
        left = [str(s) for s in self.inputs] + [f"{CTX}.{s}" for s in self.ctx_inputs]
        text = f"{', '.join(left)} -> {', '.join(str(s) for s in self.outputs)}".strip()
        if self.ctx_outputs:
            text += " | " + ", ".join(f"{CTX}.{s}" for s in self.ctx_outputs)
        return text

    # The original Ditty's names for the same things.
    @property
    def ctx_deps(self) -> tuple[TensorSpec, ...]:
        return self.ctx_inputs

    @property
    def input_names(self) -> set[str]:
        return {s.name for s in self.inputs}

    @property
    def output_names(self) -> set[str]:
        return {s.name for s in self.outputs}

    @property
    def ctx_names(self) -> set[str]:
        return {s.name for s in self.ctx_inputs}

    def validate_inputs(self, tensors: Any, ctx: Optional[Mapping] = None) -> None:
        """Raise ContractViolation unless `tensors` (a tuple by position, or a dict by name) and the
        context entries this contract reads match it."""
        self._validate(tensors, ctx or {}, "inputs")

    def validate_outputs(self, tensors: Any) -> None:
        """Raise ContractViolation unless `tensors` match the declared outputs."""
        self._validate(tensors, {}, "outputs")

    def _validate(self, tensors: Any, ctx: Mapping, side: str) -> None:
        from ditty.contracts.tensors import bind_tensors, check_tensors

        declared = self.inputs if side == "inputs" else self.outputs
        if isinstance(tensors, (tuple, list)) and len(tensors) != len(declared):
            raise ContractViolation(f"expected {len(declared)} {side}, got {len(tensors)} ({self})")
        problems = check_tensors(self, bind_tensors(self, tensors, ctx, side=side), side=side)
        if problems:
            raise ContractViolation(problems)


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
    """Parse the terse syntax of the package docstring; raise ContractSyntaxError pointing at the fault.

    An empty string is not a contract (a syntax error here); a stage whose `contract` is "" has none,
    which `as_contract` says.
    """
    if not isinstance(text, str):
        raise TypeError(f"a contract is a string, not {type(text).__name__}")
    if not text.strip():
        raise ContractSyntaxError(text, 0, 'an empty contract; a stage without one has contract None (or "")')
    scan = _Scanner(text)
    inputs, ctx_inputs = _parse_side(scan, side="input")
    if scan.accept("|"):  # the original Ditty's placement: the context keys a stage reads
        ctx_inputs += _parse_ctx_list(scan, reads=ctx_inputs)
        if not scan.accept("->"):
            raise scan.fail(f"expected ',' or '->' after the context keys read, found {scan.what_is_here()}")
    elif not scan.accept("->"):
        raise scan.fail(
            f"expected ',' or '->' between inputs and outputs (or '|' before context keys read), "
            f"found {scan.what_is_here()}"
        )
    outputs, _ = _parse_side(scan, side="output")
    ctx_outputs: list[TensorSpec] = []
    if scan.accept("|"):
        ctx_outputs = _parse_ctx_list(scan)
    if not scan.at_end():
        expected = "',' or the end" if ctx_outputs else "',', '|' or the end"
        raise scan.fail(f"expected {expected}, found {scan.what_is_here()}")
    return Contract(tuple(inputs), tuple(outputs), tuple(ctx_outputs), tuple(ctx_inputs), raw=text)


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


def _parse_ctx_list(scan: _Scanner, reads: Optional[list[TensorSpec]] = None) -> list[TensorSpec]:
    """The list after a '|': context keys a stage adds (output side, `ctx.` required) or, when
    `reads` is given (input side), keys it reads, where the original Ditty also took bare names."""
    found: list[TensorSpec] = []
    while True:
        scan.skip_spaces()
        start = scan.pos
        is_ctx, spec = _parse_item(scan)
        if not is_ctx and reads is None:
            raise scan.fail(f"after '|' come context keys: write ctx.{spec.name}", start)
        spec = TensorSpec(spec.name, spec.rank, spec.dtype, is_ctx=True)
        _reject_duplicate(scan, (reads or []) + found, spec, start)
        found.append(spec)
        if not scan.accept(","):
            return found


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
    return is_ctx, TensorSpec(name, rank, dtype, is_ctx=is_ctx)


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
    if code != ANY and code not in DTYPES and code not in DTYPE_WILDCARDS:
        raise scan.fail(f"unknown dtype {code!r}; use one of {_DTYPE_CHOICES}", start)
    return rank, (None if code == ANY else code)


def _reject_duplicate(scan: _Scanner, seen: list[TensorSpec], spec: TensorSpec, start: int) -> None:
    if any(other.name == spec.name for other in seen):
        raise scan.fail(f"{spec.name!r} is declared twice on this side", start)


_DTYPE_CHOICES = ", ".join(DTYPES) + ", f (any float), i (any int), b (bool) or '*'"


def as_contract(value: Union[Contract, str, None]) -> Optional[Contract]:
    """A Contract from a stage's `contract` attribute (a string, a Contract, or None). An empty or
    blank string means no contract, as in the original Ditty, whose stages default to ""."""
    if isinstance(value, str):
        return parse_contract(value) if value.strip() else None
    return value
