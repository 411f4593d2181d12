"""Load for the HTTP scenarios: a pool of open MCP sessions per server, and timed batches of calls.

Each session is opened once (initialize, notifications/initialized) and kept for the whole
scenario: opening one in front of a stdio upstream starts a process, which would otherwise swamp
what is measured. A batch at concurrency C takes the first C sessions of a pool; each loops on
`tools/call echo` (one call at a time, as a client session does) until the batch's time is up.
Before the timed part every one of those sessions makes one untimed call, which also reopens
connections the server closed while the session sat idle (uvicorn drops them after 5 s).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from benchmarks.httpclient import HttpSession

# Sessions opened at once: the opening is not timed, but 64 upstream processes starting together
# on 2 cores would only slow each other down.
OPENING_CONCURRENCY = 8


@dataclass
class Batch:
    """What one timed batch measured."""

    throughput: float  # calls per second, all sessions together
    latencies: list[float] = field(default_factory=list)  # seconds, every call
    client_cpu: float = 0.0  # seconds of this process's CPU time while the calls ran
    middle_cpu: float | None = None  # seconds of CPU time of the process between client and server, if timed
    upstream_cpu: float | None = None  # seconds of CPU time of the server behind it all, if timed
    upstream_waits: int | None = None  # how often that server's event loop waited for work (`procs.waits`)

    @property
    def calls(self) -> int:
        return len(self.latencies)


@asynccontextmanager
async def session_pool(url: str, size: int, warmup: int) -> AsyncIterator[tuple[list[HttpSession], float]]:
    """`size` open sessions with `url`, each warmed up by `warmup` calls; and the seconds opening took."""
    sessions = [HttpSession(url) for _ in range(size)]
    limit = anyio.Semaphore(OPENING_CONCURRENCY)

    async def open_one(session: HttpSession) -> None:
        async with limit:
            await session.open()
            for _ in range(warmup):
                await session.call_echo()

    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(open_one, session)
        yield sessions, time.perf_counter() - started
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(session.close)


async def run_batch(sessions: list[HttpSession], seconds: float) -> Batch:
    """Every session calls `echo` in a loop until `seconds` are up (its last call ends a little later).

    Throughput is the sum of each session's own rate, its calls over the time from the start to its
    last answer: each session was busy all along that time, so neither the common start (all
    sessions send at once) nor the ragged end (their last answers come up to one latency, 0.1-0.3 s
    at 64 sessions, after the deadline) biases it.
    """
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(session.call_echo)  # untimed: reconnects, wakes the server's side
    latencies: list[float] = []
    rates: list[float] = []

    async def loop(session: HttpSession, started: float) -> None:
        calls = 0
        while time.perf_counter() < started + seconds:
            latencies.append(await session.call_echo())
            calls += 1
        rates.append(calls / (time.perf_counter() - started))

    cpu = time.process_time()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(loop, session, started)
    return Batch(sum(rates), latencies, time.process_time() - cpu)
