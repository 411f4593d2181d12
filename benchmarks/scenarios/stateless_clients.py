"""8. 1,000 concurrent 2026-07-28 clients on one sidecar: latency, throughput, errors, its RSS.

One `mcp-backfill serve` (default provider, as users run it) in front of the raw echo server. Every
2026-07-28 request of one client identity (here all of them: no authentication, so `anonymous`)
goes to one shared upstream process, so the figures are the sidecar's own: its HTTP front, the
SDK's inbound checks, the 2026 relay and the mux in front of one stdio upstream.

First one client alone (the direct column): untimed warm-up calls (the first 2026-07-28 request
imports the SDK's inbound checks, starts the upstream and the Claude client's warm-up), a wait for
the sidecar's CPU to go quiet, then sequential timed calls. Then the many clients
(`benchmarks/httpclient.py`'s `StatelessClient`, each on its own keep-alive HTTP/1.1 connection):
all connect first, then each makes untimed warm-up calls and its timed sequential calls, and goes
on calling (untimed) until every client has made its timed ones, so that every timed call shares the
sidecar with all the others. Throughput counts every answer between the moment the last client
finished warming up and the moment the last one finished its timed calls.

Every answer is checked (status, id, a result echoing the text); a failure of any kind (HTTP
status, JSON-RPC error, wrong result, connection reset or refused, timeout) counts as an error and
the client goes on with a new connection. The scenario fails only if no client could connect.

The sidecar's RSS: `VmRSS` before the first client (the direct column) and at the end of the load
with every connection still open, and its peak (`VmHWM`) over the whole run. `--max-connections` is
raised above the clients' count (its default, 1000, would leave no room for a reconnecting client),
and this process raises its own open-files limit (soft to hard), which the sidecar inherits: 1,000
connections on each side do not fit in the usual soft limit of 1024.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio

from benchmarks.httpclient import CallFailed, StatelessClient
from benchmarks.httpservers import HttpServer, sidecar
from benchmarks.measure import median, percentile
from benchmarks.procs import children, cpu_seconds, proc_status, raw_echo_command, wait_until_quiet
from benchmarks.report import Row, Target
from benchmarks.scenarios import RunContext
from benchmarks.settings import MB
from mcp_backfill.cli import event_loop_options

RSS_TARGET = Target("proxied_max", 200.0, "≤ 200 MB")
ERRORS_TARGET = Target("proxied_max", 0.0, "0")
# Connections beyond the clients' count that the sidecar admits (a client reconnecting after an
# error, before the server has noticed its old connection is gone).
CONNECTION_HEADROOM = 100
# Open files this process needs besides its clients' sockets (and so does the sidecar).
FD_HEADROOM = 256
# Connections opened at once (a burst of 1,000 SYNs would overflow nothing here, but gains nothing).
CONNECT_CONCURRENCY = 100
# What a failed call can raise: HTTP/JSON-RPC failures, sockets, timeouts, unparsable answers.
CALL_ERRORS = (CallFailed, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)
ERROR_EXAMPLES = 5


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE (inherited by the processes it starts) to at least
    `needed`, up to the hard limit; the limits in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise RuntimeError(f"the open-files hard limit ({hard}) is below the {needed} this scenario needs")
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = hard if hard != resource.RLIM_INFINITY else needed
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft, hard


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def until_quiet(pid: int) -> None:
    await anyio.to_thread.run_sync(wait_until_quiet, pid)


@dataclass
class Tally:
    """Answers and failures over every call of the scenario."""

    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def failure(self, exc: BaseException) -> None:
        self.errors[type(exc).__name__] += 1
        if len(self.examples) < ERROR_EXAMPLES:
            self.examples.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    async def call(self, client: StatelessClient) -> float | None:
        """One checked call; its latency, or None when it failed (counted, and the client's
        connection dropped: the answer may still be on its way)."""
        try:
            elapsed = await client.call_echo()
        except CALL_ERRORS as exc:
            self.failure(exc)
            await client.drop_connection()
            return None
        self.answered += 1
        return elapsed


@dataclass
class Phase:
    """One phase's timed calls."""

    latencies: list[float]
    throughput: float
    errors: int
    detail: dict[str, Any] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    """The sidecar's memory figures at the end of the phase, with its clients still connected."""


async def alone(url: str, pid: int, warmup: int, calls: int, tally: Tally) -> Phase:
    client = StatelessClient(url, "bench-alone")
    try:
        for _ in range(warmup):
            await tally.call(client)
        await until_quiet(pid)  # the SDK's import, the upstream's start, the Claude client's warm-up
        errors_before = tally.failed
        latencies: list[float] = []
        started = time.perf_counter()
        for _ in range(calls):
            elapsed = await tally.call(client)
            if elapsed is not None:
                latencies.append(elapsed)
        throughput = len(latencies) / (time.perf_counter() - started)
        return Phase(latencies, throughput, tally.failed - errors_before)
    finally:
        await client.close()


async def together(url: str, pid: int, count: int, warmup: int, calls: int, tally: Tally) -> Phase:
    """`count` clients at once, each on its own connection, all closed on return."""
    clients = [StatelessClient(url, f"bench-{n}") for n in range(count)]
    try:
        return await _together(clients, url, pid, warmup, calls, tally)
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(client.close)


async def _together(
    clients: list[StatelessClient], url: str, pid: int, warmup: int, calls: int, tally: Tally
) -> Phase:
    count = len(clients)
    connected: list[StatelessClient] = []
    limit = anyio.Semaphore(CONNECT_CONCURRENCY)
    errors_before = tally.failed

    async def connect(client: StatelessClient) -> None:
        async with limit:
            try:
                await client.connect()
            except (OSError, TimeoutError) as exc:
                tally.failure(exc)
                return
        connected.append(client)

    opening = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(connect, client)
    opening = time.perf_counter() - opening
    if not connected:
        raise RuntimeError(f"none of {count} clients could connect to {url}: {tally.examples}")

    latencies: list[float] = []
    marks: dict[str, tuple[float, int]] = {}
    warm = 0
    finished = 0
    all_done = anyio.Event()
    rss_max = 0

    async def run_client(client: StatelessClient) -> None:
        nonlocal warm, finished
        for _ in range(warmup):
            await tally.call(client)
        warm += 1
        if warm == len(connected):
            marks["warm"] = (time.perf_counter(), tally.answered)
        for _ in range(calls):
            elapsed = await tally.call(client)
            if elapsed is not None:
                latencies.append(elapsed)
        finished += 1
        if finished == len(connected):
            marks["done"] = (time.perf_counter(), tally.answered)
            all_done.set()
        while not all_done.is_set():  # keep the load on until every client has made its timed calls
            await tally.call(client)

    async def watch_rss() -> None:
        nonlocal rss_max
        while not all_done.is_set():
            rss_max = max(rss_max, proc_status(pid)["VmRSS"])
            await anyio.sleep(0.2)

    cpu = time.process_time()
    sidecar_cpu = cpu_seconds(pid)
    answered_before = tally.answered
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_rss)
        for client in connected:
            tg.start_soon(run_client, client)
    # Read with every connection still open.
    status = proc_status(pid)
    fds = open_fds(pid)
    upstreams = len(children(pid))
    all_answered = tally.answered - answered_before
    (warm_at, warm_answered), (done_at, done_answered) = marks["warm"], marks["done"]
    throughput = (done_answered - warm_answered) / max(done_at - warm_at, 1e-9)
    reconnects = sum(client.connections_opened - 1 for client in connected)
    return Phase(
        latencies,
        throughput,
        tally.failed - errors_before,
        {
            "clients": count,
            "connected": len(connected),
            "opening_s": round(opening, 2),
            "timed_calls": len(latencies),
            "all_calls": all_answered,
            "load_window_s": round(done_at - warm_at, 2),
            "reconnects": reconnects,
            "client_cpu_us_per_call": round((time.process_time() - cpu) / max(all_answered, 1) * 1e6, 1),
            "sidecar_cpu_us_per_call": round(
                (cpu_seconds(pid) - sidecar_cpu) / max(all_answered, 1) * 1e6, 1
            ),
            "rss_max_sampled_mb": round(rss_max / MB, 1),
            "sidecar_open_fds": fds,
            "upstream_processes": upstreams,
        },
        status,
    )


async def measure(ctx: RunContext, server: HttpServer) -> dict[str, Any]:
    s = ctx.settings
    pid = server.pid
    tally = Tally()
    await until_quiet(pid)
    before = proc_status(pid)
    ctx.progress("1 client alone")
    solo = await alone(server.url, pid, s.warmup, s.stateless_solo_calls, tally)
    after_one = proc_status(pid)["VmRSS"]
    ctx.progress(f"{s.stateless_clients} clients at once")
    load = await together(server.url, pid, s.stateless_clients, s.stateless_warmup, s.stateless_calls, tally)
    await anyio.sleep(1.0)  # the sidecar lets the closed connections go
    after_close = proc_status(pid)["VmRSS"]
    return {
        "tally": tally,
        "solo": solo,
        "load": load,
        "before": before,
        "after_one": after_one,
        "after_close": after_close,
    }


def run(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    count = s.stateless_clients
    limits = raise_fd_limit(count + FD_HEADROOM)
    options = ("--max-connections", str(count + CONNECTION_HEADROOM))
    with sidecar(ctx.logs, "8-sidecar-stateless", *options, upstream=raw_echo_command()) as server:
        server.ready()
        result: dict[str, Any] = anyio.run(measure, ctx, server, backend_options=event_loop_options())
    tally: Tally = result["tally"]
    solo: Phase = result["solo"]
    load: Phase = result["load"]
    if tally.answered == 0:
        raise RuntimeError(f"no call was answered: {tally.examples}")
    ms = {"solo": [x * 1e3 for x in solo.latencies], "load": [x * 1e3 for x in load.latencies]}
    label = f"{count:,} 2026-07-28 clients"
    alone_label = "(direct: 1 client alone)"
    samples = {"samples": {"alone": len(solo.latencies), "together": len(load.latencies)}}
    rss_detail = {
        "after_one_client_mb": round(result["after_one"] / MB, 1),
        "after_clients_closed_mb": round(result["after_close"] / MB, 1),
        "max_sampled_during_load_mb": load.detail["rss_max_sampled_mb"],
        "sidecar_open_fds": load.detail["sidecar_open_fds"],
        "upstream_processes": load.detail["upstream_processes"],
        "open_files_limit": list(limits),
        "sidecar_options": list(options),
    }
    return [
        Row(
            "8",
            f"{label}: tools/call p50 {alone_label}",
            "ms",
            median(ms["solo"]),
            median(ms["load"]),
            detail=samples,
        ),
        Row(
            "8",
            f"{label}: tools/call p99 {alone_label}",
            "ms",
            percentile(ms["solo"], 99),
            percentile(ms["load"], 99),
            detail=samples,
        ),
        Row(
            "8",
            f"{label}: throughput {alone_label}",
            "calls/s",
            solo.throughput,
            load.throughput,
            detail=load.detail,
        ),
        Row(
            "8",
            f"{label}: errors, every call and connection of both phases",
            "errors",
            None,
            float(tally.failed),
            ERRORS_TARGET,
            {
                "alone": solo.errors,
                "together": load.errors,
                "answered": tally.answered,
                "by_kind": dict(tally.errors),
                "examples": tally.examples,
            },
        ),
        *(
            Row(
                "8",
                f"{label}: {what} (direct: before the first client)",
                "MB",
                result["before"][key] / MB,
                load.status[key] / MB,
                RSS_TARGET,
                detail,
            )
            for key, what, detail in (
                ("VmRSS", "sidecar RSS, every client still connected", rss_detail),
                ("VmHWM", "sidecar peak RSS, VmHWM", {}),
            )
        ),
    ]
