"""Episodes of several turns: the environment part for `[rl] environment` or `tools`.

`EpisodeEnvironment.run` plays one `Environment` (ditty.objectives.environments.protocol) per episode,
`group` episodes per prompt row, `rollout.generation_batch_size` prompts' episodes together (all of the
rank's when 0). Each turn, the open episodes of the batch generate together
(`sampler.generate_turn`: each prompt's KV cache computed once for its episodes); the environment
steps each on its completion, its observation is appended (ditty.objectives.environments.rendering), and
episodes that are done drop out of the next turn's batch. An episode ends when its environment says
done, or truncated: after `rl.max_turns` model turns, at `rl.max_episode_tokens` tokens after its
prompt, or when a model turn is cut at `rollout.max_new_tokens` before its end-of-sequence token (its
environment still steps on what it wrote). Truncation is counted (`env/truncated`), never an error;
an observation is cut to the episode's room before it is rendered, and counted (`env/observations_cut`).

Sampling is seeded by the global position of a batch's first prompt and the turn (as the one-turn
sampler is by the position), so the same prompts play the same episodes on any world size and after
a resume. An episode's reward is the sum of its turns' rewards plus, where `rl.rewards` names
functions, their score of its final model turn (with the prompt row's columns).

Under fsdp a forward is a collective, so every rank plays the same number of turns: a rank whose
episodes have all ended joins the others' turns with one idle row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ditty._utils.deadline import DeadlinePassed, deadline
from ditty._utils.errors import users_ctrl_c
from ditty.config.errors import RecipeError
from ditty.objectives.environments.protocol import (
    ENDS_AN_EPISODE,
    StepResult,
    environment_failure,
    observation_problem,
    step_result_problem,
)
from ditty.objectives.environments.rendering import ObservationRenderer
from ditty.objectives.rewards.functions import RewardFunction, score_completions
from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.generate_sampler import TurnRequest


@dataclass
class Episode:
    row: dict
    environment: Any
    prompt_ids: list[int]
    conversation: Optional[list]
    """The chat messages so far (None when the observations are text)."""
    tokens: list[int] = field(default_factory=list)
    """Everything after the prompt: the model's turns and the environment's observations."""
    trainable: list[bool] = field(default_factory=list)
    sampler_logps: Optional[list[float]] = None
    """Per token of `tokens`, the log-probability the sampler drew it with (NaN for the environment's
    tokens); None when the sampler reports none (generate)."""
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) of each model turn in `tokens`."""
    turn_rewards: list[float] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    last_text: str = ""
    """The text of the model's last turn: what the reward functions score."""
    done: bool = False
    truncated: bool = False
    observations_cut: int = 0
    """Observations cut to the episode's room (env/observations_cut)."""


class EpisodeEnvironment:
    """`make()` builds one environment (one per episode); `name` says which in messages and metrics;
    `functions` score the final turns (may be empty when the environment rewards its steps)."""

    def __init__(
        self,
        make: Callable[[], Any],
        name: str,
        functions: Sequence[RewardFunction],
        renderer: ObservationRenderer,
        rl: Any,
        rollout: Any = None,
        *,
        key: str = "rl.environment",
        reward_name: Optional[str] = None,
    ) -> None:
        """`rl`, `rollout`: the recipe's RLConfig (turns, budgets, timeouts) and RolloutConfig (how a turn
        is sampled; its defaults when None)."""
        from ditty.config.rollout import RolloutConfig

        self.make, self.name, self.functions, self.renderer, self.rl = make, name, list(functions), renderer, rl
        self.rollout = rollout if rollout is not None else RolloutConfig()
        self.key = key
        self.reward_name = reward_name
        """Logs the environment's own step rewards as rewards/NAME/mean (None: they are not a component)."""

    def held_out(self, run: Any, sampler: Any) -> Any:
        """The held-out evaluation of these episodes: greedy episodes of the held-out prompt rows."""
        from ditty.objectives.environments.episode_evaluation import EpisodeEvaluation

        return EpisodeEvaluation(run.data.bundle, self, sampler)

    def score_drawn(self, rollouts: RolloutBatch, prompt_batch: Mapping[str, Any], group: int) -> None:
        """Episodes are played turn by turn in step with training: the compiler refuses sampling ahead
        with them (rollout.max_staleness), so no run gets here."""
        raise RecipeError.single(
            key="rollout.max_staleness",
            message="episodes of several turns are played in step with training, not sampled ahead",
            fix="set rollout.max_staleness = 0",
        )

    def run(
        self, sampler: Any, prompt_batch: Mapping[str, Any], first_position: int, group: int, *, greedy: bool = False
    ) -> RolloutBatch:
        columns = prompt_batch["columns"]
        rows = [
            {"prompt": prompt, **{name: values[i] for name, values in columns.items()}}
            for i, prompt in enumerate(prompt_batch["prompts"])
        ]
        per_call = self.rollout.generation_batch_size or max(len(rows), 1)
        episodes: list[Episode] = []
        for start in range(0, len(rows), per_call):
            batch = [self.open(row) for row in rows[start : start + per_call] for _ in range(group)]
            self.play(sampler, batch, first_position + start, greedy)
            episodes += batch
        return self.rollouts(episodes)

    # ---------------------------------------------------------------- one batch of episodes

    def open(self, row: dict) -> Episode:
        build_fix = "an environment is built once per episode, with rl.environment_args: fix its constructor"
        environment = self.call(row, "its constructor", self.make, fix=build_fix, raised="could not be built")
        observation = self.call(row, "reset", environment.reset, row, fix=_RESET_FIX)
        problem = observation_problem(observation) if observation is not None else "None"
        if problem:
            raise environment_failure(self.name, row, f"reset returned {problem}", self.key, _RESET_FIX)
        # A prompt longer than data.max_seq_len is a bad row, as in the prompt format: cut, it would lose
        # its start (the question) or its end (the generation prompt). Text past what the limit's tokens
        # can hold is refused before it is rendered or tokenized.
        limit, renderer = self.renderer.max_prompt_tokens, self.renderer
        if renderer.text_length(observation) > limit * renderer.chars_per_token:
            what = f"reset returned a prompt of {renderer.text_length(observation):,} characters, more than"
            raise environment_failure(
                self.name, row, f"{what} data.max_seq_len = {limit} tokens hold", self.key, _LONG_FIX
            )
        prompt_ids, conversation = renderer.prompt(observation)
        if len(prompt_ids) > limit:
            what = f"reset returned a prompt of {len(prompt_ids)} tokens, longer than data.max_seq_len = {limit}"
            raise environment_failure(self.name, row, what, self.key, _LONG_FIX)
        return Episode(row=row, environment=environment, prompt_ids=prompt_ids, conversation=conversation)

    def call(self, row: Any, what: str, function: Callable[..., Any], *args: Any, fix: str, raised: str = "") -> Any:
        """function(*args), a call into the environment, bounded by `rl.environment_timeout_s`.
        Whatever it raises is an EnvironmentFailure naming `what` (SystemExit too: a user's sys.exit()
        would end the run unreported; and a KeyboardInterrupt of its own, which is not the user's Ctrl-C)."""
        timeout_s = getattr(self.rl, "environment_timeout_s", 0.0)
        try:
            with deadline(timeout_s):
                return function(*args)
        except DeadlinePassed:
            what = f"did not return from {what} within rl.environment_timeout_s = {timeout_s:g} s"
            raise environment_failure(self.name, row, what, self.key, _HANG_FIX) from None
        except (Exception, SystemExit, KeyboardInterrupt) as error:
            if isinstance(error, KeyboardInterrupt) and users_ctrl_c(error):
                raise
            said = f": {error}" if str(error) else ""
            what = (
                f"{raised}: {type(error).__name__}{said}"
                if raised
                else f"raised {type(error).__name__} in {what}{said}"
            )
            raise environment_failure(self.name, row, what, self.key, fix) from error

    def play(self, sampler: Any, episodes: list[Episode], position: int, greedy: bool) -> None:
        tokenizer = self.renderer.tokenizer
        eos = tokenizer.eos_token_id
        rl = self.rl
        for turn in range(rl.max_turns):
            live = [e for e in episodes if not e.done]
            if not any_open(len(live)):
                break
            playing = live or episodes[:1]  # an idle rank joins the others' forwards with one row
            prompts: dict[tuple, int] = {}
            for e in playing:
                prompts.setdefault(tuple(e.prompt_ids), len(prompts))
            rooms = [rl.max_episode_tokens - len(e.tokens) for e in playing]
            generated = sampler.generate_turn(
                TurnRequest(
                    prompts=[list(p) for p in prompts],
                    prompt_of=[prompts[tuple(e.prompt_ids)] for e in playing],
                    histories=[e.tokens for e in playing],
                    max_new_tokens=max(1, min(self.rollout.max_new_tokens, max(rooms))),
                    seed_position=position,
                    turn=turn,
                    greedy=greedy,
                )
            )
            logps = generated.logps or [None] * len(generated.tokens)
            for episode, ids, values, room in zip(live, generated.tokens, logps, rooms):
                self.take_turn(episode, ids[:room], eos, tokenizer, None if values is None else values[:room])
        for episode in episodes:
            if not episode.done:  # still open after max_turns model turns
                episode.done = episode.truncated = True

    def take_turn(
        self, episode: Episode, ids: list[int], eos: Optional[int], tokenizer: Any, logps: Optional[list[float]]
    ) -> None:
        ended = eos is not None and len(ids) > 0 and ids[-1] == eos
        start = len(episode.tokens)
        if logps is not None:  # the sampler's log-probability of each of the model's tokens
            episode.sampler_logps = (episode.sampler_logps or [float("nan")] * start) + list(logps)
        episode.tokens += ids
        episode.trainable += [True] * len(ids)
        episode.turn_spans.append((start, len(episode.tokens)))
        episode.last_text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        result = self.step(episode, episode.last_text)
        episode.turn_rewards.append(float(result.reward))
        for name, value in result.rewards.items():
            episode.rewards[name] = episode.rewards.get(name, 0.0) + float(value)
        for name, value in result.metrics.items():
            episode.metrics[name] = episode.metrics.get(name, 0.0) + float(value)
        room = self.rl.max_episode_tokens - len(episode.tokens)
        if not ended or room <= 0:  # cut at max_new_tokens or at the episode's budget
            episode.done = episode.truncated = True
            return
        if result.done:
            episode.done = True
            return
        if result.observation:
            # Bounded before it is rendered: what runs past the episode's room is cut, and counted.
            observation, cut = self.renderer.bounded(result.observation, room)
            added, episode.conversation = self.renderer.after_turn(episode.conversation, episode.last_text, observation)
            if len(added) >= room:  # no room left for another model turn
                cut = cut or len(added) > room
                added, episode.done, episode.truncated = added[:room], True, True
            episode.observations_cut += cut
            episode.tokens += added
            episode.trainable += [False] * len(added)
            if episode.sampler_logps is not None:  # the environment's tokens: not the sampler's
                episode.sampler_logps += [float("nan")] * len(added)

    def environment_columns(self, episodes: list[Episode], data_columns: set[str]) -> dict[str, list]:
        """What the episodes' environments give the reward functions beside the data's columns: each
        environment's optional `reward_columns()` ({name: its value}; the built-in tool environment
        gives `tool_calls`), one value per episode (None where an environment gives none)."""
        given = []
        for episode in episodes:
            method = getattr(episode.environment, "reward_columns", None)
            values = self.call(episode.row, "reward_columns", method, fix=ENDS_AN_EPISODE) if method is not None else {}
            if not isinstance(values, Mapping):
                what = f"reward_columns returned a {type(values).__name__}, not a mapping of names to values"
                raise environment_failure(self.name, episode.row, what, self.key)
            given.append(values)
        names = sorted({name for values in given for name in values})
        clash = [name for name in names if name in data_columns or name in ("prompts", "completions")]
        if clash:
            raise RecipeError.single(
                f"the prompt rows have a column {clash[0]!r}, the keyword under which environment {self.name} "
                "gives the reward functions a value of each episode",
                key="data",
                fix="rename the column",
            )
        return {name: [values.get(name) for values in given] for name in names}

    def step(self, episode: Episode, completion: str) -> StepResult:
        turn = len(episode.turn_spans)
        result = self.call(
            episode.row, f"step (turn {turn})", episode.environment.step, completion, fix=ENDS_AN_EPISODE
        )
        if not isinstance(result, StepResult) and not _looks_like_step_result(result):
            what = f"step returned a {type(result).__name__}, not a StepResult"
            raise environment_failure(self.name, episode.row, what, self.key, _STEP_FIX)
        problem = step_result_problem(result)
        if problem:
            raise environment_failure(
                self.name, episode.row, f"step (turn {turn}) returned {problem}", self.key, _STEP_FIX
            )
        return result

    # ---------------------------------------------------------------- the rollouts

    def rollouts(self, episodes: list[Episode]) -> RolloutBatch:
        out = RolloutBatch(
            prompt_ids=[e.prompt_ids for e in episodes],
            completion_ids=[e.tokens for e in episodes],
            texts=[e.last_text for e in episodes],
            truncated=[e.truncated for e in episodes],
            trainable=[e.trainable for e in episodes],
            sampler_logps=(
                [e.sampler_logps or [float("nan")] * len(e.tokens) for e in episodes]
                if any(e.sampler_logps is not None for e in episodes)
                else None
            ),
            turn_spans=[e.turn_spans for e in episodes],
            turn_rewards=[list(e.turn_rewards) for e in episodes],
        )
        steps = torch.tensor([sum(e.turn_rewards) for e in episodes], dtype=torch.float64)
        total, per_function, details = steps.clone(), {}, {}
        if self.functions:
            columns = {name: [e.row[name] for e in episodes] for name in episodes[0].row if name != "prompt"}
            columns.update(self.environment_columns(episodes, set(columns)))
            prompts = [e.row["prompt"] for e in episodes]
            scores = score_completions(self.functions, prompts, out.texts, columns, timeout_s=self.rl.reward_timeout_s)
            total += scores.total
            per_function, details = dict(scores.per_function), dict(scores.details)
            for episode, value in zip(episodes, scores.total.tolist()):  # the final answer's score ends the last turn
                episode.turn_rewards[-1] += value
            out.turn_rewards = [list(e.turn_rewards) for e in episodes]
        if self.reward_name is not None:
            per_function[self.reward_name] = steps
        for name in sorted({n for e in episodes for n in e.rewards}):
            per_function[name] = torch.tensor([e.rewards.get(name, 0.0) for e in episodes], dtype=torch.float64)
        out.rewards, out.rewards_per_function, out.reward_details = total, per_function, details
        out.episode_metrics = episode_metrics(episodes)
        return out


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, torch.Tensor]:
    """Per episode ([rows] each): env/turns, env/episode_tokens, env/truncated, env/observations_cut and
    the environment's own metrics (env/NAME, summed over its turns; 0 where an episode reported none)."""
    metrics = {
        "env/turns": [float(len(e.turn_spans)) for e in episodes],
        "env/episode_tokens": [float(len(e.tokens)) for e in episodes],
        "env/truncated": [float(e.truncated) for e in episodes],
        "env/observations_cut": [float(e.observations_cut) for e in episodes],
    }
    for name in sorted({n for e in episodes for n in e.metrics}):
        metrics[f"env/{name}"] = [e.metrics.get(name, 0.0) for e in episodes]
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in metrics.items()}


def any_open(count: int) -> bool:
    """Whether any rank has an open episode (every rank plays the same turns)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return count > 0
    flag = torch.tensor([float(count > 0)])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def _looks_like_step_result(result: Any) -> bool:
    """Another library's step result with the same fields (the original Ditty's maps through ditty.compat)."""
    return all(hasattr(result, name) for name in ("observation", "reward", "done", "metrics", "rewards"))


_HANG_FIX = (
    "find why it hangs (a network call, a lock, a simulator that never answers), or raise rl.environment_timeout_s"
)
_LONG_FIX = "a prompt is never cut: shorten what reset returns for this row, or raise data.max_seq_len"
_RESET_FIX = 'reset(row) returns the first observation: text, or chat messages [{"role": "user", "content": ...}]'
_STEP_FIX = (
    "step(completion) returns StepResult(observation=text or messages or None, reward=a number, done=..., "
    "metrics={name: number}, rewards={name: number})"
)
