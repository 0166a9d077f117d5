"""Problems found in a recipe, and the one error type that carries them to the user.

A `Problem` names the dotted key, says what is wrong and how to fix it, and knows its TOML line when
the recipe came from a file. The command line prints a `RecipeError` as a short list (never a
traceback) and exits with code 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass(frozen=True)
class Problem:
    key: str
    """Dotted path of the offending value ("optimizer.lr"), or "" for the whole recipe."""
    message: str
    fix: str = ""
    severity: Literal["error", "warning"] = "error"
    line: Optional[int] = None
    rule: str = ""
    """Id of the compiler rule that found it (empty for loader problems)."""

    def format(self, source: str | None = None) -> str:
        where = ""
        if source and self.line:
            where = f"{source}:{self.line}: "
        elif source:
            where = f"{source}: "
        elif self.line:
            where = f"line {self.line}: "
        key = f"`{self.key}` " if self.key else ""
        text = f"{where}{key}{self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


def error(key: str, message: str, fix: str = "") -> Problem:
    """A compiler error at `key` (the recipe cannot run as written)."""
    return Problem(key, message, fix=fix)


def warning(key: str, message: str, fix: str = "") -> Problem:
    """A compiler warning at `key` (the recipe runs, but likely not as meant)."""
    return Problem(key, message, fix=fix, severity="warning")


@dataclass
class RecipeError(Exception):
    """A user error: a recipe, flag, file or data problem. Exit code 2, no traceback."""

    problems: list[Problem] = field(default_factory=list)
    source: Optional[str] = None

    def __post_init__(self) -> None:
        super().__init__(self.format())

    @classmethod
    def single(cls, message: str, key: str = "", fix: str = "", source: str | None = None) -> "RecipeError":
        return cls([Problem(key=key, message=message, fix=fix)], source=source)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def format(self) -> str:
        errors = self.errors or self.problems
        head = f"{len(errors)} problem{'s' if len(errors) != 1 else ''} in the recipe" if len(errors) > 1 else ""
        body = "\n".join(f"error: {p.format(self.source)}" for p in errors)
        return f"{head}\n{body}" if head else body

    def __str__(self) -> str:
        return self.format()

    def __reduce__(self):
        # Exceptions pickle as cls(*args), and args holds the formatted text, not the problems: rebuild
        # from the fields instead, so an error can travel between ranks (broadcast_object_list).
        return (type(self), (self.problems, self.source))
