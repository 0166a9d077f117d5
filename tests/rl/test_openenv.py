"""An OpenEnv environment (openenv-core, an optional package: skipped where it is absent) plays
ditty's episodes through `ditty.objectives.environments.openenv.openenv_environment`."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv.core")
pytest.importorskip("fastmcp")

from fastmcp import FastMCP  # noqa: E402
from openenv.core import Action, Environment, MCPEnvironment, Observation, State  # noqa: E402

from ditty.objectives.environments.openenv import openenv_environment  # noqa: E402

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 3}}</tool_call>'


class Calculator(MCPEnvironment):
    def __init__(self):
        mcp = FastMCP("calculator")

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiply two numbers."""
            return a * b

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id)
        return Observation()

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=True)

    @property
    def state(self):
        return self._state


class Guess(Action):
    number: int


class Hint(Observation):
    hint: str = ""


class GuessTheNumber(Environment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        self.secret = 7 if seed is None else seed
        return Hint(hint="guess")

    def step(self, action, timeout_s=None, **kwargs):
        if action.number == self.secret:
            return Hint(hint="right", done=True, reward=1.0)
        return Hint(hint="higher" if action.number < self.secret else "lower", reward=-0.1)

    @property
    def state(self):
        return State()


def test_an_openenv_mcp_environment_answers_tool_calls():
    env = openenv_environment(Calculator)()
    assert env.reset({"prompt": "12*3="}) == [{"role": "user", "content": "12*3="}]
    result = env.step("let me " + CALL)
    assert not result.done and result.observation == [{"role": "tool", "name": "multiply", "content": "36"}]
    assert result.metrics == {"tool_calls": 1.0, "tool_errors": 0.0}
    failed = env.step('<tool_call>{"name": "divide", "arguments": {}}</tool_call>')
    assert failed.observation[0]["content"].startswith("error: ") and failed.metrics["tool_errors"] == 1.0
    assert env.step("36").done


def test_an_openenv_environment_with_its_own_actions():
    Game = openenv_environment(GuessTheNumber, action=lambda text: Guess(number=int(text.strip() or 0)))
    env = Game()
    env.reset({"prompt": "guess a number", "seed": 5})
    low = env.step("3")
    assert not low.done and low.reward == pytest.approx(-0.1)
    assert low.observation == [{"role": "user", "content": '{"hint": "higher"}'}]
    right = env.step("5")
    assert right.done and right.reward == 1.0 and right.observation is None
