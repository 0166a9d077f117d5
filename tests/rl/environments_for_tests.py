"""Environments and tools named by the episode tests ("tests.rl.environments_for_tests:NAME")."""

from __future__ import annotations

import os
import signal
import time

from ditty.objectives.environments.protocol import StepResult
from tests.rl.rewards_for_tests import text_hash_reward


class ExactMatchAndHashOneTurn:
    """Today's exact_match plus tests.rl.rewards_for_tests:text_hash_reward, as a one-turn environment
    of the reset/step protocol."""

    def reset(self, row):
        self.answer = str(row["completion"])
        return row["prompt"]

    def step(self, completion):
        exact = float(completion.strip() == self.answer.strip())
        return StepResult(reward=exact + text_hash_reward([None], [completion])[0], done=True)


class CountingTurns:
    """Three turns: each answered with a user message; the reward of a turn is its text's length / 10."""

    def reset(self, row):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, completion):
        self.turns += 1
        reward = len(completion) / 10
        if self.turns >= 3:
            return StepResult(reward=reward, done=True, metrics={"answers": 1.0})
        return StepResult(observation=[{"role": "user", "content": "again"}], reward=reward, metrics={"answers": 1.0})


class NeedsALevel(CountingTurns):
    """CountingTurns that must be told its level: ditty cannot build it as NeedsALevel()."""

    def __init__(self, level):
        self.level = level

    def step(self, completion):
        result = super().step(completion)
        result.metrics["level"] = float(self.level)  # added up over an episode's turns (env/level)
        return result


class RaisesInStep:
    """Fails on its second turn (a bug in the user's environment)."""

    def reset(self, row):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, completion):
        self.turns += 1
        if self.turns >= 2:
            raise ValueError("the game state is corrupt")
        return StepResult(observation=[{"role": "user", "content": "go on"}])


FAIL_FROM_STEP = {"value": None}


class FailsAtStep:
    """Steps normally until the training step named by DITTY_TEST_ENV_FAIL_AT, then raises (the run
    counts steps by the resets of group 0's first episode)."""

    resets = 0

    def reset(self, row):
        FailsAtStep.resets += 1
        return row["prompt"]

    def step(self, completion):
        fail_at = int(os.environ.get("DITTY_TEST_ENV_FAIL_AT", "0"))
        if fail_at and FailsAtStep.resets >= fail_at:
            raise RuntimeError("the simulator crashed")
        return StepResult(reward=float(len(completion) % 3), done=True)


class KilledMidEpisode:
    """Two turns; with DITTY_TEST_KILL_AT_RESET = N, the process kills itself (SIGKILL) in the first
    turn of the episode opened by its N-th reset (counted per process): mid-episode, mid-rollout."""

    resets = {"pid": None, "count": 0}

    def reset(self, row):
        if KilledMidEpisode.resets["pid"] != os.getpid():  # a forked run counts its own
            KilledMidEpisode.resets.update(pid=os.getpid(), count=0)
        KilledMidEpisode.resets["count"] += 1
        self.reset_number, self.turns = KilledMidEpisode.resets["count"], 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, completion):
        self.turns += 1
        kill_at = int(os.environ.get("DITTY_TEST_KILL_AT_RESET", "0"))
        if kill_at and self.reset_number == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.turns >= 2:
            return StepResult(reward=float(len(completion) % 5), done=True)
        return StepResult(observation=[{"role": "user", "content": str(len(completion))}], reward=0.5)


def echo(text: str) -> str:
    """Answer with the text given."""
    return text


def broken(x: int) -> int:
    """Always fails."""
    raise ZeroDivisionError("division by zero in the tool")


def hangs(seconds: float = 5.0) -> str:
    """Sleeps longer than the tool timeout."""
    time.sleep(seconds)
    return "late"


NOT_A_CLASS = 3


class OriginalCalculatorGame:
    """An environment of the original Ditty's protocol: one expected calculator action, then done."""

    def reset(self, task):
        self.expected = task["prompt"].rstrip("=")
        return "ready"

    def step(self, action):
        from ditty.compat.environments import EnvironmentStepResult

        matched = action.get("name") == "calculator" and action["arguments"].get("expression") == self.expected
        if not matched:
            return EnvironmentStepResult("wrong branch", 0.0, True, {"wrong_branch": True})
        return EnvironmentStepResult(str(eval(self.expected)), 1.0, False, {"matched": True, "note": "ok"})


class ExitsInStep:
    """Calls sys.exit(0) on its first turn: a script's habit that would end the run as if it had finished."""

    def reset(self, row):
        return row["prompt"]

    def step(self, completion):
        import sys

        sys.exit(0)


class OriginalGameWithALevel(OriginalCalculatorGame):
    """An original-protocol environment that must be told its level; `levels` records each reset's."""

    levels: list = []

    def __init__(self, level):
        self.level = level

    def reset(self, task):
        OriginalGameWithALevel.levels.append(self.level)
        return super().reset(task)


def _wrapped_original_needing_a_level():
    from ditty.compat.environments import as_environment

    return as_environment(OriginalGameWithALevel)


WrappedOriginalNeedingALevel = _wrapped_original_needing_a_level()


class HangsInStep:
    """Steps normally until the episode opened by its DITTY_TEST_ENV_HANG_AT-th reset (counted per
    process), whose step sleeps 600 s: a simulator that never answers."""

    resets = {"pid": None, "count": 0}

    def reset(self, row):
        if HangsInStep.resets["pid"] != os.getpid():
            HangsInStep.resets.update(pid=os.getpid(), count=0)
        HangsInStep.resets["count"] += 1
        self.reset_number = HangsInStep.resets["count"]
        return row["prompt"]

    def step(self, completion):
        hang_at = int(os.environ.get("DITTY_TEST_ENV_HANG_AT", "0"))
        if hang_at and self.reset_number >= hang_at:
            time.sleep(600)
        return StepResult(reward=float(len(completion) % 3), done=True)


class InterruptsInStep:
    """Raises KeyboardInterrupt in its step: its own, not the user's Ctrl-C."""

    def reset(self, row):
        return row["prompt"]

    def step(self, completion):
        raise KeyboardInterrupt


async def fetch(url: str) -> str:
    """An async tool: called, it returns a coroutine, not a result."""
    return url


class Unprintable:
    def __str__(self):
        raise ValueError("no text for this")


def unprintable() -> object:
    """Returns a result whose str() raises (and that JSON cannot hold)."""
    return Unprintable()


def exits(code: int = 0) -> str:
    """Ends its process at once, as os._exit does."""
    os._exit(code)


def crashes() -> str:
    """Crashes the interpreter (SIGSEGV)."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return "never"


def huge() -> str:
    """A 10 MB answer."""
    return "7" * 10_000_000


def prints(text: str) -> str:
    """Prints to stdout, then answers."""
    print("a tool's own output")
    return text


class GuessTheSum:
    """Two tries at a built-in addition problem (its `completion` column): a hint after a wrong one,
    and the environment's own metric `right`."""

    def reset(self, row):
        self.answer = str(row["completion"]).strip()
        return row["prompt"]

    def step(self, completion):
        right = completion.strip() == self.answer
        if right:
            return StepResult(reward=1.0, done=True, metrics={"right": 1.0})
        return StepResult(observation=" wrong, again: ", metrics={"right": 0.0})


class CodeLock:
    """An addition problem whose answer opens a lock, offering a tool of its own: `peek` reads a digit
    of the answer and counts the peeks in the episode's state (the environment's `peeks`)."""

    def reset(self, row):
        self.code, self.peeks = str(row["completion"]).strip(), 0
        return [{"role": "user", "content": row["prompt"]}]

    def tools(self):
        return {"peek": self.peek}

    def peek(self, position: int) -> str:
        """One digit of the lock's code.

        Args:
            position: the digit's index, from 0.
        """
        self.peeks += 1
        return self.code[position]

    def step(self, completion):
        right = float(completion.strip() == self.code)
        return StepResult(reward=right, done=True, metrics={"right": right, "peeks": float(self.peeks)})

    def reward_columns(self):
        return {"peeks": self.peeks}


class OffersAnAsyncTool(CodeLock):
    def tools(self):
        return {"peek": self.peek, "fetch": fetch}


class OffersTheCalculator(CodeLock):
    def tools(self):
        from ditty.objectives.environments.tools.builtin_tools import calculator

        return {"peek": self.peek, "calculator": calculator}
