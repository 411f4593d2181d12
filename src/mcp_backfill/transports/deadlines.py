"""Many deadlines of one length behind one timer: `Deadlines`.

A call on the sidecar's quick path sets two deadlines it nearly always beats: the lane hands a
request to the app if its answer takes `QUICK_ANSWER_SECONDS`, and an answer read from the upstream
connection's callback goes to the exchange's task after `early.PATIENCE`. An event loop timer armed
and cancelled for each costs about 1.8 µs of CPU (uvloop); setting a deadline here costs a tenth of
that (`benchmarks/README.md`, the thirty-first round). Deadlines of one length fall due in the
order they were set, so they wait in a queue, behind one timer armed for the first of them; a
deadline met is only marked, and dropped when the timer reaches it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

# uvloop's clock moves in milliseconds: a timer due within one may fire before the clock gets there.
CLOCK_RESOLUTION = 0.001


class Deadline:
    """One deadline: its callback runs when it falls due, unless `cancel`led first."""

    __slots__ = ("_callback", "due")

    def __init__(self, due: float, callback: Callable[[], object]) -> None:
        self.due = due
        self._callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        """It will not run (and what its callback holds is let go now, not when it falls due)."""
        self._callback = None

    @property
    def cancelled(self) -> bool:
        return self._callback is None


class Deadlines:
    """Deadlines `seconds` after they are set, on the loop running when they are (one loop only)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waiting: deque[Deadline] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._reaching = False  # the timer's callback is running the deadlines due
        # The loop, once known: asking asyncio for the running one costs a system call (`getpid`)
        # each time, several times on every quick call's path (the thirty-seventh round).
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Deadlines not yet reached by the timer, cancelled ones included."""
        return len(self._waiting)

    def set(self, callback: Callable[[], object]) -> Deadline:
        """Run `callback` `seconds` from now, unless the deadline is cancelled first."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + self.seconds, callback)
        self._waiting.append(deadline)
        if self._timer is None and not self._reaching:
            self._timer = loop.call_at(deadline.due, self._reached)
        return deadline

    def _reached(self) -> None:
        self._timer = None
        self._reaching = True
        loop = self._loop
        assert loop is not None  # (set with the timer)
        reached = loop.time() + CLOCK_RESOLUTION
        waiting = self._waiting
        try:
            while waiting:
                first = waiting[0]
                callback = first._callback  # (read here, not through `cancelled`: most are)
                if callback is not None and first.due > reached:
                    break
                waiting.popleft()
                if callback is not None:
                    first._callback = None
                    callback()  # (a deadline it sets goes last: it is due last)
        finally:  # (a callback's exception goes to the loop's handler, as a timer's would)
            self._reaching = False
            if waiting:
                self._timer = loop.call_at(waiting[0].due, self._reached)
