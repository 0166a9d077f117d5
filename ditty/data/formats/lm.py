"""The causal-LM formats: "text", "prompt_completion" (its rows may be read through a named template,
ditty.data.formats.templates) and "chat" (its rows in the layouts of ditty.data.chat_layouts).
Samples are {"input_ids": [...], "labels": [...]}, -100 where no loss.

Truncation policy: a sample keeps its FIRST `data.max_seq_len` tokens; the end is cut. A prompt of
`max_seq_len` tokens or more therefore leaves nothing to learn, and such a sample is dropped.

The first token of a sample is never supervised: a causal LM predicts token t+1 from tokens <= t, so
nothing predicts token 0. Samples whose only supervised token would be the first are dropped too,
and a dataset where every sample is dropped is a user error (ditty.data.formats.tokenize).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError
from ditty.data.chat_layouts import ChatLayout
from ditty.data.conversation import ended
from ditty.data.formats.base import Batch, DataFormat, RowCheck, as_text, bound
from ditty.data.formats.templates import PromptTemplate, prompt_template
from ditty.data.rows import TEXT

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig

_GENERATION_MARKER = re.compile(r"{%-?\s*generation\s*-?%}")


class TextFormat(DataFormat):
    name = "text"
    packable = True

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.text_column": data.text_column}

    def row_check(self, data: "DataConfig") -> RowCheck:
        return RowCheck({data.text_column: TEXT})

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(encode_text, tokenizer=tokenizer, column=data.text_column, max_len=data.max_seq_len)


class PromptCompletionFormat(DataFormat):
    name = "prompt_completion"
    packable = True

    def columns(self, data: "DataConfig") -> dict[str, str]:
        template = prompt_template(data.template)
        if template is not None:  # its columns are named by the template (the prompt's first, for messages)
            return {"data.template": template.required[0]}
        return {"data.prompt_column": data.prompt_column, "data.completion_column": data.completion_column}

    def columns_found(self, data: "DataConfig", found: Sequence[str]) -> dict[str, str]:
        template = prompt_template(data.template)
        if template is None:
            return self.columns(data)
        missing = [column for column in template.required if column not in found]
        return {"data.template": (missing or list(template.required))[0]}

    def row_check(self, data: "DataConfig") -> RowCheck:
        template = prompt_template(data.template)
        if template is not None:
            return RowCheck({column: TEXT for column in template.required})
        return RowCheck({data.prompt_column: TEXT, data.completion_column: TEXT})

    answers = True

    def exact_match_task(self, dataset: Any, data: "DataConfig", tokenizer: Any = None) -> Any:
        from ditty.data.task import Task

        template = prompt_template(data.template)
        if template is not None:
            prompts = [template.prompt(row) for row in dataset]
            answers = as_text(dataset[template.completion])
        else:
            prompts, answers = as_text(dataset[data.prompt_column]), as_text(dataset[data.completion_column])
        # max_new_tokens is set from the tokenized answers by the builder.
        return Task("file", tuple(prompts), tuple(answers), max_new_tokens=1)

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(
            encode_prompt_completion,
            tokenizer=tokenizer,
            prompt_column=data.prompt_column,
            completion_column=data.completion_column,
            max_len=data.max_seq_len,
            template=prompt_template(data.template),
        )


class ChatFormat(DataFormat):
    name = "chat"
    packable = True

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.messages_column": data.messages_column}

    def columns_found(self, data: "DataConfig", found: Sequence[str]) -> dict[str, str]:
        return {"data.messages_column": ChatLayout.of(data).column_of(found)}

    def row_check(self, data: "DataConfig") -> RowCheck:
        # The layout (OpenAI or ShareGPT) is told per row from its keys, so no column is required by name.
        return RowCheck({}, ChatLayout.of(data))

    def check_tokenizer(self, tokenizer: Any, data: "DataConfig") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise RecipeError.single(
                'data.format = "chat" needs a tokenizer with a chat template, and this one has none',
                key="data.format",
                fix='set tokenizer.chat_template = "chatml" (or "plain", or a Jinja file\'s path), use a chat '
                'model\'s tokenizer (tokenizer.path), or data.format = "prompt_completion"',
            )

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(encode_chat, tokenizer=tokenizer, layout=ChatLayout.of(data), max_len=data.max_seq_len)

    answers = True

    def exact_match_task(self, dataset: Any, data: "DataConfig", tokenizer: Any = None) -> Any:
        """Each held-out conversation up to its last assistant turn, rendered with the chat template's
        generation prompt (ditty.data.conversation), against that turn's text."""
        from ditty.data.conversation import render_prompt
        from ditty.data.task import Task

        layout = ChatLayout.of(data)
        prompts, answers = [], []
        for row in dataset:
            messages, _ = layout.conversation(row)
            last = max((i for i, m in enumerate(messages or []) if m["role"] == "assistant"), default=None)
            if last is None:
                continue
            prompts.append(render_prompt(tokenizer, messages[:last]))
            answers.append(str(messages[last]["content"]))
        if not prompts:
            return None
        return Task("file", tuple(prompts), tuple(answers), max_new_tokens=1, add_special_tokens=False)


def encode_text(batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", column: str, max_len: int) -> Batch:
    """Language modelling: loss on every token. An eos closes each document, so the model learns
    where documents end and packed documents are separated."""
    out: Batch = {"input_ids": [], "labels": []}
    for ids in tokenizer(as_text(batch[column]))["input_ids"]:
        document = _with_eos(ids, tokenizer)
        _append_sample(out, document, [True] * len(document), max_len)
    return out


def encode_prompt_completion(
    batch: Batch,
    *,
    tokenizer: "PreTrainedTokenizerBase",
    prompt_column: str,
    completion_column: str,
    max_len: int,
    template: Optional[PromptTemplate] = None,
) -> Batch:
    """Loss on the completion and its eos only. With a `template`, the prompt is the template
    rendered from each row's columns and the completion its completion column.

    Prompt and completion are tokenized separately (prompt with the tokenizer's special tokens, as
    generation will see it; completion without), so the prompt/completion boundary is exact even
    for tokenizers that would merge characters across it.
    """
    out: Batch = {"input_ids": [], "labels": []}
    if template is not None:
        names = list(batch)
        prompt_texts = [template.prompt(dict(zip(names, values))) for values in zip(*(batch[n] for n in names))]
        completion_column = template.completion
    else:
        prompt_texts = as_text(batch[prompt_column])
    prompts = tokenizer(prompt_texts)["input_ids"]
    completions = tokenizer(as_text(batch[completion_column]), add_special_tokens=False)["input_ids"]
    for prompt_ids, completion_ids in zip(prompts, completions):
        answer = _with_eos(completion_ids, tokenizer)
        _append_sample(out, prompt_ids + answer, [False] * len(prompt_ids) + [True] * len(answer), max_len)
    return out


def encode_chat(batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", layout: ChatLayout, max_len: int) -> Batch:
    """Conversations (in any layout of ditty.data.chat_layouts) rendered with the tokenizer's
    chat template; loss on assistant turns only.

    Templates with `{% generation %}` markers say exactly which tokens are the assistant's (the
    tokenizer returns that mask). For templates without them, an assistant turn is the tokens
    that rendering the conversation up to and including that turn adds to rendering it up to
    the turn's generation prompt.
    """
    from jinja2 import TemplateError

    # get_chat_template resolves tokenizers that carry several named templates to the default one.
    has_markers = bool(_GENERATION_MARKER.search(tokenizer.get_chat_template()))
    out: Batch = {"input_ids": [], "labels": []}
    names = list(batch)
    for values in zip(*(batch[name] for name in names)):
        messages, problem = layout.conversation(dict(zip(names, values)))
        if problem:
            raise RecipeError.single(
                f"a conversation cannot be read: it {problem}",
                key="data.messages_column",
                fix="each row needs a list of {role, content} (OpenAI) or {from, value} (ShareGPT) messages; "
                "name other keys with data.chat_keys",
            )
        try:
            if has_markers:
                ids, supervised = _assistant_tokens_from_markers(tokenizer, messages)
            else:
                ids, supervised = _assistant_tokens_from_prefixes(tokenizer, messages)
        except (TemplateError, TypeError, KeyError) as error:
            raise _template_failure(tokenizer, messages, error) from error
        _append_sample(out, ids, supervised, max_len)
    return out


SIMPLEST_CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _template_failure(tokenizer: "PreTrainedTokenizerBase", messages: list, error: Exception) -> RecipeError:
    """The error for a conversation the chat template raised on. Every row has passed the row check
    (text roles and contents), so the template is to blame: it is broken when it fails on the
    simplest conversation too; otherwise the row breaks a rule of the template's own (roles that
    must alternate, no system turn), which the template's message names."""
    try:
        tokenizer.apply_chat_template(SIMPLEST_CONVERSATION, tokenize=False)
    except Exception:  # noqa: BLE001 - whatever a broken template raises, it raises here as well
        return RecipeError.single(
            f"the chat template fails on any conversation, even one user and one assistant turn: {error}",
            key="tokenizer.chat_template",
            fix="fix the template (tokenizer.chat_template names a Jinja file or chatml/plain), "
            "or choose one that renders",
        )
    first = repr(messages[0]["content"]) if messages else "none"
    shown = first if len(first) <= 60 else first[:57] + "..."
    roles = ", ".join(m["role"] for m in messages)
    return RecipeError.single(
        f"the chat template refused a conversation ({len(messages)} turns: {roles}; first {shown}): {error}",
        key="tokenizer.chat_template",
        fix="the rows are well formed, so this is the template's own rule: make the rows follow the "
        "template's rule, or choose a template that accepts them with tokenizer.chat_template",
    )


def _assistant_tokens_from_markers(
    tokenizer: "PreTrainedTokenizerBase", messages: list
) -> tuple[list[int], list[bool]]:
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(rendered["input_ids"]), [bool(flag) for flag in rendered["assistant_masks"]]


def _assistant_tokens_from_prefixes(
    tokenizer: "PreTrainedTokenizerBase", messages: list
) -> tuple[list[int], list[bool]]:
    def render(turns: list, generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = render(messages, generation_prompt=False)
    supervised = [False] * len(ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(messages[:index], generation_prompt=True)) if index else 0
        through_turn = render(messages[: index + 1], generation_prompt=False)
        if ids[: len(through_turn)] != through_turn:
            raise RecipeError.single(
                "the chat template renders earlier turns differently once later turns follow, so "
                "assistant turns cannot be located",
                key="data.format",
                fix='use a chat template with {% generation %} markers, or data.format = "prompt_completion"',
            )
        # The turn as it is generated: through its first end-of-sequence token (ditty.data.conversation).
        end = start + len(ended(through_turn[start:], tokenizer.eos_token_id))
        end = min(end, len(through_turn))
        supervised[start:end] = [True] * (end - start)
    return ids, supervised


def _with_eos(ids: list[int], tokenizer: "PreTrainedTokenizerBase") -> list[int]:
    eos = tokenizer.eos_token_id
    return ids if eos is None or (ids and ids[-1] == eos) else ids + [eos]


def _append_sample(out: Batch, ids: list[int], supervised: list[bool], max_len: int) -> None:
    """Truncate to the first `max_len` tokens; keep the sample only if a token after the first is supervised."""
    ids, supervised = ids[:max_len], supervised[:max_len]
    labels = [IGNORE_INDEX] + [token if keep else IGNORE_INDEX for token, keep in zip(ids[1:], supervised[1:])]
    if any(label != IGNORE_INDEX for label in labels):
        out["input_ids"].append(ids)
        out["labels"].append(labels)
