"""The built-in tool environment (`[rl] tools = ["package.module:function", ...]`), alone or offering
tools inside an environment of the user's (`[rl] environment` beside `tools`, or an environment with a
`tools()` method).

An episode starts from the prompt row's prompt (a string becomes the user's message; chat messages
are taken as they are), or from the wrapped environment's `reset`. Each model turn is parsed for tool
calls in the chat template's format (ditty.objectives.environments.tools.calls); every call is answered
with a `tool` message holding the function's result, in order, and the model writes its next turn. A
turn without a call is the final answer: alone, the episode is done, and the reward functions of
`rl.rewards` score it; around an environment, that environment steps on it (its reward, observation,
done and metrics are the turn's), so the environment sees only the turns that are not tool calls.

An environment's `tools()` -> {name: function} gives tools of its own episode, bound methods that may
read and change its state (a game's "look" or "move"); they run in the training process, in a thread
bounded by `rl.tool_timeout_s` (a worker process could not share the episode's state).

A malformed call, an unknown tool, a tool that raises and a tool still running after
`rl.tool_timeout_s` are each answered with a `tool` message saying so (the episode goes on) and
counted: metrics tool_calls, tool_calls/NAME, tool_errors, tool_errors/{malformed, unknown, raised,
timeout} (logged as env/..., per episode). The reward functions of `rl.rewards` get the episode's
well-formed calls as the keyword `tool_calls` ([{"name": ..., "arguments": {...}}, ...] per episode, in
order), so a reward can score the calls as well as the answer.

Where a call runs is `rl.tools_isolation`. "process" (the default): in a worker process
(ditty.objectives.environments.tools.process), which a tool that calls os._exit(), crashes or hangs takes down
instead of the run; the call is answered with an error and the next one starts a fresh worker.
"thread": in a thread of the training process, so that a hung tool can be left behind: Python cannot
stop a thread, so one that never returns keeps its thread (and what it holds) until the run ends,
and a tool that calls os._exit() ends the run. Either way a result is made text the same way (a
string as it is, else JSON, else str()); one that cannot be (its `__str__` raises), or an awaitable
(an async tool), is the tool's error.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional, Sequence

from ditty.objectives.environments.protocol import StepResult
from ditty.objectives.environments.tools.calls import HermesCalls, ToolCall
from ditty.objectives.environments.tools.worker import ASYNC_FIX, ASYNC_TOOL, is_async
from ditty.objectives.environments.tools.worker import answer as answer_call

ERRORS = ("malformed", "unknown", "raised", "timeout")


class ToolEnvironment:
    """`tools`: {name: function}; `call_format`: how calls are written (ditty.objectives.environments.tools.calls);
    `environment`: the episode's environment the tools are offered in (None: a turn without a call ends it)."""

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]],
        call_format: Any = None,
        timeout_s: float = 10.0,
        process: Optional[Callable[[str, Mapping[str, Any]], tuple[str, Optional[str]]]] = None,
        environment: Any = None,
    ) -> None:
        self.environment = environment
        self.own_tools = environment_tools(environment)
        """The environment's tools (bound to its state): answered here, never in the worker process."""
        clash = sorted(set(self.own_tools) & set(tools))
        if clash:
            raise ValueError(f"the environment's tools() and rl.tools both name {', '.join(map(repr, clash))}")
        self.tools = {**dict(tools), **self.own_tools}
        self.call_format = call_format or HermesCalls()
        self.timeout_s = timeout_s
        self.process = process
        """Runs the calls of rl.tools elsewhere (a ToolProcess: rl.tools_isolation = "process"); None: in a
        thread here."""
        self.calls: list[dict[str, Any]] = []
        """The episode's well-formed calls so far, {"name", "arguments"}, in order."""

    def reward_columns(self) -> dict[str, Any]:
        """What the reward functions get beside the data's columns: the episode's calls, and the
        wrapped environment's own columns (which may not take the name tool_calls)."""
        own = getattr(self.environment, "reward_columns", None)
        columns = dict(own()) if callable(own) else {}
        if "tool_calls" in columns:
            raise ValueError("its reward_columns names 'tool_calls', the episode's tool calls that ditty gives")
        return {**columns, "tool_calls": list(self.calls)}

    def reset(self, row: Mapping[str, Any]) -> Any:
        if self.environment is not None:
            observation = self.environment.reset(row)
            if isinstance(observation, str):  # a tool's answer is a `tool` message: it needs a conversation
                raise ValueError(
                    "its reset returned text, and tools answer in `tool` chat messages: return the first "
                    "observation as chat messages ([{'role': 'user', 'content': ...}])"
                )
            return observation
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]

    def step(self, completion: str) -> StepResult:
        calls = self.call_format.parse(completion)
        # Every name on every turn (0 when nothing happened), so that the logged means over a
        # logging interval count the steps where nothing happened too.
        metrics: dict[str, float] = {"tool_calls": float(len(calls)), "tool_errors": 0.0}
        metrics.update({f"tool_calls/{name}": 0.0 for name in self.tools})
        metrics.update({f"tool_errors/{kind}": 0.0 for kind in ERRORS})
        if not calls and self.environment is not None:
            result = self.environment.step(completion)
            if not isinstance(getattr(result, "metrics", None), Mapping):
                return result  # not a StepResult: the episode loop names the fault
            result.metrics = {**metrics, **result.metrics}
            return result
        if not calls:
            return StepResult(done=True, metrics=metrics)
        messages = []
        for call in calls:
            if not call.error:
                self.calls.append({"name": call.name, "arguments": dict(call.arguments)})
            content, error = self.answer(call)
            if error:
                metrics["tool_errors"] += 1
                metrics[f"tool_errors/{error}"] += 1
            if call.name in self.tools:
                metrics[f"tool_calls/{call.name}"] += 1
            messages.append({"role": "tool", "name": call.name, "content": content})
        return StepResult(observation=messages, metrics=metrics)

    def answer(self, call: ToolCall) -> tuple[str, Optional[str]]:
        """(the tool message's text, the kind of error or None)."""
        if call.error:
            return f"error: malformed tool call: {call.error}", "malformed"
        if call.name not in self.tools:
            return f"error: unknown tool {call.name!r} (the tools are {', '.join(sorted(self.tools))})", "unknown"
        if self.process is not None and call.name not in self.own_tools:
            return self.process(call.name, call.arguments)
        finished, answered = call_with_timeout(call.name, self.tools[call.name], call.arguments, self.timeout_s)
        if not finished:
            return f"error: {call.name} did not answer within {self.timeout_s:g} s", "timeout"
        return answered


def environment_tools(environment: Any) -> dict[str, Callable[..., Any]]:
    """{name: function} of an environment's `tools()` (none without the method), checked: a mapping
    of names to synchronous functions."""
    offer = getattr(environment, "tools", None)
    if environment is None or not callable(offer):
        return {}
    tools = offer()
    if not isinstance(tools, Mapping) or not all(isinstance(n, str) and callable(f) for n, f in tools.items()):
        raise ValueError(f"its tools() returned {type(tools).__name__}, not a mapping of names to functions")
    slow = [name for name, function in tools.items() if is_async(function)]
    if slow:
        raise ValueError(f"its tool {slow[0]!r} {ASYNC_TOOL}")
    return dict(tools)


def call_with_timeout(
    name: str, function: Callable[..., Any], arguments: Mapping[str, Any], timeout_s: float
) -> tuple[bool, tuple[str, Optional[str]]]:
    """(finished, (text, error kind)) of function(**arguments) in a thread, within `timeout_s`."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        outcome["answer"] = answer_call(name, function, arguments)

    thread = threading.Thread(target=target, name="ditty-tool-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, ("", None)
    return True, outcome["answer"]


def tool_schemas(tools: Mapping[str, Callable[..., Any]]) -> Optional[list[dict]]:
    """JSON schemas of the tools for chat templates that list them (transformers' `get_json_schema`
    reads the type hints and the Google-style docstring); a function it cannot read gets its name
    and the first line of its docstring."""
    from transformers.utils import get_json_schema

    schemas = []
    for name, function in tools.items():
        try:
            schema = get_json_schema(function)
            schema["function"]["name"] = name
        except Exception:  # noqa: BLE001  (no docstring or hints: the name is still useful)
            doc = (getattr(function, "__doc__", None) or "").strip().splitlines()
            description = doc[0] if doc else ""
            schema = {"type": "function", "function": {"name": name, "description": description, "parameters": {}}}
        schemas.append(schema)
    return schemas or None


def tool_name(reference: str) -> str:
    """A tool's name: its function's name ("package.module:calculator" -> "calculator")."""
    return reference.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def load_tools(references: Sequence[str], key: str = "rl.tools") -> dict[str, Callable[..., Any]]:
    """{name: function} of `rl.tools` (the compiler has checked that each resolves); `key` names the
    list in messages."""
    from ditty.config.errors import Problem, RecipeError
    from ditty.config.references import resolve_reference

    tools, problems = {}, []
    for index, reference in enumerate(references):
        function, found = resolve_reference(reference, key=f"{key}[{index}]")
        problems += found
        if not found and not callable(function):
            what = f"{reference} is a {type(function).__name__}, not a function"
            problems.append(Problem(f"{key}[{index}]", what, fix="name a function"))
        elif not found and is_async(function):
            problems.append(Problem(f"{key}[{index}]", f"{reference} {ASYNC_TOOL}", fix=ASYNC_FIX))
        elif not found:
            tools[tool_name(reference)] = function
    if problems:
        raise RecipeError(problems)
    return tools
