"""What `rl.tools_isolation = "process"` costs against "thread": time per tool call through the tool
environment's step (parse the call, run the tool, make its message), the worker's start, and a 10 MB
answer.

    python tools/bench_tool_isolation.py [--calls 2000] [--reps 3]

Prints one line per measurement (median of the repeats) and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALCULATOR = {"calculator": "ditty.objectives.environments.tools.builtin_tools:calculator"}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>'


def per_call_us(env, calls: int) -> float:
    env.step(CALL)
    started = time.perf_counter()
    for _ in range(calls):
        result = env.step(CALL)
    assert result.observation[0]["content"] == "56088"
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    from ditty.objectives.environments.tools.process import ToolProcess
    from ditty.objectives.environments.tools.tool_environment import ToolEnvironment, load_tools

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    tools = load_tools(list(CALCULATOR.values()))
    thread, process, starts, huge = [], [], [], {"thread": [], "process": []}
    for _ in range(args.reps):
        worker = ToolProcess(CALCULATOR, 10.0)
        started = time.perf_counter()
        worker("calculator", {"expression": "1+1"})
        starts.append((time.perf_counter() - started) * 1e3)
        thread.append(per_call_us(ToolEnvironment(tools), args.calls))
        process.append(per_call_us(ToolEnvironment(tools, process=worker), args.calls))
        worker.close()
    big = {"huge": "tests.rl.environments_for_tests:huge"}
    big_tools = load_tools(list(big.values()))
    for _ in range(args.reps):
        worker = ToolProcess(big, 30.0)
        worker("huge", {})  # started, its module imported
        for name, env in (
            ("thread", ToolEnvironment(big_tools)),
            ("process", ToolEnvironment(big_tools, process=worker)),
        ):
            started = time.perf_counter()
            result = env.step('<tool_call>{"name": "huge", "arguments": {}}</tool_call>')
            huge[name].append((time.perf_counter() - started) * 1e3)
            assert len(result.observation[0]["content"]) == 10_000_000
        worker.close()
    median = statistics.median
    print(f"calculator call, thread:  {median(thread):.0f} us (runs {', '.join(f'{v:.0f}' for v in thread)})")
    print(f"calculator call, process: {median(process):.0f} us (runs {', '.join(f'{v:.0f}' for v in process)})")
    print(f"worker start and import:  {median(starts):.0f} ms (runs {', '.join(f'{v:.0f}' for v in starts)})")
    for name, values in huge.items():
        print(f"10 MB answer, {name}: {median(values):.0f} ms (runs {', '.join(f'{v:.0f}' for v in values)})")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
