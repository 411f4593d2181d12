"""Statistics and the alternating schedule every scenario uses.

The proxy is always measured against the direct connection in the same run, in batches that take
turns (ABBA order), so that machine noise (other processes on a shared box) lands on both arms
instead of biasing one of them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

DIRECT = "direct"
PROXIED = "proxied"
ARMS = (DIRECT, PROXIED)
# The bare byte forwarder (`servers/forwarder.py`) in front of its own upstream: the floor for any
# process in between, as a third arm.
FORWARDER = "forwarder"
FLOOR_ARMS = (DIRECT, PROXIED, FORWARDER)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between the closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


@dataclass
class Samples:
    """Measurements of one quantity, per arm."""

    by_arm: dict[str, list[float]] = field(default_factory=dict)

    def add(self, arm: str, values: Sequence[float]) -> None:
        self.by_arm.setdefault(arm, []).extend(values)

    @property
    def direct(self) -> list[float]:
        return self.by_arm.get(DIRECT, [])

    @property
    def proxied(self) -> list[float]:
        return self.by_arm.get(PROXIED, [])


def turn_order(round_index: int, arms: Sequence[str] = ARMS) -> list[str]:
    """ABBA for two arms (direct first in even rounds); for more, each round starts one arm later."""
    if len(arms) == 2:
        return list(arms) if round_index % 2 == 0 else list(reversed(arms))
    shift = round_index % len(arms)
    return [*arms[shift:], *arms[:shift]]


def alternate(rounds: int, batch: Callable[[str], Sequence[float]], arms: Sequence[str] = ARMS) -> Samples:
    """Run `batch(arm)` for every arm, `rounds` times, taking turns; collect what each batch returns."""
    samples = Samples()
    for index in range(rounds):
        for arm in turn_order(index, arms):
            samples.add(arm, batch(arm))
    return samples


async def alternate_async(
    rounds: int, batch: Callable[[str], Awaitable[Sequence[float]]], arms: Sequence[str] = ARMS
) -> Samples:
    """`alternate` for batches that run on an event loop."""
    samples = Samples()
    for index in range(rounds):
        for arm in turn_order(index, arms):
            samples.add(arm, await batch(arm))
    return samples
