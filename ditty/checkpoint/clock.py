"""`checkpoint.every_minutes`: a checkpoint when that much wall time has passed since the last one.

A step count cannot bound what a crash loses (a kill -9, an out-of-memory kill, a lost machine,
where no signal handler runs): steps take milliseconds on one recipe and minutes on another. A clock
does. Every rank must take part in a save (it is collective), so the clock is read only where the
ranks meet anyway (log steps) and the ranks agree by a max-reduce of one flag: the save happens on
the same step everywhere. So a crash loses at most `every_minutes` plus one logging interval.
"""

from __future__ import annotations

import time
from typing import Callable, Optional


class SaveClock:
    def __init__(self, minutes: float, now: Callable[[], float] = time.monotonic) -> None:
        self.seconds = max(0.0, float(minutes)) * 60.0
        self.now = now
        self.last = now()

    def due(self, agree: Optional[Callable[[bool], bool]] = None) -> bool:
        """Whether the interval has passed; `agree` turns this rank's answer into all ranks' (any rank
        due makes every rank due), so all ranks must call this on the same steps."""
        if not self.seconds:
            return False
        late = self.now() - self.last >= self.seconds
        return agree(late) if agree is not None else late

    def saved(self) -> None:
        """A checkpoint was just written (by the clock or by `checkpoint.every`): the interval restarts."""
        self.last = self.now()
