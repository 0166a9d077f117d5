"""`RunFailure`: a run that stopped for a reason its message explains in full.

Not a user error (that is `ditty.config.errors.RecipeError`, exit code 2): the recipe was valid,
but the run could not go on (a disk filled up, the numbers diverged). The command line prints the
message without a traceback and exits with code 1; the message says what is kept on disk and how
to continue.
"""

from __future__ import annotations


class RunFailure(RuntimeError):
    """The run stopped; `str(error)` is the whole story (exit code 1, no traceback)."""


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters (library messages run long)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def condensed(error: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to `limit` characters; its type when it has none."""
    return one_line(str(error), limit) or type(error).__name__


def causes(error: BaseException):
    """`error`, what it was raised from or during, and what torch.distributed.checkpoint wrapped in
    it (a CheckpointException holds each rank's exception in `failures`)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            wrapped = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
            todo += [f for f in wrapped if isinstance(f, BaseException)]


class UserInterrupt(KeyboardInterrupt):
    """The user's Ctrl-C as the trainer's SIGINT handler raises it (the second one: the first asks for
    a checkpoint), told apart from a KeyboardInterrupt that user code (an environment) raises itself."""


def users_ctrl_c(error: KeyboardInterrupt) -> bool:
    """Whether `error` is the user's Ctrl-C: raised by the trainer's handler, or by Python's own
    while that handler is not installed; else user code raised it."""
    import signal

    return isinstance(error, UserInterrupt) or signal.getsignal(signal.SIGINT) is signal.default_int_handler


def interrupted(error: BaseException) -> bool:
    """A KeyboardInterrupt that a library caught and wrapped (a second Ctrl-C inside a checkpoint save)."""
    return any(isinstance(cause, KeyboardInterrupt) for cause in causes(error))


def collective_timeout(error: BaseException) -> bool:
    """In a worker of several: a torch.distributed collective that gave up waiting for a peer
    ($DITTY_DIST_TIMEOUT_S); gloo says "Timed out waiting Nms for ... operation to complete"."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return False
    return any(isinstance(c, RuntimeError) and "timed out waiting" in str(c).lower() for c in causes(error))
