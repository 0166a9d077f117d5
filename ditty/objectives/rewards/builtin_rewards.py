"""Ready-made reward functions with TRL's signature, named in a recipe as
`"ditty.objectives.rewards.builtin_rewards:NAME"`:

- `exact_match`: 1.0 when the completion, stripped, equals the row's reference answer (column
  `answer`, else `completion`: the built-in `addition` and `reverse` tasks keep theirs there);
- `digit_match`: partial credit for a numeric answer: the share of the reference's characters the
  completion has at the same places (0 when the lengths differ), so near misses rank above far ones;
- `call_expression_match`: for episodes with tools (`rl.tools`), partial credit for the first tool
  call: the share of the prompt's expression ("123*456" of "123*456=") its `expression` argument has
  at the same places (0 when the lengths differ or there is no call), so an episode that copies the
  operands into the call ranks above one that miscopies them, whatever its answer;
- `addition_exact_match`: the same for the built-in `addition` task, the answer computed from the
  prompt ("12+47=" -> "59"), so it needs no answer column;
- `integer_format`: 1.0 when the completion is one integer and nothing else;
- `think_answer_format`: 1.0 for "<think>...</think><answer>...</answer>" (the format reward of
  R1-style recipes);
- `length_penalty`: 0 up to 256 characters, then down linearly to -1.0 at 512.

The factories `regex_reward(pattern)` and `make_length_penalty(...)` build others from the Python API.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Optional

from ditty.objectives.rewards.functions import completion_text

_ADDITION = re.compile(r"\s*(-?\d+)\s*\+\s*(-?\d+)\s*=\s*")


def exact_match(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Optional[Sequence[Any]] = None,
    completion: Optional[Sequence[Any]] = None,
    **columns: Any,
) -> list[float]:
    references = _references("exact_match", answer, completion)
    return [float(completion_text(c).strip() == str(r).strip()) for c, r in zip(completions, references)]


def digit_match(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Optional[Sequence[Any]] = None,
    completion: Optional[Sequence[Any]] = None,
    **columns: Any,
) -> list[float]:
    references = _references("digit_match", answer, completion)
    return [share_in_place(completion_text(c).strip(), str(r).strip()) for c, r in zip(completions, references)]


def _references(reward: str, answer: Optional[Sequence[Any]], completion: Optional[Sequence[Any]]) -> Sequence[Any]:
    """The column a reference-matching reward compares with: 'answer', else the data's 'completion'."""
    references = answer if answer is not None else completion
    if references is None:
        raise KeyError(f"{reward} compares with the column 'answer' (or 'completion'); the data has neither")
    return references


def call_expression_match(
    prompts: Sequence[Any], completions: Sequence[Any], tool_calls: Optional[Sequence[Any]] = None, **columns: Any
) -> list[float]:
    if tool_calls is None:
        raise KeyError("call_expression_match scores tool calls: it needs episodes with tools (rl.tools)")
    scores = []
    for prompt, calls in zip(prompts, tool_calls):
        expression = completion_text(prompt).strip().removesuffix("=").strip()
        called = str(calls[0]["arguments"].get("expression", "")).strip() if calls else ""
        scores.append(share_in_place(called, expression))
    return scores


def share_in_place(text: str, reference: str) -> float:
    """The share of `reference`'s characters that `text` has at the same places; 0 when the lengths differ."""
    if len(text) != len(reference) or not reference:
        return 0.0
    return sum(a == b for a, b in zip(text, reference)) / len(reference)


def addition_exact_match(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    rewards = []
    for prompt, completion in zip(prompts, completions):
        found = _ADDITION.fullmatch(completion_text(prompt))
        if found is None:
            raise ValueError(f'{prompt!r} is not an addition prompt like "12+47="')
        rewards.append(float(completion_text(completion).strip() == str(int(found[1]) + int(found[2]))))
    return rewards


def regex_reward(pattern: str, *, flags: int = re.DOTALL, name: Optional[str] = None) -> Callable[..., list[float]]:
    """A reward of 1.0 for completions that match `pattern` whole (re.fullmatch after stripping), else 0.0."""
    compiled = re.compile(pattern, flags)

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        return [float(compiled.fullmatch(completion_text(c).strip()) is not None) for c in completions]

    reward.__name__ = reward.__qualname__ = name or f"regex_reward({pattern!r})"
    return reward


def make_length_penalty(
    soft_limit: int = 256, hard_limit: int = 512, penalty: float = 1.0
) -> Callable[..., list[float]]:
    """0 up to `soft_limit` characters, then linearly down to -`penalty` at `hard_limit` and beyond
    (the shape of DAPO's soft overlong punishment, in characters so it needs no tokenizer)."""
    if not 0 <= soft_limit < hard_limit:
        raise ValueError(f"need 0 <= soft_limit < hard_limit, got {soft_limit} and {hard_limit}")

    def length_penalty(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        rewards = []
        for completion in completions:
            excess = len(completion_text(completion)) - soft_limit
            rewards.append(-penalty * min(1.0, max(0, excess) / (hard_limit - soft_limit)))
        return rewards

    return length_penalty


integer_format = regex_reward(r"-?\d+", name="integer_format")
think_answer_format = regex_reward(r"<think>.*?</think>\s*<answer>.*?</answer>", name="think_answer_format")
length_penalty = make_length_penalty()
