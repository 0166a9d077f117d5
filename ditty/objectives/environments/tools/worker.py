"""The child process of `rl.tools_isolation = "process"` (ditty.objectives.environments.tools.process).

`python -m ditty.objectives.environments.tools.worker '{"name": "package.module:function", ...}'` imports the
tools, says it is ready, then answers one call a line: a JSON request {"name", "arguments",
"max_chars"} on stdin, a JSON answer {"text", "error"} on the descriptor that was stdout (the text
cut to max_chars when given), flushed at once. What the tools print goes
to stderr (stdout carries the answers only). It ends when its stdin closes, or with its parent
(Linux's parent-death signal), so a trainer killed with -9 leaves no worker behind.

Every result is made text here (a string as it is, else JSON, else str()), so a result whose
`__str__` raises is the tool's error, answered like one that raises.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Mapping, Optional

ASYNC_TOOL = "is async (async def): a tool is called as a plain function that returns its result"
ASYNC_FIX = "define it with def (run what it awaits with asyncio.run inside it)"


def is_async(function: Any) -> bool:
    """An async function (or an object whose __call__ is one): calling it returns a coroutine, not a result."""
    import inspect

    candidates = [function] if inspect.isroutine(function) else [function, type(function).__call__]
    return any(inspect.iscoroutinefunction(c) or inspect.isasyncgenfunction(c) for c in candidates)


def result_text(name: str, value: Any) -> tuple[str, Optional[str]]:
    """(the tool message's text, the kind of error or None) of what tool `name` returned."""
    import inspect

    if inspect.isawaitable(value):  # an async tool that slipped past the compiler: never awaited
        getattr(value, "close", lambda: None)()
        return f"error: {name} returned an awaitable ({type(value).__name__}): tools are plain functions", "raised"
    if isinstance(value, str):
        return value, None
    try:
        return json.dumps(value), None
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return str(value), None
    except Exception as error:  # noqa: BLE001  (the tool's result, not ditty, is at fault)
        what = f"returned a {type(value).__name__} that cannot be shown as text"
        return f"error: {name} {what}: {type(error).__name__}: {error}", "raised"


def answer(name: str, function: Callable[..., Any], arguments: Mapping[str, Any]) -> tuple[str, Optional[str]]:
    """(text, error kind) of one call of `function`; whatever it raises (SystemExit too) is its error."""
    try:
        value = function(**arguments)
    except BaseException as error:  # noqa: BLE001  (reported to the model as the tool's error)
        return f"error: {name} raised {type(error).__name__}: {error}", "raised"
    return result_text(name, value)


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux); elsewhere a closed stdin ends it."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the call above
        os._exit(0)


def main() -> None:
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # a tool's print() goes to stderr, never into the answers
    from ditty.config.references import resolve_reference

    tools = {}
    for name, reference in json.loads(sys.argv[1]).items():
        function, problems = resolve_reference(reference, key=name)
        tools[name] = (function, problems[0].message if problems else None)
    answers.write(json.dumps({"ready": True}) + "\n")  # the tools are imported: calls are timed from here
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        function, problem = tools[request["name"]]
        if problem:
            text, error = f"error: {request['name']} cannot be imported in the tool process: {problem}", "raised"
        else:
            text, error = answer(request["name"], function, request["arguments"])
        limit = request.get("max_chars")
        if limit is not None:  # more than an episode can hold never crosses the pipe
            text = text[:limit]
        answers.write(json.dumps({"text": text, "error": error}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
