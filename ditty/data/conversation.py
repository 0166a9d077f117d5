"""One rendering of a conversation for every objective that trains on a reply to it: SFT on chats,
preference pairs, reward models and the RL prompts.

The prompt is the chat template's rendering of the turns before the reply with its generation prompt:
exactly what the model sees when it generates. The reply is what the template's rendering of the
whole conversation adds to that, cut right after its first end-of-sequence token, where generation
stops (a template that writes something after the turn's EOS, a newline say, never generates it);
a reply without one gets one. So the text a reward model or a preference loss scores is the text a
policy produces, and nothing is ended twice.

The reward model's card carries the same rule in plain transformers (ditty.checkpoint.hub), so a
model is scored outside ditty as it was trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def as_turns(value: Any, role: str) -> list[dict]:
    """A prompt or reply given as a string, as one message of `role`; messages as they are."""
    return value if isinstance(value, list) else [{"role": role, "content": str(value)}]


def render(
    tokenizer: "PreTrainedTokenizerBase", turns: list, generation_prompt: bool, tools: Optional[list] = None
) -> str:
    """The turns as the chat template writes them, with its generation prompt or not; `tools`: the
    tool schemas a template renders (its `tools` variable)."""
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt, **extra)


def render_prompt(tokenizer: "PreTrainedTokenizerBase", turns: list, tools: Optional[list] = None) -> str:
    """The turns and the generation prompt, as the chat template writes them."""
    return render(tokenizer, turns, True, tools)


def render_reply(tokenizer: "PreTrainedTokenizerBase", turns: list, reply: list) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids ending with one end-of-sequence token) of `reply` messages after `turns`."""
    prompt_text = render_prompt(tokenizer, turns)
    full_text = render(tokenizer, turns + reply, False)
    if not full_text.startswith(prompt_text):
        raise RecipeError.single(
            "the chat template renders the prompt differently once the reply follows, so the reply cannot be located",
            key="tokenizer.chat_template",
            fix="use a chat template whose rendering of a conversation extends that of its prompt",
        )
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(full_text[len(prompt_text) :], add_special_tokens=False)["input_ids"]
    return prompt_ids, ended(reply_ids, tokenizer.eos_token_id)


def ended(ids: list[int], eos: Any) -> list[int]:
    """`ids` cut right after their first end-of-sequence token, or with one appended."""
    if eos is None:
        return list(ids)
    return list(ids[: ids.index(eos) + 1]) if eos in ids else list(ids) + [eos]


def reply_text(reply: Any) -> str:
    """The text a reply says (its last message's content), as exact match compares it."""
    if isinstance(reply, list):
        return str(reply[-1].get("content", "")) if reply else ""
    return str(reply)
