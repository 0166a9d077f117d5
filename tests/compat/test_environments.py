"""The original Ditty's `Environment` (reset(task) / step(action) -> EnvironmentStepResult) runs in
ditty's episodes through `ditty.compat.environments.as_environment`."""

from __future__ import annotations

import ditty
from ditty.compat.environments import EnvironmentStepResult, OriginalEnvironment, as_environment
from ditty.objectives.environments.protocol import Environment, StepResult
from tests.rl.environments_for_tests import OriginalCalculatorGame

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*3"}}</tool_call>'


def test_the_original_names_import_from_ditty():
    assert ditty.EnvironmentStepResult is EnvironmentStepResult
    import ditty.environments as original_module  # the original's module name

    assert original_module.EnvironmentStepResult is EnvironmentStepResult
    result = EnvironmentStepResult(observation="ok", reward=1.0, done=False)
    assert result.info == {}


def test_an_original_environment_plays_ditty_episodes():
    Game = as_environment(OriginalCalculatorGame)
    assert issubclass(Game, OriginalEnvironment) and Game.__name__ == "OriginalCalculatorGame"
    env = Game()
    assert isinstance(env, Environment)  # ditty's protocol
    assert env.reset({"prompt": "12*3=", "completion": "36"}) == [{"role": "user", "content": "12*3="}]
    result = env.step("let me call " + CALL)
    assert isinstance(result, StepResult) and not result.done and result.reward == 1.0
    assert result.observation == [{"role": "tool", "name": "calculator", "content": "36"}]
    assert result.metrics == {"matched": 1.0}  # numbers (booleans as 0/1) of info; text is left out
    assert env.step("36").done  # a turn without an action ends the episode


def test_a_wrong_or_malformed_action_is_judged_by_the_original_environment():
    env = as_environment(OriginalCalculatorGame)()
    env.reset({"prompt": "12*3="})
    result = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "12+3"}}</tool_call>')
    assert result.done and result.reward == 0.0 and result.metrics == {"wrong_branch": 1.0}
    env.reset({"prompt": "12*3="})
    assert env.step("<tool_call>{oops</tool_call>").metrics == {"wrong_branch": 1.0}
