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

    calls: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, every call
    client_cpu: float = 0.0  # seconds of this process's CPU time during the batch

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds


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
    """Every session calls `echo` in a loop for `seconds`; the batch ends when the last call returns."""
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(session.call_echo)  # untimed: reconnects, wakes the server's side
    latencies: list[float] = []

    async def loop(session: HttpSession, deadline: float) -> None:
        while time.perf_counter() < deadline:
            latencies.append(await session.call_echo())

    cpu = time.process_time()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(loop, session, started + seconds)
    elapsed = time.perf_counter() - started
    return Batch(len(latencies), elapsed, latencies, time.process_time() - cpu)
