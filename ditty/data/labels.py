"""The label set of the classifying formats: the labels of the training rows, in id order.

`LabelSpace` becomes the model config's num_labels / id2label / label2id, and is saved with each
checkpoint so a resume and an export keep the same ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

_DEFAULT_LABEL = re.compile(r"LABEL_\d+")


@dataclass(frozen=True)
class LabelSpace:
    """The labels of the training data, in id order (`names[i]` is the name of id i)."""

    names: tuple[str, ...]
    seen: frozenset
    """Label values that occur in the training data (ints or strings, as written there)."""
    integer: bool
    """The data's labels are integers, used as the ids themselves."""

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, value: Any) -> Optional[int]:
        if value not in self.seen:
            return None
        return int(value) if self.integer else self.names.index(value)

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "seen": sorted(self.seen, key=str), "integer": self.integer}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "LabelSpace":
        return cls(tuple(doc["names"]), frozenset(doc["seen"]), bool(doc["integer"]))

    @classmethod
    def from_values(cls, values: set, hint: Optional[Sequence[str]] = None) -> "LabelSpace":
        """From the training data's label values. `hint`: a pretrained classifier's id2label names;
        kept (so its head keeps meaning the same classes) when it is not transformers' default
        LABEL_i and covers the data's labels."""
        useful_hint = list(hint or ())
        if not useful_hint or all(_DEFAULT_LABEL.fullmatch(str(name)) for name in useful_hint):
            useful_hint = []
        if all(isinstance(value, int) for value in values):
            size = max(values) + 1
            names = useful_hint if len(useful_hint) >= size else [str(i) for i in range(size)]
            return cls(tuple(names), frozenset(values), True)
        if useful_hint and set(values) <= set(useful_hint):
            return cls(tuple(useful_hint), frozenset(values), False)
        return cls(tuple(sorted(values)), frozenset(values), False)


def label_value(value: Any) -> Any:
    """A label as the data means it: an integral float (CSV) is an int; other values as they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def label_problem(value: Any, column: str) -> Optional[str]:
    """Why a label is unusable, or None: labels are strings or class ids (integers, 0 or more)."""
    value = label_value(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return f"{column!r} should be a string or an integer, got {type(value).__name__} {value!r}"
    if isinstance(value, int) and value < 0:
        return f"{column!r} is {value}: integer labels are class ids, 0 or more"
    if isinstance(value, str) and not value.strip():
        return f"{column!r} is empty"
    return None


def unknown_label_error(what: str, index: int, value: Any, space: LabelSpace, key: str) -> Exception:
    from ditty.config.errors import RecipeError

    known = ", ".join(repr(n) for n in sorted(space.seen, key=str)[:12])
    return RecipeError.single(
        f"{what}, row {index + 1}: label {value!r} never occurs in the training data (labels there: {known})",
        key=key,
        fix="validate on labels the model was trained on: fix the row, or add that label to the training data",
    )


def column_values(dataset: Any, column: str) -> list:
    """One column of a `datasets.Dataset` (or a list of dicts) as a list."""
    if hasattr(dataset, "column_names"):
        return list(dataset[column])
    return [row[column] for row in dataset]
