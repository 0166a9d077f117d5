"""Off-policy guidance (`rl.guidance_column`): the data's own answer in a group that sampled none as good.

A policy that seldom samples a right answer gives GRPO little to learn from: a group whose completions
all score alike has advantage 0 everywhere, and in a mostly-wrong batch the negative advantages push
the policy off its answers faster than the few positive ones pull it on. Where each prompt row holds
a right answer (the built-in datasets' `completion` column), a group whose every completion scores
below that answer gets it in place of its last completion, scored by the same reward functions, so
the group's advantages point at it (LUFFY, Yan et al. 2025, mixes such off-policy answers into GRPO's
groups). A group that sampled something as good as the answer is left as it was.

The answer's tokens are its text and the end-of-sequence token, as a sampled completion ends; an
answer longer than rollout.max_new_tokens is not put in (it would train past the sampling budget). A
guided row is marked in `RolloutBatch.guided`; where the sampler reports log-probabilities its
tokens have NaN (no sampler drew them: the sampler correction leaves them at weight 1 and the
mismatch metric out). The step logs `rollout/guided_share` (the share of groups guided) and
`rollout/sampled_reward` (the mean reward of the completions the policy sampled).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ditty.config.errors import RecipeError
from ditty.objectives.rewards.functions import RewardFunction, score_completions
from ditty.objectives.sampling.batch import RolloutBatch


class Guidance:
    def __init__(
        self,
        column: str,
        functions: Sequence[RewardFunction],
        tokenizer: Any,
        max_new_tokens: int,
        timeout_s: float = 0.0,
    ) -> None:
        self.column, self.functions, self.tokenizer = column, list(functions), tokenizer
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s

    def apply(self, rollouts: RolloutBatch, prompt_batch: Mapping[str, Any], group: int) -> None:
        """Put each group's answer in place of its last completion where every completion scored below
        it (`rollouts` scored, `group` completions per prompt of `prompt_batch`, adjacent)."""
        columns = prompt_batch["columns"]
        if self.column not in columns:
            raise RecipeError.single(
                f"the prompt rows have no column {self.column!r} (they have {sorted(columns) or 'none'})",
                key="rl.guidance_column",
                fix="name the column that holds each prompt's answer, or leave rl.guidance_column unset",
            )
        answers = [str(answer) for answer in columns[self.column]]
        scores = score_completions(self.functions, prompt_batch["prompts"], answers, columns, timeout_s=self.timeout_s)
        rollouts.guided = [False] * len(rollouts)
        for index, answer in enumerate(answers):
            best = float(rollouts.rewards[index * group : (index + 1) * group].max())
            if float(scores.total[index]) <= best:
                continue
            ids = self.tokens(answer)
            if len(ids) > self.max_new_tokens:
                continue
            row = index * group + group - 1
            rollouts.completion_ids[row] = ids
            rollouts.texts[row] = answer
            rollouts.truncated[row] = False
            rollouts.guided[row] = True
            if rollouts.trainable is not None:
                rollouts.trainable[row] = [True] * len(ids)
            if rollouts.sampler_logps is not None:
                rollouts.sampler_logps[row] = [float("nan")] * len(ids)
            rollouts.rewards[row] = scores.total[index]
            for name, values in scores.per_function.items():
                rollouts.rewards_per_function[name][row] = values[index]
            for name, values in scores.details.items():
                if name in rollouts.reward_details:
                    rollouts.reward_details[name][row] = values[index]

    def tokens(self, answer: str) -> list[int]:
        ids = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
        eos = self.tokenizer.eos_token_id
        return ids + [eos] if eos is not None else ids
