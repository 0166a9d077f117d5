"""A trained reward model as a reward function (`rl.rewards = ["runs/tiny_reward/final", ...]`), as
TRL's `reward_funcs` takes a model: `RewardModelScorer(path)(prompts, completions)` scores each
completion after its prompt with the sequence classifier of one score at `path`, rendered as the
model was trained and as its card scores (ditty.data.conversation: the prompt as the chat template
ends it for generation, the reply through its first eos), in micro-batches, right-padded, each read
at its last real token. Its weight applies as a function's does.

The model loads at the first call, on the device the policy trains on, frozen; it costs its
parameters' memory there and one forward per completion.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
from typing import Any, Optional, Sequence

from ditty.config.errors import Problem


def reward_model_problem(path: str) -> Optional[str]:
    """Why `path` is not a reward model ditty can score with (read from its config.json), or None."""
    config = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(config):
        return f'{path!r} is not of the form "package.module:Name" (a function), nor a model directory'
    with open(config, encoding="utf-8") as handle:
        facts = json.load(handle)
    labels = facts.get("num_labels", len(facts.get("id2label") or {}) or None)
    if labels != 1:
        return (
            f"{path} is a model of {labels or 'no'} output labels, and a reward model scores with one "
            '(train one with model.task = "reward-model")'
        )
    return None


def reward_model_problems(path: str, key: str) -> list[Problem]:
    problem = reward_model_problem(path)
    if problem is None:
        return []
    fix = builtin_reward_hint(path) or 'name a reward model\'s final/ (model.task = "reward-model")'
    return [Problem(key, problem, fix=fix)]


def builtin_reward_hint(name: str) -> Optional[str]:
    """For a bare name at or near a built-in reward function's ("exact_match"), the reference to
    write; None for anything that looks like a path."""
    if os.sep in name or os.path.exists(os.path.expanduser(name)):
        return None
    from ditty.objectives import builtin_rewards

    functions = [n for n, f in vars(builtin_rewards).items() if not n.startswith("_") and _is_reward(f)]
    close = difflib.get_close_matches(name, functions, n=1, cutoff=0.6)
    return f'write "{builtin_rewards.__name__}:{close[0]}" for the built-in reward function' if close else None


def _is_reward(value: Any) -> bool:
    """A function with TRL's reward signature (prompts, completions, ...); not a factory or helper."""
    if not inspect.isfunction(value):
        return False
    return list(inspect.signature(value).parameters)[:2] == ["prompts", "completions"]


class RewardModelScorer:
    """See the module doc. `batch_size`: completions per forward."""

    def __init__(self, path: str, batch_size: int = 32) -> None:
        self.path, self.batch_size = os.path.expanduser(path), batch_size
        self.model: Any = None
        self.tokenizer: Any = None
        self.__name__ = self.__qualname__ = f"reward_model({path})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        import torch

        self._load()
        rows = [self._ids(prompt, completion) for prompt, completion in zip(prompts, completions)]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                mask[row, : len(ids)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
            scores += logits[:, 0].float().cpu().tolist()  # the classifier reads each row at its last real token
        return scores

    def _ids(self, prompt: Any, completion: Any) -> list[int]:
        from ditty.data.conversation import as_turns, ended, render_reply

        tokenizer = self.tokenizer
        if not isinstance(prompt, list) and not isinstance(completion, list):
            prompt_ids = tokenizer(str(prompt))["input_ids"]
            reply_ids = ended(tokenizer(str(completion), add_special_tokens=False)["input_ids"], tokenizer.eos_token_id)
            return prompt_ids + reply_ids
        prompt_ids, reply_ids = render_reply(tokenizer, as_turns(prompt, "user"), as_turns(completion, "assistant"))
        return prompt_ids + reply_ids

    def _load(self) -> None:
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = torch.device(f"cuda:{torch.cuda.current_device()}") if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=torch.float32)
        self.model = model.to(device).eval().requires_grad_(False)
