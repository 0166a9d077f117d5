"""A time limit on code that runs in the main thread: user code (reward functions) that may hang."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator, Optional


class DeadlinePassed(BaseException):
    """Raised inside the limited code once its time is up. A BaseException, so that the code's own
    `except Exception` cannot swallow it."""


@contextlib.contextmanager
def deadline(timeout_s: Optional[float]) -> Iterator[None]:
    """Raise DeadlinePassed in the code inside once `timeout_s` seconds pass. SIGALRM rather than a
    thread: the code keeps the main thread, where code that uses signals itself (sympy checkers with
    their own alarm, as math_verify's) can run; such code replaces this deadline while its own alarm
    is set. The previous handler and timer are restored. Only the main thread receives signals;
    elsewhere, and without a timeout (None or 0), the code runs unbounded."""
    usable = timeout_s and timeout_s > 0 and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise DeadlinePassed()

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if previous_timer[0] > 0:  # someone else's alarm: put back what is left of it
            left = max(previous_timer[0] - (time.monotonic() - started), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, left, previous_timer[1])
