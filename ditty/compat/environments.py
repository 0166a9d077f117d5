"""The original Ditty library's environments, run by ditty's episodes (ditty.objectives.environments.episodes).

The original's protocol: `reset(task) -> str` and `step(action: dict) -> EnvironmentStepResult`
(observation text, reward, done, info), where an action is one tool call parsed from the model's text
({"name": ..., "arguments": {...}}). ditty's protocol steps a whole model turn instead
(`step(completion) -> StepResult`). `as_environment(OriginalClass)` makes a class of ditty's protocol
that a recipe names (`[rl] environment = "my_module:MyGame"` after `MyGame = as_environment(Game)`):

- the episode starts from the prompt row (the task is the row: {"prompt": ..., every other column});
  what the original's `reset` returns was a status in the original (it replayed actions after
  generation and showed the model nothing), so it is not shown to the model here either;
- each model turn's tool calls (in the chat template's format, Hermes by default) are stepped in
  order, each answer coming back as a `tool` message; a call that cannot be parsed is an action of
  {"name": "", "arguments": {}, "error": why}, which the original environment judges as it judged
  a wrong action;
- the episode ends when the environment says done or the model writes a turn without a call; the
  turn's reward is the sum of its steps' rewards, and the numbers of `info` are logged as env/NAME.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from ditty.objectives.environments.protocol import StepResult
from ditty.objectives.environments.tools.calls import HermesCalls


@dataclass
class EnvironmentStepResult:
    """The original's step result."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class OriginalProtocol(Protocol):
    """The original library's environment protocol (ditty's own is ditty.rl.Environment)."""

    def reset(self, task: Any) -> str: ...

    def step(self, action: dict[str, Any]) -> EnvironmentStepResult: ...


Environment = OriginalProtocol
"""The name the original library gave its protocol (`from ditty.environments import Environment`)."""


class OriginalEnvironment:
    """ditty's `Environment` over one of the original's (see the module doc); `as_environment` makes
    a class of it that builds the original without arguments."""

    original_class: Any = None
    call_format: Any = HermesCalls()

    def __init__(self, original: Any = None) -> None:
        self.original = original if original is not None else type(self).original_class()

    def reset(self, row: Mapping[str, Any]) -> Any:
        self.original.reset(dict(row))
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]

    def step(self, completion: str) -> StepResult:
        calls = self.call_format.parse(completion)
        if not calls:
            return StepResult(done=True)
        messages, reward, metrics, done = [], 0.0, {}, False
        for call in calls:
            action = {"name": call.name, "arguments": dict(call.arguments)}
            if call.error:
                action["error"] = call.error
            result = self.original.step(action)
            reward += float(result.reward)
            for name, value in (result.info or {}).items():
                if isinstance(value, numbers.Real):  # booleans count as 0/1
                    metrics[name] = metrics.get(name, 0.0) + float(value)
            messages.append({"role": "tool", "name": call.name, "content": str(result.observation)})
            if result.done:
                done = True
                break
        return StepResult(observation=None if done else messages, reward=reward, done=done, metrics=metrics)


def as_environment(original_class: type) -> type:
    """A class of ditty's environment protocol running `original_class` (built without arguments)."""
    return type(original_class.__name__, (OriginalEnvironment,), {"original_class": original_class})
