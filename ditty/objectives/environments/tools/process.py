"""Tools in a child process (`rl.tools_isolation = "process"`): one worker per training process
(ditty.objectives.environments.tools.worker), started at the first call, that imports the tools and answers the
calls one at a time over a pipe, as JSON.

What a tool does there cannot take the run down: a tool that calls os._exit() or crashes the
interpreter ends the worker, and the call is answered with an error saying so (counted as
tool_errors/raised); a tool still running after `rl.tool_timeout_s` is killed with its worker
(answered as tool_errors/timeout), rather than left running in a thread as the in-process calls
must. The next call starts a fresh worker. The cost is a process start at the first call and after
each such end, and the JSON round trip of every call.

The worker's import path is this process's (`sys.path` as PYTHONPATH) and its directory the
current one, so a tool module found by the run is found by the worker.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Mapping, Optional

START_S = 300.0
"""The most seconds a worker may take to start and import the tools (a tool module may import torch)."""


class ToolProcess:
    """`references`: {tool name: "package.module:function"}; `timeout_s`: the most one call may take;
    `max_chars`: the most characters of an answer that cross the pipe (None: all)."""

    def __init__(self, references: Mapping[str, str], timeout_s: float, max_chars: Optional[int] = None) -> None:
        self.references = dict(references)
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        """Answers are cut to this many characters in the worker (what an episode can hold at most)."""
        self.worker: Optional[subprocess.Popen] = None
        self._buffer = b""

    def __call__(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, Optional[str]]:
        """(the tool message's text, the kind of error or None) of tool `name` called with `arguments`."""
        asked = {"name": name, "arguments": dict(arguments), "max_chars": self.max_chars}
        request = (json.dumps(asked) + "\n").encode()
        worker = self._worker()
        if worker is None:
            return (
                f"error: {name} could not be called: the tool process ended or did not start within {START_S:g} s",
                "raised",
            )
        try:
            worker.stdin.write(request)
            worker.stdin.flush()
        except BrokenPipeError:  # it ended between calls (killed from outside): a fresh one answers
            self.close()
            return self(name, arguments)
        line = self._read_line(worker, time.monotonic() + self.timeout_s)
        if line is None:
            self.close()
            return f"error: {name} did not answer within {self.timeout_s:g} s", "timeout"
        if not line:
            how = _how_it_ended(worker.wait())
            self.close()
            return f"error: {name} ended its process ({how}) before it answered", "raised"
        reply = json.loads(line)
        return reply["text"], reply["error"]

    def _worker(self) -> Optional[subprocess.Popen]:
        """The running worker, started (and its tools imported) if there is none; None if it did not
        say it was ready within START_S seconds."""
        if self.worker is None:
            path = os.pathsep.join(os.path.abspath(entry or ".") for entry in sys.path)
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "ditty.objectives.environments.tools.worker", json.dumps(self.references)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": path},
            )
            self._buffer = b""
            if not self._read_line(self.worker, time.monotonic() + START_S):  # importing the tools is not timed
                self.close()
        return self.worker

    def _read_line(self, worker: subprocess.Popen, deadline: float) -> Optional[bytes]:
        """The next answer line; b"" when the worker ended first, None when `deadline` passed."""
        fd = worker.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        """Stop the worker (a hung tool with it); the next call starts another."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        for stream in (worker.stdin, worker.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: the worker dies with its stdin)
            pass


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
