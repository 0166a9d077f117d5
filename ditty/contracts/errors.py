"""The exceptions of the contract package.

`ContractParseError` and `ContractViolation` are the original Ditty's names: code written for it
catches them, so ditty raises subclasses of both. `ContractSyntaxError` (a `ContractParseError`)
is what the parser raises, with the column of the fault and a caret under it. `ContractViolation`
is also a `RecipeError` (exit code 2, no traceback from the command line): real tensors that do not
match a declared contract are a user error, found by the first-step check or by
`Contract.validate_inputs` / `TensorSpec.validate`.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ditty.config.errors import Problem, RecipeError


class ContractParseError(ValueError):
    """A contract that cannot be used: a string that does not parse, or an empty one."""


class ContractSyntaxError(ContractParseError):
    """A contract string that does not parse; the message draws a caret under the bad character."""

    def __init__(self, text: str, position: int, reason: str) -> None:
        self.text = text
        self.position = position
        """0-based index of the offending character (len(text) when the string ended too early)."""
        self.column = position + 1
        self.reason = reason
        super().__init__(f"contract syntax error at column {self.column}: {reason}\n  {text}\n  {' ' * position}^")


class ContractViolation(RecipeError):
    """Real tensors that do not match a declared contract (a RecipeError naming the stage).

    Takes the problems found, or a message, as the original's `raise ContractViolation("...")` does.
    """

    def __init__(self, problems: Union[str, Sequence[Problem]] = (), source: Optional[str] = None) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems, rule="contract.tensor", fix="fix the contract or the stage")]
        super().__init__(list(problems), source)


class ContractChainError(RecipeError, ContractParseError):
    """Contracts of a pipeline's stages that do not chain: a RecipeError naming each stage, and a
    ContractParseError, which the original Ditty raised for the same misfit."""
