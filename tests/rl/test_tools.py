"""The built-in tool environment: calls parsed in the chat template's format, tools answered as
`tool` messages, and every kind of failure answered too (the episode goes on) and counted."""

from __future__ import annotations

import json
import time

import pytest

from ditty.objectives.environments.tools.builtin_tools import calculator
from ditty.objectives.environments.tools.calls import CALL_FORMATS, call_format_for
from ditty.objectives.environments.tools.tool_environment import ToolEnvironment, load_tools, tool_schemas
from tests.rl import environments_for_tests as envs

TOOLS = {"calculator": calculator, "echo": envs.echo, "broken": envs.broken, "hangs": envs.hangs}


def call(name, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_a_well_formed_call_is_answered_with_the_tools_result():
    env = ToolEnvironment(TOOLS)
    assert env.reset({"prompt": "123*456="}) == [{"role": "user", "content": "123*456="}]
    result = env.step("let me compute " + call("calculator", expression="123*456"))
    assert not result.done and result.reward == 0.0
    assert result.observation == [{"role": "tool", "name": "calculator", "content": "56088"}]
    assert result.metrics["tool_calls"] == 1.0 and result.metrics["tool_calls/calculator"] == 1.0
    assert result.metrics["tool_calls/echo"] == 0.0  # every name on every turn
    assert result.metrics["tool_errors"] == 0.0 and result.metrics["tool_errors/timeout"] == 0.0


def test_a_turn_without_a_call_is_the_final_answer():
    result = ToolEnvironment(TOOLS).step("56088")
    assert result.done and result.observation is None and result.metrics["tool_calls"] == 0


@pytest.mark.parametrize(
    "text, error, words",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+', "malformed", "not closed"),
        ("<tool_call>{name: calculator}</tool_call>", "malformed", "not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "malformed", 'needs a "name"'),
        (call("weather", city="Paris"), "unknown", "unknown tool 'weather' (the tools are"),
        (call("broken", x=1), "raised", "broken raised ZeroDivisionError: division by zero in the tool"),
        (call("calculator", expression="__import__('os')"), "raised", "only numbers and"),
        (call("calculator", wrong=1), "raised", "TypeError"),
    ],
)
def test_a_failed_call_is_a_tool_message_and_counted(text, error, words):
    result = ToolEnvironment(TOOLS).step(text)
    assert not result.done  # the episode goes on: the model reads the error and may try again
    (message,) = result.observation
    assert message["role"] == "tool" and message["content"].startswith("error: ") and words in message["content"]
    assert result.metrics["tool_calls"] == 1 and result.metrics["tool_errors"] == 1
    assert result.metrics[f"tool_errors/{error}"] == 1


def test_a_tool_that_hangs_past_the_timeout_is_answered_and_counted():
    env = ToolEnvironment(TOOLS, timeout_s=0.2)
    started = time.perf_counter()
    result = env.step(call("hangs", seconds=3.0) + call("echo", text="still here"))
    assert time.perf_counter() - started < 2.0
    late, echoed = result.observation
    assert late["content"] == "error: hangs did not answer within 0.2 s"
    assert echoed["content"] == "still here"  # the next call of the turn still runs
    assert result.metrics["tool_errors/timeout"] == 1 and result.metrics["tool_calls"] == 2


def test_call_formats_follow_the_chat_template():
    assert call_format_for(None).name == "hermes"
    assert call_format_for("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert call_format_for("{{ '<|python_tag|>' }}").name == "llama3"
    for form in CALL_FORMATS.values():
        written = form.write("calculator", {"expression": "2*3"})
        (parsed,) = form.parse(written if form.name == "llama3" else "ok " + written)
        assert (parsed.name, parsed.arguments, parsed.error) == ("calculator", {"expression": "2*3"}, None)
    assert CALL_FORMATS["mistral"].parse("[TOOL_CALLS] [{]")[0].error.startswith("the call is not JSON")
    assert CALL_FORMATS["llama3"].parse("the answer is 6") == []
    openai = '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
    assert CALL_FORMATS["hermes"].parse(openai)[0].arguments == {"text": "hi"}


def test_the_calculator():
    assert calculator("123*456") == "56088" and calculator("(2+3)**2 - 7/2") == "21.5" and calculator("-4//3") == "-2"
    for bad in ("2**1000", "open('x')", "1 if 2 else 3", "a+1"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_tools_are_named_by_their_function_and_described_for_chat_templates():
    tools = load_tools(
        ["ditty.objectives.environments.tools.builtin_tools:calculator", "tests.rl.environments_for_tests:echo"]
    )
    assert list(tools) == ["calculator", "echo"]
    schemas = tool_schemas(tools)
    assert schemas[0]["function"]["name"] == "calculator"
    assert schemas[0]["function"]["parameters"]["properties"]["expression"]["type"] == "string"


def test_reward_functions_get_each_episodes_well_formed_calls():
    """The tool environment keeps an episode's calls; the reward functions of rl.rewards get them as
    `tool_calls`, one list per episode, so a reward can score the call as well as the answer."""
    from types import SimpleNamespace

    from ditty.objectives.environments.episodes import Episode, EpisodeEnvironment
    from ditty.objectives.rewards.functions import load_reward_functions

    turns = {  # each episode's model turns; the last one, without a call, is its answer
        "633*148=": [call("calculator", expression="633*148"), "93684"],
        "918*298=": ["<tool_call>{oops</tool_call>", call("calculator", expression="718*298"), "213964"],
    }
    episodes = []
    for prompt, texts in turns.items():
        env = ToolEnvironment(TOOLS)
        env.reset({"prompt": prompt})
        for text in texts:
            env.step(text)
        rewards = [0.0] * len(texts)
        episodes.append(Episode(row={"prompt": prompt}, environment=env, prompt_ids=[], conversation=None))
        episodes[-1].turn_rewards, episodes[-1].last_text = rewards, texts[-1]
    functions = load_reward_functions(["ditty.objectives.rewards.builtin_rewards:call_expression_match"])
    rl = SimpleNamespace(reward_timeout_s=0.0)
    out = EpisodeEnvironment(lambda: None, "ToolEnvironment", functions, None, rl, key="rl.tools").rollouts(episodes)
    assert episodes[1].environment.calls == [{"name": "calculator", "arguments": {"expression": "718*298"}}]
    assert out.rewards.tolist() == [1.0, 6 / 7]  # the malformed call is not one of the calls
    assert out.turn_rewards == [[0.0, 1.0], [0.0, 0.0, 6 / 7]]  # the score ends the last turn

    episodes[0].row["tool_calls"] = episodes[1].row["tool_calls"] = "a column of the data"
    with pytest.raises(Exception, match="column 'tool_calls'"):
        EpisodeEnvironment(lambda: None, "ToolEnvironment", functions, None, rl, key="rl.tools").rollouts(episodes)


def test_an_environments_reward_columns_reach_the_reward_functions_and_a_bad_one_is_exit_2():
    """Any environment may give the reward functions values of its episode (`reward_columns`); one
    that answers something else than a mapping stops the run naming the environment."""
    from types import SimpleNamespace

    from ditty.objectives.environments.episodes import Episode, EpisodeEnvironment
    from ditty.objectives.environments.protocol import EnvironmentFailure

    class Scored:
        def __init__(self, values):
            self.values = values

        def reward_columns(self):
            return self.values

    def episodes(*values):
        out = [Episode(row={"prompt": "1+1="}, environment=Scored(v), prompt_ids=[], conversation=None) for v in values]
        for episode in out:
            episode.turn_rewards = [0.0]
        return out

    env = EpisodeEnvironment(lambda: None, "Scored", [], None, SimpleNamespace(reward_timeout_s=0.0))
    assert env.environment_columns(episodes({"moves": 3}, {}), {"answer"}) == {"moves": [3, None]}
    with pytest.raises(EnvironmentFailure, match="environment Scored reward_columns returned a list"):
        env.environment_columns(episodes([1, 2]), set())


TOOL_REFERENCES = {
    name: f"tests.rl.environments_for_tests:{name}"
    for name in ("echo", "broken", "hangs", "unprintable", "exits", "crashes", "huge", "prints", "fetch")
}


@pytest.fixture(params=["thread", "process"])
def isolated(request):
    """A ToolEnvironment maker for each rl.tools_isolation, over every test tool."""
    from ditty.objectives.environments.tools.process import ToolProcess

    tools = {name: function for name, function in load_tools(list(TOOL_REFERENCES.values())[:-1]).items()}
    processes = []

    def make(timeout_s=10.0, environment=None):
        process = None
        if request.param == "process":
            process = ToolProcess(TOOL_REFERENCES, timeout_s)
            processes.append(process)
        return ToolEnvironment(tools, timeout_s=timeout_s, process=process, environment=environment)

    yield make
    for process in processes:
        process.close()


@pytest.mark.parametrize(
    "text, words",
    [
        (call("unprintable"), "error: unprintable returned a Unprintable that cannot be shown as text: ValueError"),
        (call("broken", x=1), "error: broken raised ZeroDivisionError: division by zero in the tool"),
    ],
)
def test_a_result_that_cannot_be_text_is_the_tools_error_not_the_environments(isolated, text, words):
    """A result whose __str__ raises is answered as the tool's error, in either isolation: it was an
    EnvironmentFailure blaming "environment ToolEnvironment" with a fix about StepResult."""
    result = isolated().step(text + call("echo", text="next"))
    failed, echoed = result.observation
    assert failed["content"].startswith(words), failed["content"]
    assert echoed["content"] == "next" and result.metrics["tool_errors/raised"] == 1


def test_a_tool_in_a_process_that_exits_crashes_or_hangs_is_answered_and_the_next_call_runs():
    """rl.tools_isolation = "process": os._exit(0), a segfault and a hang end the worker, not the run."""
    from ditty.objectives.environments.tools.process import ToolProcess

    process = ToolProcess(TOOL_REFERENCES, timeout_s=2.0)
    env = ToolEnvironment(load_tools(list(TOOL_REFERENCES.values())[:-1]), timeout_s=2.0, process=process)
    try:
        started = time.perf_counter()
        result = env.step(
            call("exits", code=0) + call("echo", text="a")
            + call("crashes") + call("echo", text="b")
            + call("hangs", seconds=600) + call("echo", text="c")
            + call("prints", text="d")
        )  # fmt: skip
        assert time.perf_counter() - started < 30
        contents = [m["content"] for m in result.observation]
        assert contents[0] == "error: exits ended its process (exit code 0) before it answered"
        assert contents[2] == "error: crashes ended its process (signal SIGSEGV) before it answered"
        assert contents[4] == "error: hangs did not answer within 2 s"
        assert contents[1::2] == ["a", "b", "c"] and contents[6] == "d"  # a fresh worker answers each next call
        assert result.metrics["tool_errors/raised"] == 2 and result.metrics["tool_errors/timeout"] == 1
    finally:
        process.close()


def test_a_tool_process_answers_a_huge_result_up_to_its_limit_and_is_closed(tmp_path):
    from ditty.objectives.environments.tools.process import ToolProcess

    process = ToolProcess(TOOL_REFERENCES, timeout_s=30.0)
    try:
        assert process("huge", {}) == ("7" * 10_000_000, None)
        worker = process.worker
        assert worker.poll() is None
    finally:
        process.close()
    assert worker.poll() is not None
    bounded = ToolProcess(TOOL_REFERENCES, timeout_s=30.0, max_chars=100)  # what an episode can hold, at most
    try:
        assert bounded("huge", {}) == ("7" * 100, None)
    finally:
        bounded.close()


def test_an_async_tool_is_refused_naming_it():
    from ditty.config.errors import RecipeError

    with pytest.raises(RecipeError, match=r"rl.tools\[0\].*fetch is async"):
        load_tools(["tests.rl.environments_for_tests:fetch"])


def test_an_environment_offered_tools_sees_only_the_turns_without_a_call():
    """rl.tools beside rl.environment, and the environment's own tools() (bound to its episode's state):
    ditty answers every call, and the environment steps on the first turn that makes none, its reward,
    done and metrics the turn's (the tool counts beside them)."""
    lock = envs.CodeLock()
    env = ToolEnvironment({"calculator": calculator}, environment=lock)
    assert env.reset({"prompt": "12+30=", "completion": "42"}) == [{"role": "user", "content": "12+30="}]
    assert sorted(env.tools) == ["calculator", "peek"]
    peeked = env.step(call("peek", position=1))
    assert peeked.observation == [{"role": "tool", "name": "peek", "content": "2"}] and not peeked.done
    assert lock.peeks == 1 and peeked.metrics["tool_calls/peek"] == 1.0  # the episode's own state changed
    computed = env.step(call("calculator", expression="12+30"))
    assert computed.observation[0]["content"] == "42" and computed.metrics["tool_calls/calculator"] == 1.0
    answered = env.step("42")
    assert answered.done and answered.reward == 1.0 and answered.observation is None
    assert answered.metrics["right"] == 1.0 and answered.metrics["peeks"] == 1.0 and answered.metrics["tool_calls"] == 0
    assert env.reward_columns() == {
        "peeks": 1,
        "tool_calls": [
            {"name": "peek", "arguments": {"position": 1}},
            {"name": "calculator", "arguments": {"expression": "12+30"}},
        ],
    }


def test_an_environments_own_tools_run_here_even_when_rl_tools_run_in_a_process(isolated):
    """A bound method cannot go to the worker process (it holds the episode's state): the environment's
    tools are called in the training process, rl.tools where rl.tools_isolation says."""
    lock = envs.CodeLock()
    env = isolated(environment=lock)
    env.reset({"prompt": "1+1=", "completion": "2"})
    result = env.step(call("peek", position=0) + call("echo", text="hi"))
    assert [m["content"] for m in result.observation] == ["2", "hi"] and lock.peeks == 1


@pytest.mark.parametrize(
    "environment, words",
    [
        (envs.OffersAnAsyncTool, "its tool 'fetch' is async"),
        (envs.OffersTheCalculator, "both name 'calculator'"),
    ],
)
def test_an_environments_tools_that_cannot_be_offered_are_refused(environment, words):
    with pytest.raises(ValueError, match=words):
        ToolEnvironment({"calculator": calculator}, environment=environment())


def test_an_environment_whose_observations_are_text_cannot_be_offered_tools():
    """A tool answers in a `tool` chat message, which text observations have no place for: refused at
    reset (the episode loop makes it exit 2 naming the environment), never dropped silently."""
    env = ToolEnvironment({"calculator": calculator}, environment=envs.GuessTheSum())
    with pytest.raises(ValueError, match="its reset returned text, and tools answer in `tool` chat messages"):
        env.reset({"prompt": "1+1=", "completion": "2"})
