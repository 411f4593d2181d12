"""Probe points inside a running sidecar, for `benchmarks/critical_path.py`.

Installed in the sidecar's process by `servers/probe_site/sitecustomize.py`, which goes first on its
`PYTHONPATH`, when one of two variables is set:

* `BENCH_PROBE_TRACE=FILE`: each point, each time it is passed, records its name, the wall clock
  and the thread's CPU time (nanoseconds); the records go to FILE, as JSON, when the process exits.
* `BENCH_PROBE_SPIN=POINT:MICROSECONDS`: that point spends that much of the thread's CPU each time
  it is passed, to see what the same work costs a call there.

A point wraps a function of the sidecar (or of asyncio, for the upstream leg's socket) by its name:
a profiling aid that breaks, loudly, when the code it names is renamed. Never loaded otherwise.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_VARIABLE = "BENCH_PROBE_TRACE"
SPIN_VARIABLE = "BENCH_PROBE_SPIN"
SITE = Path(__file__).resolve().parent / "servers" / "probe_site"


@dataclass(frozen=True)
class Point:
    module: str
    function: str  # "Class.method"
    after: bool = False  # passed when the function returns (else when it is called)


# In the order a tools/call passes them at one session (the sidecar's lane and early answers:
# `sidecar/lane.py`, `transports/http_upstream/early.py`; the relay's books of an answer come after
# the next request's POST: `relay/ahead.py`).
POINTS = {
    "request in": Point("mcp_backfill.sidecar.connections", "_Guard.data_received"),
    "upstream written": Point("asyncio.streams", "StreamWriter.write", after=True),
    "relay routes it": Point("mcp_backfill.relay.relay", "Relay._upstream_sends"),
    "handed to the relay": Point("mcp_backfill.relay.relay", "Relay.from_client_now"),
    "relay takes it": Point("mcp_backfill.relay.relay", "Relay._client_sends"),
    "upstream read": Point("asyncio.streams", "StreamReader.feed_data"),
    "answer decoded": Point("mcp_backfill.transports.http_upstream.exchange", "ExchangeReader.take_early"),
    "answer written": Point("mcp_backfill.sidecar.lane", "LanePost._write", after=True),
    "response complete": Point(
        "uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.on_response_complete", after=True
    ),
    "exchange ends": Point("mcp_backfill.transports.http_upstream.channel", "HttpUpstream.ended", after=True),
}
FIRST = "request in"

Record = tuple[str, int, int]  # point, wall ns, thread CPU ns


def install() -> None:
    """Wrap the points the environment asks for (see the module docstring)."""
    trace_file = os.environ.get(TRACE_VARIABLE)
    spin = os.environ.get(SPIN_VARIABLE)
    if trace_file:
        records: list[Record] = []
        atexit.register(_write, Path(trace_file), records)
        for name, point in POINTS.items():
            _wrap(point, functools.partial(_record, records, name))
    elif spin:
        name, _, micros = spin.rpartition(":")
        _wrap(POINTS[name], functools.partial(_spend, int(float(micros) * 1000)))


def _record(records: list[Record], name: str) -> None:
    records.append((name, time.perf_counter_ns(), time.thread_time_ns()))


def _spend(nanoseconds: int) -> None:
    end = time.thread_time_ns() + nanoseconds
    while time.thread_time_ns() < end:
        pass


def _write(path: Path, records: list[Record]) -> None:
    path.write_text(json.dumps(records))


def _wrap(point: Point, hook: Callable[[], None]) -> None:
    owner: Any = importlib.import_module(point.module)
    *path, attribute = point.function.split(".")
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, attribute)
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(function):

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not point.after:
                hook()
            try:
                return await function(*args, **kwargs)
            finally:
                if point.after:
                    hook()

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not point.after:
                hook()
            try:
                return function(*args, **kwargs)
            finally:
                if point.after:
                    hook()

    setattr(owner, attribute, functools.wraps(function)(wrapper))


@dataclass(frozen=True)
class Segment:
    start: str
    end: str
    wall_us: float  # medians over the calls
    cpu_us: float


def segments(records: Sequence[Sequence[Any]]) -> tuple[int, int, list[Segment]]:
    """How many calls (each from one "request in" to the next) there were, how many of them passed
    the points in the most common order, and for those the median wall and CPU time from each
    point to the next (the last segment ends at the next call's first point)."""
    calls: list[list[Sequence[Any]]] = []
    for record in records:
        if record[0] == FIRST:
            calls.append([])
        if calls:
            calls[-1].append(record)
    if len(calls) < 2:
        return len(calls), 0, []
    orders = Counter(tuple(r[0] for r in call) for call in calls[:-1])
    order = orders.most_common(1)[0][0]
    pairs = [(call, after) for call, after in itertools.pairwise(calls) if tuple(r[0] for r in call) == order]
    table = []
    for index, start in enumerate(order):
        ends = [
            (after[0] if index + 1 == len(order) else call[index + 1], call[index]) for call, after in pairs
        ]
        end_name = "next request in" if index + 1 == len(order) else order[index + 1]
        wall = sorted((end[1] - begin[1]) / 1e3 for end, begin in ends)
        cpu = sorted((end[2] - begin[2]) / 1e3 for end, begin in ends)
        table.append(Segment(start, end_name, wall[len(wall) // 2], cpu[len(cpu) // 2]))
    return len(calls) - 1, len(pairs), table
