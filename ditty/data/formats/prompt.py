"""The "prompt" format: prompts alone, for reinforcement learning (`[rl]`), where the completions
are sampled during training and scored by reward functions.

A row's prompt (`data.prompt_column`, "prompt" by default) is a string or a list of chat messages
(rendered with the tokenizer's chat template and its generation prompt). Every other column of the
row (the answer to check, say) is kept and handed to the reward functions by name, TRL's way.

A sample is {"input_ids": prompt tokens, "prompt": the prompt as JSON, "columns": the other columns
as JSON}: JSON keeps any column type through `datasets` unchanged. The collator gives a batch of
prompts as a dict (prompt_ids, prompts, columns), which the RL rows' rollout stream
(ditty.objectives.rl.stream) turns into completions; no tensor is made here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ditty.config.errors import RecipeError
from ditty.data.formats.base import CUT_PROBLEM, Batch, Collator, DataFormat, bound, cut_problem_text
from ditty.data.rows import ANY, RowCheck

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig


class PromptFormat(DataFormat):
    name = "prompt"

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.prompt_column": data.prompt_column}

    def row_check(self, data: "DataConfig") -> RowCheck:
        column = data.prompt_column
        return RowCheck({column: ANY}, lambda row: prompt_problem(row[column], column), every_column=True)

    def check_tokenizer(self, tokenizer: Any, data: "DataConfig") -> None:
        """Chat prompts need a chat template; that is only known per row, so it is checked when encoding."""

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(encode_prompts, tokenizer=tokenizer, prompt_column=data.prompt_column, max_len=data.max_seq_len)

    answers = True

    def exact_match_task(self, dataset: Any, data: "DataConfig", tokenizer: Any = None) -> Any:
        """Greedy exact match against an `answer` (else `completion`) column, when the rows have one."""
        from ditty.data.formats.base import as_text
        from ditty.data.task import Task

        reference = next((c for c in ("answer", "completion") if c in dataset.column_names), None)
        if reference is None:
            return None
        prompts = [prompt_text(value) for value in dataset[data.prompt_column]]
        if not all(isinstance(p, str) for p in prompts):
            return None
        return Task("file", tuple(prompts), tuple(as_text(dataset[reference])), max_new_tokens=1)

    def collator(self, tokenizer: "PreTrainedTokenizerBase", data: "DataConfig", **facts: Any) -> Collator:
        return PromptCollator()


def prompt_problem(value: Any, column: str) -> Optional[str]:
    """Why a prompt is unusable: neither non-empty text nor a list of {role, content} messages."""
    if isinstance(value, str):
        return None if value.strip() else f"{column!r} is empty"
    if isinstance(value, list) and value:
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
            return None
        return f"{column!r} is a list but not of {{role, content}} chat messages"
    return f"{column!r} should be text or a list of chat messages, got {type(value).__name__}"


def prompt_text(value: Any) -> Any:
    """The prompt as the reward functions see it: the string, or the list of messages."""
    return value


def encode_prompts(batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", prompt_column: str, max_len: int) -> Batch:
    """Prompt tokens, the prompt and the other columns as JSON. A prompt longer than `max_len` is
    marked in CUT_PROBLEM (a bad row), not cut: without its start it loses BOS and the question,
    without its end the generation prompt the completion continues."""
    names = [name for name in batch if name != prompt_column]
    out: Batch = {"input_ids": [], "prompt": [], "columns": [], CUT_PROBLEM: []}
    for index, prompt in enumerate(batch[prompt_column]):
        if isinstance(prompt, str):
            ids = tokenizer(prompt)["input_ids"]
        else:
            if not getattr(tokenizer, "chat_template", None):
                raise RecipeError.single(
                    "the prompts are chat messages, and the tokenizer has no chat template",
                    key="data.prompt_column",
                    fix='set tokenizer.chat_template = "chatml" (or a chat model\'s tokenizer), or use text prompts',
                )
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        too_long = len(ids) > max_len
        out[CUT_PROBLEM].append(cut_problem_text(f"a prompt of {len(ids)} tokens", prompt) if too_long else "")
        out["input_ids"].append(ids[:max_len])
        out["prompt"].append(json.dumps(prompt))
        out["columns"].append(json.dumps({name: batch[name][index] for name in names}, default=str))
    return out


class PromptCollator(Collator):
    """Prompt samples -> {"prompt_ids": [[...]], "prompts": [...], "columns": {name: [...]}}."""

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        rows = [json.loads(s["columns"]) for s in samples]
        names = sorted({name for row in rows for name in row})
        return {
            "prompt_ids": [list(s["input_ids"]) for s in samples],
            "prompts": [json.loads(s["prompt"]) for s in samples],
            "columns": {name: [row.get(name) for row in rows] for name in names},
        }
