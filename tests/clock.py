"""A clock a test sets by hand, for the code that takes an injectable clock."""

from __future__ import annotations


class Clock:
    """Returns `now` when called; the test moves it (`clock.now += 5`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
