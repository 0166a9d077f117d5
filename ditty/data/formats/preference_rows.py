"""The preference formats: "preference" (a prompt with a chosen and a rejected completion, for the DPO
family and reward models) and "unpaired_preference" (a prompt, one completion and a true/false label,
for KTO).

Columns hold plain strings or chat messages (TRL's conversational form: `prompt` a list of messages
ending with the user's turn, `chosen`/`rejected` a list holding the assistant's turn; or, without a
prompt column, TRL's implicit prompt: `chosen`/`rejected` whole conversations whose shared first
turns are the prompt). Messages are
rendered with the tokenizer's chat template: the prompt with the generation prompt, the completion
as what the whole conversation adds to it. A string prompt paired with message completions (or the
reverse) is read as one user turn (one assistant turn).

Only completion tokens are scored, and each completion ends with the end-of-sequence token, as
"prompt_completion" does. A sample keeps its first `data.max_seq_len` tokens per side; a pair whose
two sides that cut makes the same is a bad row.

A preference sample holds the chosen side under the causal-LM keys (`input_ids`, `labels`: length
grouping, mixtures and streams read those) and the rejected side as `rejected_input_ids`,
`rejected_labels`. The collator pads both halves into one batch of 2N rows, the N chosen rows first
(ditty.objectives.logprobs.split_pairs cuts it back), so a pair's two completions go through one
forward; the loss's denominator is the number of pairs. An unpaired sample adds `label` (1 or 0).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError
from ditty.data.formats.base import (
    CUT_PROBLEM,
    Batch,
    Collator,
    DataFormat,
    as_text,
    bound,
    cut_problem_text,
    text_problem,
)
from ditty.data.formats.lm import _append_sample
from ditty.data.rows import ANY, RowCheck, _messages_problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig

CHOSEN, REJECTED, LABEL = "chosen", "rejected", "label"
"""Fixed column names of the preference formats (TRL's and axolotl's); the prompt's is `data.prompt_column`,
the unpaired completion's `data.completion_column`."""
PAIRED_KEYS = ("rejected_input_ids", "rejected_labels")
log = logging.getLogger("ditty.data")


class PreferenceFormat(DataFormat):
    name = "preference"

    def columns(self, data: "DataConfig") -> dict[str, str]:
        # chosen and rejected have fixed names; columns_found names the missing one under data.format
        return {"data.prompt_column": data.prompt_column, "data.format": CHOSEN, "data.format.rejected": REJECTED}

    def columns_found(self, data: "DataConfig", found: Sequence[str]) -> dict[str, str]:
        missing = [column for column in (CHOSEN, REJECTED) if column not in found]
        if not missing and data.prompt_column not in found:  # TRL's implicit prompt: each row is checked
            return {"data.format": CHOSEN}
        return {"data.prompt_column": data.prompt_column, "data.format": (missing or [CHOSEN])[0]}

    def row_check(self, data: "DataConfig") -> RowCheck:
        prompt = data.prompt_column
        return RowCheck({CHOSEN: ANY, REJECTED: ANY}, bound(_pair_problem, prompt=prompt), optional=(prompt,))

    answers = True

    def exact_match_task(self, dataset: Any, data: "DataConfig", tokenizer: Any = None) -> Any:
        """Each held-out pair's prompt against its chosen answer; chat pairs rendered with the chat
        template's generation prompt (ditty.data.conversation), their chosen reply's text the answer."""
        from ditty.data.conversation import as_turns, render_prompt, reply_text
        from ditty.data.task import Task

        column = data.prompt_column
        rows = list(dataset)
        chats = bool(rows) and any(isinstance(rows[0].get(c), list) for c in (column, CHOSEN))
        if not chats:
            prompts, answers = as_text([r[column] for r in rows]), as_text([r[CHOSEN] for r in rows])
            return Task("file", tuple(prompts), tuple(answers), max_new_tokens=1)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return None
        prompts, answers = [], []
        for row in rows:
            if row.get(column) is None:  # TRL's implicit prompt: the turns both sides share
                turns, chosen, _ = split_implicit_prompt(row[CHOSEN], row[REJECTED])
            else:
                turns, chosen = as_turns(row[column], "user"), row[CHOSEN]
            prompts.append(render_prompt(tokenizer, turns))
            answers.append(reply_text(chosen))
        return Task("file", tuple(prompts), tuple(answers), max_new_tokens=1, add_special_tokens=False)

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(encode_preference, tokenizer=tokenizer, prompt_column=data.prompt_column, max_len=data.max_seq_len)

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "PairCollator":
        return PairCollator(pad_token_id=tokenizer.pad_token_id)


class UnpairedPreferenceFormat(DataFormat):
    name = "unpaired_preference"

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {
            "data.prompt_column": data.prompt_column,
            "data.completion_column": data.completion_column,
            "data.format": LABEL,
        }

    def row_check(self, data: "DataConfig") -> RowCheck:
        prompt, completion = data.prompt_column, data.completion_column
        fields = {prompt: ANY, completion: ANY, LABEL: ANY}
        return RowCheck(fields, bound(_unpaired_problem, prompt=prompt, completion=completion))

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(
            encode_unpaired,
            tokenizer=tokenizer,
            prompt_column=data.prompt_column,
            completion_column=data.completion_column,
            max_len=data.max_seq_len,
        )

    def check_training_set(self, samples: Any, data: "DataConfig", key: str) -> None:
        desirable = sum(samples["label"])
        if 0 < desirable < len(samples):
            return
        kind, term, metric = (
            ("desirable (label true)", "undesirable", "rewards/rejected")
            if desirable
            else ("undesirable (label false)", "desirable", "rewards/chosen")
        )
        log.warning(
            "all %d training examples are %s (%s): KTO weighs each kind against a shared baseline, so the %s "
            "term never trains and %s is not logged; add %s examples",
            len(samples),
            kind,
            key,
            term,
            metric,
            term,
        )

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "UnpairedCollator":
        return UnpairedCollator(pad_token_id=tokenizer.pad_token_id)


# ---------------------------------------------------------------------------- row checks


def _value_problem(value: Any, column: str) -> Optional[str]:
    """Why a prompt or completion is unusable: neither non-empty text nor non-empty messages."""
    if isinstance(value, list):
        problem = _messages_problem(value)
        if problem:
            return f"{column!r} {problem}"
        if not any(str(message.get("content") or "").strip() for message in value):
            return f"{column!r} has only empty messages"
        return None
    return text_problem(value, column)


def _pair_problem(row: dict, *, prompt: str) -> Optional[str]:
    if row.get(prompt) is None:
        return _implicit_pair_problem(row, prompt)
    for column in (prompt, CHOSEN, REJECTED):
        problem = _value_problem(row[column], column)
        if problem:
            return problem
    if row[CHOSEN] == row[REJECTED]:
        return "'chosen' equals 'rejected': the pair prefers nothing"
    return _completion_turns_problem(row[CHOSEN], CHOSEN) or _completion_turns_problem(row[REJECTED], REJECTED)


def _completion_turns_problem(value: Any, column: str) -> Optional[str]:
    """A completion of messages continues the prompt with the assistant's turn: one that starts with
    another role cannot be told apart from the prompt once rendered."""
    if isinstance(value, list) and value[0]["role"] != "assistant":
        return (
            f"{column!r} starts with a {value[0]['role']} turn; a completion continues the prompt with the "
            "assistant's turn (move the other turns into the prompt)"
        )
    return None


def _implicit_pair_problem(row: dict, prompt: str) -> Optional[str]:
    """A pair without a prompt: TRL's implicit-prompt form, chosen and rejected as whole
    conversations whose shared first turns are the prompt."""
    chosen, rejected = row[CHOSEN], row[REJECTED]
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        return (
            f"{prompt!r} is {'null' if prompt in row else 'missing'}; a pair without a prompt must be chat "
            "conversations (chosen and rejected) that share their first turns, TRL's implicit prompt"
        )
    for column in (CHOSEN, REJECTED):
        problem = _value_problem(row[column], column)
        if problem:
            return problem
    if chosen == rejected:
        return "'chosen' equals 'rejected': the pair prefers nothing"
    shared, chosen_rest, rejected_rest = split_implicit_prompt(chosen, rejected)
    if not shared:
        return (
            f"'chosen' and 'rejected' share no turn and there is no {prompt!r}: the prompt of a pair without "
            "one is the turns both conversations start with"
        )
    for column, rest in ((CHOSEN, chosen_rest), (REJECTED, rejected_rest)):
        if not rest:
            return f"{column!r} has no turn after those it shares with the other side"
    return _completion_turns_problem(chosen_rest, CHOSEN) or _completion_turns_problem(rejected_rest, REJECTED)


def split_implicit_prompt(chosen: list, rejected: list) -> tuple[list, list, list]:
    """(the turns both start with, the rest of chosen, the rest of rejected): TRL's extract_prompt."""
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _unpaired_problem(row: dict, *, prompt: str, completion: str) -> Optional[str]:
    for column in (prompt, completion):
        problem = _value_problem(row[column], column)
        if problem:
            return problem
    if label_value(row[LABEL]) is None:
        return (
            f'\'label\' should be true or false (or the text "true" or "false", as in a CSV cell), got {row[LABEL]!r}'
        )
    return None


def label_value(value: Any) -> Optional[bool]:
    """A KTO label: a boolean, or its text "true"/"false" (a CSV cell is text); None for anything else
    (a 0/1 or "yes" is refused rather than guessed, and bool("false") would read as desirable)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


# ---------------------------------------------------------------------------- encoding


def render(tokenizer: "PreTrainedTokenizerBase", prompt: Any, completion: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids ending with eos) of one prompt and completion, strings or messages."""
    from ditty.data.conversation import as_turns, ended, render_reply

    if not isinstance(prompt, list) and not isinstance(completion, list):
        prompt_ids = tokenizer(str(prompt))["input_ids"]
        completion_ids = tokenizer(str(completion), add_special_tokens=False)["input_ids"]
        return prompt_ids, ended(completion_ids, tokenizer.eos_token_id)
    if not getattr(tokenizer, "chat_template", None):
        raise RecipeError.single(
            "preference rows hold chat messages, and the tokenizer has no chat template to render them",
            key="data.format",
            fix='set tokenizer.chat_template = "chatml" (or a Jinja file\'s path), or give plain strings',
        )
    return render_reply(tokenizer, as_turns(prompt, "user"), as_turns(completion, "assistant"))


def _sample(prompt_ids: list[int], completion_ids: list[int], max_len: int) -> Optional[tuple[list, list]]:
    one: Batch = {"input_ids": [], "labels": []}
    ids = prompt_ids + completion_ids
    _append_sample(one, ids, [False] * len(prompt_ids) + [True] * len(completion_ids), max_len)
    return (one["input_ids"][0], one["labels"][0]) if one["input_ids"] else None


def render_all(tokenizer: "PreTrainedTokenizerBase", prompts: list, completions: list) -> list[tuple[list, list]]:
    """`render` of many rows; rows of plain strings are tokenized in one batched call each side."""
    plain = [
        i for i, (p, c) in enumerate(zip(prompts, completions)) if not isinstance(p, list) and not isinstance(c, list)
    ]
    if plain and getattr(tokenizer, "chat_template", None):
        _warn_plain_pairs_once()
    from ditty.data.conversation import ended

    out: list = [None] * len(prompts)
    if plain:
        prompt_ids = tokenizer([str(prompts[i]) for i in plain])["input_ids"]
        completion_ids = tokenizer([str(completions[i]) for i in plain], add_special_tokens=False)["input_ids"]
        for i, p, c in zip(plain, prompt_ids, completion_ids):
            out[i] = (p, ended(c, tokenizer.eos_token_id))
    for i, value in enumerate(out):
        if value is None:
            out[i] = render(tokenizer, prompts[i], completions[i])
    return out


def encode_preference(batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", prompt_column: str, max_len: int) -> Batch:
    """Pairs -> samples (see the module doc); a pair whose either side keeps no completion token once
    cut to `max_len` is dropped (ditty.data.formats.tokenize counts it), and one whose two sides the
    cut makes the same is marked in CUT_PROBLEM (a bad row)."""
    out: Batch = {"input_ids": [], "labels": [], "rejected_input_ids": [], "rejected_labels": [], CUT_PROBLEM: []}
    chosen, rejected = list(batch[CHOSEN]), list(batch[REJECTED])
    prompts = list(batch[prompt_column]) if prompt_column in batch else [None] * len(chosen)
    for index, prompt in enumerate(prompts):
        if prompt is None:  # TRL's implicit prompt (the row check made sure there is one)
            prompts[index], chosen[index], rejected[index] = split_implicit_prompt(chosen[index], rejected[index])
    chosen_sides = render_all(tokenizer, prompts, chosen)
    rejected_sides = render_all(tokenizer, prompts, rejected)
    for prompt, chosen_side, rejected_side in zip(prompts, chosen_sides, rejected_sides):
        chosen, rejected = _sample(*chosen_side, max_len), _sample(*rejected_side, max_len)
        if chosen is None or rejected is None:
            continue
        # Different completions that agree on every token kept: margin 0, a pair that teaches nothing.
        same = chosen == rejected
        out[CUT_PROBLEM].append(cut_problem_text("the pair's two sides are the same", prompt) if same else "")
        out["input_ids"].append(chosen[0])
        out["labels"].append(chosen[1])
        out["rejected_input_ids"].append(rejected[0])
        out["rejected_labels"].append(rejected[1])
    return out


def encode_unpaired(
    batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", prompt_column: str, completion_column: str, max_len: int
) -> Batch:
    """Unpaired examples -> samples with `label` 1 (desirable) or 0."""
    out: Batch = {"input_ids": [], "labels": [], "label": []}
    sides = render_all(tokenizer, list(batch[prompt_column]), list(batch[completion_column]))
    for side, label in zip(sides, batch[LABEL]):
        sample = _sample(*side, max_len)
        if sample is None:
            continue
        out["input_ids"].append(sample[0])
        out["labels"].append(sample[1])
        out["label"].append(int(label_value(label)))
    return out


# ---------------------------------------------------------------------------- collation


def scored_rows(labels: torch.Tensor) -> torch.Tensor:
    """Rows with at least one scored token (an evaluation filler row has none): the unit of every
    preference loss (pairs, counted by their chosen rows; KTO's examples)."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=1)


def counted_rows(batch: dict) -> torch.Tensor:
    """The batch's `scored_rows`, each row counted once: on a context-parallel rank's piece of the rows
    (ditty.data.context_shard), the whole rows' flags on the first piece and none on the others."""
    from ditty.data.context_shard import FIRST_PIECE, SCORED_ROWS

    if SCORED_ROWS in batch:
        return batch[SCORED_ROWS] & batch[FIRST_PIECE]
    return scored_rows(batch["labels"])


class PairCollator(Collator):
    """Preference samples -> one batch of 2N rows (chosen rows, then rejected), right-padded together."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_samples

        chosen = [(list(s["input_ids"]), list(s["labels"])) for s in samples]
        rejected = [(list(s["rejected_input_ids"]), list(s["rejected_labels"])) for s in samples]
        return pad_samples(chosen + rejected, self.pad_token_id)

    def supervised_count(self, batch: dict) -> torch.Tensor:
        """Pairs of the batch (a filler pair of evaluation, with nothing scored, counts none)."""
        chosen, _ = counted_rows(batch).chunk(2, dim=0)
        return chosen.sum()


class UnpairedCollator(Collator):
    """Unpaired samples -> one padded batch with `label` [N]; the denominator is the examples."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_samples

        batch = pad_samples([(list(s["input_ids"]), list(s["labels"])) for s in samples], self.pad_token_id)
        batch["label"] = torch.tensor([int(s["label"]) for s in samples], dtype=torch.long)
        return batch

    def supervised_count(self, batch: dict) -> torch.Tensor:
        return counted_rows(batch).sum()


_WARNED: list = []


def _warn_plain_pairs_once() -> None:
    """Plain-string pairs are not rendered with a chat template the tokenizer has: a model trained on
    chats sees its template at generation, so say so once."""
    if _WARNED:
        return
    _WARNED.append(True)
    import logging

    logging.getLogger("ditty.data").warning(
        "the pairs are plain strings and the tokenizer has a chat template: they are tokenized as plain text "
        "(prompt, then completion and eos), not rendered with the template; if the model was trained on "
        "chats, give the pairs as chat messages ([{role, content}]) so they are rendered as it generates"
    )
