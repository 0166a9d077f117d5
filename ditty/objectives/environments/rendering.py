"""Observations as tokens: an episode's prompt, and what the environment adds after each model turn.

Token in, token out: the model's sampled tokens are kept as they are, and only the environment's
part is tokenized, so training sees exactly the tokens that were sampled (re-tokenizing the whole
conversation could split the model's text differently).

Chat messages are rendered by ditty.data.conversation, the one rendering of a conversation (the
prompt with the generation prompt, as SFT's held-out prompts and every RL prompt), so an episode's
tokens are those of its conversation rendered whole. What a
turn adds is the template's text after the model's turn: the end of the assistant turn that the
model did not write itself (ditty's byte template's newline after the end-of-sequence token), the
new messages, and the next generation prompt. It is the difference between two renderings of the
conversation, which needs a template that only appends (every common one does); one that rewrites
earlier turns is a RecipeError naming `tokenizer.chat_template`. A string observation is text
appended as it is.

An observation is bounded before it is rendered or tokenized (`bounded`): no token stands for more
characters than the longest entry of the vocabulary, so text past room x that many characters can
only be cut afterwards, and is cut first (a tool's 10 MB answer is not rendered whole three times and
tokenized to keep its first few hundred tokens).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

from ditty.config.errors import RecipeError


class ObservationRenderer:
    """`tools`: the tool schemas a chat template renders (its `tools` variable), or None."""

    def __init__(self, tokenizer: Any, max_prompt_tokens: int, tools: Optional[Sequence[dict]] = None) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.tools = list(tools) if tools else None

    def prompt(self, observation: Any) -> tuple[list[int], Optional[list]]:
        """(the prompt's tokens, the conversation so far: None for text). Text is tokenized as the
        prompt format tokenizes a text prompt (special tokens included). Not cut: a prompt longer than
        `max_prompt_tokens` (data.max_seq_len) is the caller's to refuse, as the prompt format refuses one."""
        if isinstance(observation, str):
            return self.tokenizer(observation)["input_ids"], None
        messages = list(observation)
        text = self.render(messages, generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"], messages

    @functools.cached_property
    def chars_per_token(self) -> int:
        """The most characters one token stands for: the longest entry of the vocabulary (a byte-level
        BPE's entries are as long as the text they decode to, SentencePiece's too), special tokens
        included. A text longer than n x this many characters is more than n tokens."""
        vocabulary = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
        return max((len(token) for token in vocabulary), default=256) or 1

    def text_length(self, observation: Any) -> int:
        """The characters of an observation's text (its messages' contents)."""
        if isinstance(observation, str):
            return len(observation)
        return sum(len(message["content"]) for message in observation or ())

    def bounded(self, observation: Any, room: int) -> tuple[Any, bool]:
        """(`observation` with its text cut where `room` tokens end at the latest, whether it was
        cut): messages are kept in order and the content that runs past the room is cut (later ones
        emptied), so the tokens it renders to begin as the whole observation's do."""
        budget = max(room, 0) * self.chars_per_token
        if isinstance(observation, str):
            return (observation[:budget], True) if len(observation) > budget else (observation, False)
        kept, cut = [], False
        for message in observation:
            if len(message["content"]) > budget:
                message, cut = {**message, "content": message["content"][:budget]}, True
            budget -= len(message["content"])
            kept.append(message)
        return kept, cut

    def after_turn(
        self, conversation: Optional[list], completion: str, observation: Any
    ) -> tuple[list[int], Optional[list]]:
        """(the tokens the environment adds after a model turn whose text is `completion`, the
        conversation with the turn and the observation)."""
        if conversation is None or isinstance(observation, str):
            text = observation if isinstance(observation, str) else ""
            if conversation is not None:
                conversation = conversation + [{"role": "assistant", "content": completion}]
                if text:
                    conversation = conversation + [{"role": "user", "content": text}]
            return self.encode(text), conversation
        with_turn = conversation + [{"role": "assistant", "content": completion}]
        after = with_turn + list(observation)
        asked = self.render(conversation, generation_prompt=True)
        through_turn = self.render(with_turn, generation_prompt=False)
        full = self.render(after, generation_prompt=True)
        written = through_turn[len(asked) :]
        if (
            not through_turn.startswith(asked)
            or not full.startswith(through_turn)
            or not written.startswith(completion)
        ):
            raise RecipeError.single(
                "the chat template rewrites earlier turns of a conversation when a turn is added, so the "
                "environment's messages cannot be appended to the tokens the model sampled",
                key="tokenizer.chat_template",
                fix='use a chat template that only appends (e.g. tokenizer.chat_template = "chatml")',
            )
        closing = written[len(completion) :]
        eos = self.tokenizer.eos_token or ""
        if eos and closing.startswith(eos):  # the model wrote its end-of-sequence token itself
            closing = closing[len(eos) :]
        return self.encode(closing + full[len(through_turn) :]), after

    def render(self, messages: list, generation_prompt: bool) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RecipeError.single(
                "the environment's observations are chat messages, and the tokenizer has no chat template",
                key="tokenizer.chat_template",
                fix='set tokenizer.chat_template = "chatml" (or use a chat model\'s tokenizer)',
            )
        from ditty.data.conversation import render

        return render(self.tokenizer, messages, generation_prompt, self.tools)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
