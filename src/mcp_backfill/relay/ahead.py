"""Written first, booked after: the relay's books of a message one side wrote ahead of them.

At one session the sidecar's client shares a vCPU with it, and is run only once the sidecar waits
for its next event. So all of the sidecar's work from the upstream's answer to the next request's
POST is on every call's path, whether it comes before a write or after it: the upstream, meanwhile
out of work, waited once every call (`benchmarks/README.md`, the thirty-fourth and thirty-fifth
rounds). The two writes on that path therefore go first, and the books of each after the next:

* an upstream answer the client is waiting for, that the relay would hand on as it came, is written
  to the client at once (`Relay.answer_ahead`, through `AnswersAhead`); the relay routes it later,
  with the same code as any other (`Relay.settle`), when it next does anything at all, or
  `AHEAD_SECONDS` later at the latest: its next request's POST goes out before that;
* a client request the relay would forward as it came is POSTed before the relay keeps its books
  for it (`Relay.post_ahead`, through `PostsAhead`), which follow in the same callback.

This module keeps the one answer owed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp_backfill.transports.deadlines import Deadline, Deadlines

AHEAD_SECONDS = 0.05
"""How long the relay's books of an answer written ahead wait, at most, for its next move."""


class Owed:
    """The upstream answer written ahead and not yet routed (one at most), and its deadline."""

    def __init__(self, settle: Callable[[], None]) -> None:
        self._settle = settle
        self._deadlines = Deadlines(AHEAD_SECONDS)
        self.answer: tuple[bytes, Any, Callable[[], None], Deadline] | None = None
        """(the answer's bytes, the upstream id of the request whose stream it came on, the hook
        that finishes its client side's books once it is routed, its deadline); None: none owed."""

    def owe(self, raw: bytes, origin: Any, done: Callable[[], None]) -> None:
        self.answer = (raw, origin, done, self._deadlines.set(self._settle))

    def take(self) -> tuple[bytes, Any, Callable[[], None]] | None:
        """The answer owed, now to be routed (None: none is)."""
        owed, self.answer = self.answer, None
        if owed is None:
            return None
        raw, origin, done, deadline = owed
        deadline.cancel()
        return raw, origin, done
