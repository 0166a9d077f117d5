"""Named prompt templates: rows of instruction datasets read as prompt_completion (`data.template`).

A template names the columns it reads and renders a row's prompt from them; its completion column is
what the model learns. "alpaca" is the Stanford Alpaca layout: `instruction`, an optional `input`
(missing, null or empty: the prompt without an input section) and `output`, with Alpaca's own prompt
text, so a model trained here answers prompts written the way Alpaca-trained models expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    required: tuple[str, ...]
    """Columns every row must hold as text; the last is the completion."""
    optional: tuple[str, ...]
    """Columns a row may hold; a missing, null or empty one is left out of the prompt."""
    with_optional: str
    """The prompt when the optional columns are given (str.format over the row's columns)."""
    without_optional: str

    @property
    def completion(self) -> str:
        return self.required[-1]

    def prompt(self, row: Mapping[str, Any]) -> str:
        given = {name: "" if row.get(name) is None else str(row[name]) for name in (*self.required, *self.optional)}
        full = all(given[name].strip() for name in self.optional)
        return (self.with_optional if full else self.without_optional).format(**given)


ALPACA = PromptTemplate(
    name="alpaca",
    required=("instruction", "output"),
    optional=("input",),
    with_optional=(
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
    ),
    without_optional=(
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:\n"
    ),
)

TEMPLATES = {template.name: template for template in (ALPACA,)}


def prompt_template(name: Optional[str]) -> Optional[PromptTemplate]:
    return TEMPLATES[name] if name else None
