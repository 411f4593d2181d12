"""`OpeningRate`: new sessions per client identity in a sliding minute, and a bounded memory of
identities (forwarded Authorization headers make them as cheap as a header)."""

from __future__ import annotations

from mcp_backfill.sidecar.sessions import OPENING_IDENTITIES, OpeningRate
from tests.clock import Clock


def test_each_identity_has_its_own_sliding_minute() -> None:
    clock = Clock()
    rate = OpeningRate(2, clock)
    assert rate.admit("alice") is None
    clock.now += 20
    assert rate.admit("alice") is None
    assert rate.admit("alice") == 40  # the first opening leaves the window 40 s from now
    assert rate.admit("bob") is None
    clock.now += 40
    assert rate.admit("alice") is None


def test_zero_is_no_limit() -> None:
    rate = OpeningRate(0, Clock())
    assert all(rate.admit("alice") is None for _ in range(1000))


def test_identities_idle_for_a_minute_are_forgotten() -> None:
    clock = Clock()
    rate = OpeningRate(1, clock)
    for n in range(OPENING_IDENTITIES + 1):
        assert rate.admit(f"junk-{n}") is None
    clock.now += 61
    assert rate.admit("alice") is None
    assert len(rate._opened) == 1
