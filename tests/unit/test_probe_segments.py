"""`benchmarks.probe.segments`: a trace of probe points becomes the median time between points."""

from __future__ import annotations

from benchmarks.probe import FIRST, segments


def call(start: int, steps: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """One call's records: `FIRST` at `start` ns (wall and CPU), then each (point, wall, CPU) after it."""
    return [(FIRST, start, start), *((name, start + wall, start + cpu) for name, wall, cpu in steps)]


def test_the_most_common_order_is_timed_to_the_next_call() -> None:
    usual = [("a", 10_000, 10_000), ("b", 40_000, 15_000)]
    records = [
        *call(0, usual),
        *call(100_000, [("b", 5_000, 5_000), ("a", 6_000, 6_000)]),  # another order: left out
        *call(200_000, [("a", 20_000, 12_000), ("b", 50_000, 17_000)]),
        *call(300_000, [("a", 30_000, 14_000), ("b", 60_000, 19_000)]),
        *call(400_000, usual),  # the last call: only where the one before it ends
    ]
    calls, taken, table = segments(records)
    assert (calls, taken) == (4, 3)
    rows = [(row.start, row.end, row.wall_us, row.cpu_us) for row in table]
    assert rows == [
        (FIRST, "a", 20.0, 12.0),
        ("a", "b", 30.0, 5.0),
        # To the next call's first point: 60, 50 and 40 µs of wall time.
        ("b", "next request in", 50.0, 83.0),
    ]


def test_records_before_the_first_request_and_a_single_call_give_no_table() -> None:
    assert segments([("a", 1, 1), (FIRST, 2, 2), ("b", 3, 3)]) == (1, 0, [])
