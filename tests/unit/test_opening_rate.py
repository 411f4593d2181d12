"""`OpeningRate`: new sessions per client identity in a sliding minute, and a bounded memory of
identities (forwarded Authorization headers make them as cheap as a header)."""

from __future__ import annotations

from mcp_backfill.sidecar.sessions import OPENING_IDENTITIES, OpeningRate
from tests.clock import Clock


def test_each_identity_has_its_own_sliding_minute() -> None:
    clock = Clock()
    rate = OpeningRate(2, clock)
    assert rate.admit("alice").wait is None
    clock.now += 20
    assert rate.admit("alice").wait is None
    assert rate.admit("alice").wait == 40  # the first opening leaves the window 40 s from now
    assert rate.admit("bob").wait is None
    clock.now += 40
    assert rate.admit("alice").wait is None


def test_zero_is_no_limit() -> None:
    rate = OpeningRate(0, Clock())
    assert all(rate.admit("alice").wait is None for _ in range(1000))


def test_identities_idle_for_a_minute_are_forgotten() -> None:
    clock = Clock()
    rate = OpeningRate(1, clock)
    for n in range(OPENING_IDENTITIES + 1):
        assert rate.admit(f"junk-{n}").wait is None
    clock.now += 61
    assert rate.admit("alice").wait is None
    assert len(rate._opened) == 1


def test_a_refused_opening_gives_back_its_own_place_not_a_later_ones() -> None:
    """Alice's first opening waits for room (a stopping upstream) while her second, 10 s later,
    opens; the first is then refused. Its place in the window goes back, not the second's: else the
    one at 0 s stays, leaves the window 10 s early, and a third opening gets in before the minute of
    the two that happened is over."""
    clock = Clock()
    rate = OpeningRate(2, clock)
    first = rate.admit("alice")
    assert first.wait is None
    clock.now += 10
    assert rate.admit("alice").wait is None
    clock.now += 2
    rate.refused("alice", first)
    clock.now += 3
    assert rate.admit("alice").wait is None  # at 15 s: the openings at 10 and 15 s count
    clock.now += 46  # 61 s: the one at 10 s is still in the window
    assert rate.admit("alice").wait == 9
