"""The contract types and the parser of the terse syntax (grammar in the package docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

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
