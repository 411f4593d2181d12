"""`DrainBudget`: what refused bodies may cost the sidecar to read, with a clock the test moves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.sidecar.connections import DrainBudget
from tests.clock import Clock

MIB = 1024 * 1024


def test_the_burst_is_free_then_reading_waits_for_the_rate() -> None:
    clock = Clock()
    budget = DrainBudget(rate=8 * MIB, burst=4 * MIB, clock=clock)
    assert budget.charge(4 * MIB) == 0.0
    assert budget.charge(2 * MIB) == 0.25  # 2 MiB in debt at 8 MiB/s
    clock.now += 0.25
    assert budget.charge(0) == 0.0  # paid off
    clock.now += 60
    assert budget.charge(4 * MIB) == 0.0  # refilled, but never past the burst
    assert budget.charge(MIB) == 0.125


def test_every_reader_shares_one_debt() -> None:
    """Two connections reading at once wait for what both read."""
    budget = DrainBudget(rate=MIB, burst=MIB, clock=Clock())
    assert budget.charge(MIB) == 0.0
    assert budget.charge(MIB // 2) == 0.5
    assert budget.charge(MIB // 2) == 1.0


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 512 * 1024), st.floats(0, 2, allow_nan=False)), min_size=1, max_size=60
    )
)
def test_readers_that_wait_as_told_never_beat_the_rate(steps: list[tuple[int, float]]) -> None:
    """Whatever the sizes and pauses, a reader that waits as told has read, once its wait is over,
    at most the burst plus the rate times the time elapsed."""
    clock = Clock()
    start = clock.now
    rate, burst = 4 * MIB, 2 * MIB
    budget = DrainBudget(rate=rate, burst=burst, clock=clock)
    read = 0
    for size, pause in steps:
        read += size
        wait = budget.charge(size)
        assert wait >= 0
        clock.now += wait + pause
        assert read <= burst + rate * (clock.now - start) + 1e-6 * rate
