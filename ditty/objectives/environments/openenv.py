"""OpenEnv environments (`pip install openenv-core`) in ditty's episodes, in-process.

OpenEnv's server-side `Environment` is Gymnasium's loop (`reset() -> Observation`, `step(action) ->
Observation` carrying `reward` and `done`), the shape of ditty's protocol, so an environment written
for OpenEnv runs here unchanged. `openenv_environment(EnvClass)` makes a class of ditty's protocol
that a recipe names (`[rl] environment = "my_module:Game"` after `Game = openenv_environment(MyEnv)`):

- the episode starts from the prompt row (its prompt as the user's message), and OpenEnv's `reset`
  starts the environment's own state (seeded by a `seed` column when the row has one);
- an `MCPEnvironment` (tools served by FastMCP) is stepped with one `CallToolAction` per tool call
  the model writes (the chat template's format, Hermes by default); the result, or the error, comes
  back as a `tool` message; a turn without a call ends the episode;
- any other environment needs `action=`: a function from the model's text to the environment's
  `Action`; the observation comes back as a user message, its fields other than done, reward and
  metadata written as JSON (`observation=` writes it otherwise).

Rewards are the observations' `reward` (None counts as 0), summed over the turn's steps. openenv-core
is imported only when such a class is built; ditty does not depend on it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional

from ditty.objectives.environments.protocol import StepResult
from ditty.objectives.environments.tools.calls import HermesCalls


class OpenEnvEnvironment:
    environment_class: Any = None
    make_action: Optional[Callable[[str], Any]] = None
    write_observation: Optional[Callable[[Any], str]] = None
    call_format: Any = HermesCalls()

    def __init__(self) -> None:
        from openenv.core import MCPEnvironment

        self.env = type(self).environment_class()
        self.tools = isinstance(self.env, MCPEnvironment)

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.env.reset(**({"seed": int(row["seed"])} if row.get("seed") is not None else {}))
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]

    def step(self, completion: str) -> StepResult:
        if not self.tools:
            observation = self.env.step(type(self).make_action(completion))
            text = (type(self).write_observation or observation_json)(observation)
            done = bool(observation.done)
            message = None if done else [{"role": "user", "content": text}]
            return StepResult(observation=message, reward=float(observation.reward or 0.0), done=done)
        from openenv.core import CallToolAction

        calls = self.call_format.parse(completion)
        if not calls:
            return StepResult(done=True, metrics={"tool_calls": 0.0, "tool_errors": 0.0})
        messages, reward, errors, done = [], 0.0, 0.0, False
        for call in calls:
            if call.error:
                content, failed = f"error: malformed tool call: {call.error}", True
            else:
                observation = self.env.step(CallToolAction(tool_name=call.name, arguments=call.arguments))
                reward += float(observation.reward or 0.0)
                done = done or bool(observation.done)
                failed = observation.error is not None
                content = f"error: {observation.error}" if failed else result_text(observation.result)
            errors += failed
            messages.append({"role": "tool", "name": call.name, "content": content})
        metrics = {"tool_calls": float(len(calls)), "tool_errors": errors}
        return StepResult(observation=None if done else messages, reward=reward, done=done, metrics=metrics)


def observation_json(observation: Any) -> str:
    return json.dumps(observation.model_dump(exclude={"done", "reward", "metadata"}), default=str)


def result_text(result: Any) -> str:
    """A tool's result as text: FastMCP's structured data when there is some, else its text content."""
    data = getattr(result, "data", None)
    if data is not None:
        return data if isinstance(data, str) else json.dumps(data, default=str)
    content = getattr(result, "content", None)
    if content:
        return "".join(getattr(part, "text", str(part)) for part in content)
    return result if isinstance(result, str) else json.dumps(result, default=str)


def openenv_environment(
    environment_class: type,
    action: Optional[Callable[[str], Any]] = None,
    observation: Optional[Callable[[Any], str]] = None,
) -> type:
    """A class of ditty's environment protocol running OpenEnv's `environment_class` (built without
    arguments); `action`: text -> the environment's Action (not needed for an MCPEnvironment)."""
    attributes = {
        "environment_class": environment_class,
        "make_action": staticmethod(action) if action else None,
        "write_observation": staticmethod(observation) if observation else None,
    }
    return type(environment_class.__name__, (OpenEnvEnvironment,), attributes)
