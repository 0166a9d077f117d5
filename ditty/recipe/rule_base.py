"""What a compiler rule is: a function of a `Context` (the config, where each value came from, the
world size) registered with `@rule("area.name")`, yielding `Problem`s made by `error` or `warning`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ditty.config.errors import Problem, error, warning  # noqa: F401  (rules import them from here)
from ditty.config.schema import walk_leaves


@dataclass(frozen=True)
class Context:
    config: Any
    provenance: dict[str, str]
    world_size: int

    @property
    def data_parallel_size(self) -> int:
        """Ranks that take different rows of the batch: the world, less its tensor- and context-parallel
        groups (whose ranks share rows). A world that tp x cp does not divide is the mesh rule's to report."""
        parallel = self.config.parallel
        degree = max(1, parallel.tp) * max(1, parallel.cp)
        return (
            self.world_size // degree
            if self.world_size % degree == 0 and self.world_size >= degree
            else self.world_size
        )

    def is_set(self, path: str) -> bool:
        """Whether the user gave this value (TOML or flag) and it differs from the default.

        A complete recipe (as `ditty init` writes) spells out every default; those are not choices.
        """
        if self.provenance.get(path, "default") == "default":
            return False
        return value_at(self.config, path) != _defaults(type(self.config)).get(path)


@dataclass(frozen=True)
class Rule:
    id: str
    check: Callable[[Context], Iterable[Problem]]
    doc: str


ALL_RULES: list[Rule] = []


def rule(rule_id: str) -> Callable:
    def register(function: Callable[[Context], Iterator[Problem]]) -> Callable:
        ALL_RULES.append(Rule(rule_id, function, (function.__doc__ or "").strip()))
        return function

    return register


@functools.cache
def _defaults(schema: type) -> dict[str, Any]:
    return {leaf.path: leaf.default for leaf in walk_leaves(schema)}


def value_at(config: Any, path: str) -> Any:
    """The value at a dotted path ("train.steps") of a config."""
    for part in path.split("."):
        config = getattr(config, part)
    return config
