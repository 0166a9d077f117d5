"""The environment: what an episode sees and earns.

Two kinds, one interface for the rollout stream (`run(sampler, prompts, first_position, group) ->
RolloutBatch`, the rewards filled in; `score_drawn(rollouts, prompts, group)` for completions a sampler
drew ahead of the step, which only one-turn environments take):

- `RewardEnvironment`, the one-turn case: the sampler writes one completion per episode and the
  reward functions (TRL's signature) score it with its prompt row's columns, in one batch;
- `EpisodeEnvironment` (ditty.objectives.environments.episodes): an `Environment` per episode, several turns.

`Environment` is the protocol a user writes (`[rl] environment = "package.module:Name"`, built
without arguments, one instance per episode): `reset(row)` gives the first observation from the
prompt row, `step(completion)` answers each model turn with a `StepResult`. An observation is a list
of chat messages (rendered with the tokenizer's chat template, the generation prompt after them) or
a string (its text as it is). A `reset` or `step` that raises (SystemExit too) or answers something
else (a field of the wrong type: `step_result_problem`) stops the run with exit code 2
(`EnvironmentFailure`, naming the environment, the fault and the row) before any update, so the last
checkpoint is untouched. An environment may also have `reward_columns() -> {name: value}`, read
when its episode ends: the reward functions get each name as a keyword, one value per episode (the
built-in tool environment gives `tool_calls`, the episode's calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence, Union, runtime_checkable

from ditty.config.errors import Problem, RecipeError
from ditty.objectives.rewards.functions import RewardFunction, score_completions
from ditty.objectives.sampling.batch import RolloutBatch

Observation = Union[str, list[dict[str, Any]]]
"""Chat messages ({role, content}) to render with the chat template, or text to append as it is."""


@dataclass
class StepResult:
    """What the environment answers to one model turn."""

    observation: Optional[Observation] = None
    """What the model reads next (a tool's output, say); None or [] when there is nothing to add."""
    reward: float = 0.0
    """This turn's reward; an episode's reward is the sum over its turns (plus the reward functions'
    score of the final answer, where `rl.rewards` names any)."""
    done: bool = False
    """The episode is over: the model writes no further turn."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers to log as env/NAME (means over the step's episodes; a turn's values add up)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """The reward's components, logged as rewards/NAME/mean (their sum need not be `reward`)."""


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: Mapping[str, Any]) -> Observation:
        """The first observation, from the prompt row ({"prompt": ..., every other column})."""

    def step(self, completion: str) -> StepResult:
        """The answer to the model's turn (its text, special tokens left out)."""


class EnvironmentFailure(RecipeError):
    """An environment raised or answered something that is not a StepResult (exit code 2)."""


ENDS_AN_EPISODE = "fix the environment: an episode it cannot go on with ends with StepResult(done=True)"


def environment_failure(
    name: str, row: Any, what: str, key: str = "rl.environment", fix: str = ENDS_AN_EPISODE
) -> EnvironmentFailure:
    shown = repr(dict(row) if isinstance(row, Mapping) else row)
    shown = shown if len(shown) <= 300 else shown[:297] + "..."
    return EnvironmentFailure([Problem(key, f"environment {name} {what} (row {shown}); the run stopped", fix=fix)])


OWN_METRICS = ("turns", "episode_tokens", "truncated", "observations_cut")
"""The env/NAME metrics ditty logs of every episode: an environment's metric may not take their names."""


def observation_problem(observation: Any, after_model_turn: bool = False) -> Optional[str]:
    """Why `observation` is neither text nor a list of chat messages ({role, content}) that the
    data path would take in a chat row, or None: every content text, every role user, assistant,
    system, or tool right after the model's turn (`after_model_turn`) or another tool message."""
    if observation is None or isinstance(observation, str):
        return None
    if not isinstance(observation, list):
        return f"a {type(observation).__name__}, not chat messages (a list of {{role, content}}) or text"
    from ditty.data.rows import role_problem

    before = ["assistant"] if after_model_turn else []
    roles = before + [m.get("role") if isinstance(m, Mapping) else None for m in observation]
    for index, message in enumerate(observation):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or "content" not in message:
            return f"a list whose item {index} is {_short(message)}, not a chat message {{role, content}}"
        if not isinstance(message["content"], str):
            return f"a list whose message {index}'s content is {_short(message['content'])}, not text"
        problem = role_problem(roles, index + len(before))
        if problem:
            return f"a list whose {problem.replace(f'message {index + len(before)}', f'message {index}', 1)}"
    return None


def step_result_problem(result: Any) -> Optional[str]:
    """Why a step's result (a StepResult, or the like) cannot be used, naming the field, or None."""
    if not _finite(result.reward):
        return f"the reward {_short(result.reward)}, not a finite number"
    if not _boolean(result.done):  # "no" or None would end (or not end) the episode by Python's truth
        return f"done = {_short(result.done)}, not True or False"
    for field_name in ("rewards", "metrics"):
        values = getattr(result, field_name)
        if not isinstance(values, Mapping):
            return f"{field_name} = {_short(values)}, not a mapping of names to numbers"
        for name, value in values.items():
            if not _finite(value):
                return f"{field_name}[{name!r}] = {_short(value)}, not a finite number"
    own = [name for name in result.metrics if name in OWN_METRICS]
    if own:
        return f"metrics[{own[0]!r}]: env/{own[0]} is ditty's own metric of every episode, which it would overwrite"
    problem = observation_problem(result.observation, after_model_turn=True)
    return f"the observation {problem}" if problem else None


def _boolean(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's too


def _finite(value: Any) -> bool:
    import math
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class RewardEnvironment:
    """One turn: the reward functions (TRL's signature) score each completion with its prompt row's columns."""

    def __init__(self, functions: Sequence[RewardFunction], timeout_s: float = 0.0) -> None:
        self.functions = list(functions)
        self.timeout_s = timeout_s  # rl.reward_timeout_s: a function that runs longer stops the run (exit 2)

    def run(self, sampler: Any, prompt_batch: Mapping[str, Any], first_position: int, group: int) -> RolloutBatch:
        """`group` completions of each prompt of `prompt_batch` (the prompt format's collated batch), scored."""
        rollouts = sampler.sample(prompt_batch["prompt_ids"], first_position)
        self.score_drawn(rollouts, prompt_batch, group)
        return rollouts

    def held_out(self, run: Any, sampler: Any) -> Any:
        """The held-out evaluation of this environment: greedy completions of the held-out prompts, scored."""
        from ditty.objectives.rl.evaluation import RolloutEvaluation

        config = run.config
        return RolloutEvaluation(
            run.data.bundle, self.functions, run.tokenizer, config.rollout.max_new_tokens, config.rl.reward_timeout_s
        )

    def score_drawn(self, rollouts: RolloutBatch, prompt_batch: Mapping[str, Any], group: int) -> None:
        """Score completions drawn ahead of the step (rollout.max_staleness): `group` of each prompt."""
        prompts = [p for p in prompt_batch["prompts"] for _ in range(group)]
        columns = {name: [v for v in values for _ in range(group)] for name, values in prompt_batch["columns"].items()}
        self.score(rollouts, prompts, columns)

    def score(self, rollouts: RolloutBatch, prompts: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> None:
        """`prompts` and `columns` hold one entry per row of `rollouts` (a group's prompt repeated)."""
        scores = score_completions(self.functions, prompts, rollouts.texts, columns, timeout_s=self.timeout_s)
        rollouts.rewards = scores.total
        rollouts.rewards_per_function = scores.per_function
        rollouts.reward_details = scores.details
