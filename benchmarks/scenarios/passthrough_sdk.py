"""1b. Pass-through over stdio with the mcp SDK on both ends: what a real deployment pays.

Three SDK clients (no sampling callback, handshake era) stay connected for the whole scenario: one
to the SDK server directly, one to the proxy in front of its own copy of the server, and (for
reference) one through the bare byte forwarder of 1a in front of a third copy: the floor for any
process in between. With the SDK on both ends it is often faster than direct (the SDK server spends
less CPU per line when a blocking thread writes its input: `benchmarks/README.md`, the eighth
round), so read 1b's ratios against it too. Their batches take turns on one event loop (the SDK's
default asyncio loop, as SDK clients run it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from benchmarks.measure import DIRECT, FLOOR_ARMS, FORWARDER, PROXIED, Samples, alternate_async, median
from benchmarks.procs import (
    ROOT,
    bench_env,
    forwarder_command,
    proxy_children,
    proxy_command,
    sdk_server_command,
    wait_until_quiet,
)
from benchmarks.report import Row, Target, floor_row, latency_rows
from benchmarks.scenarios import RunContext

RATIO_TARGET = Target("ratio_max", 1.10, "≤ 1.10x direct")
THROUGHPUT_TARGET = Target("ratio_min", 1 / 1.10, "≥ 0.91x direct (≤ 1.10x time)")


@asynccontextmanager
async def sdk_client(ctx: RunContext, argv: list[str], name: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bench_env(), cwd=str(ROOT))
    with ctx.logs.open_text(name) as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
            yield client


async def call_echo(client: Client) -> float:
    started = time.perf_counter()
    result = await client.call_tool("echo", {"text": "hello"})
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise RuntimeError(f"echo failed: {result}")
    return elapsed


async def measure(ctx: RunContext) -> tuple[Samples, dict[int, Samples]]:
    s = ctx.settings
    async with (
        sdk_client(ctx, sdk_server_command(), "1b-direct-sdk-server") as direct,
        sdk_client(ctx, proxy_command(sdk_server_command()), "1b-proxy") as proxied,
        sdk_client(ctx, forwarder_command(sdk_server_command()), "1b-forwarder") as forwarded,
    ):
        clients = {DIRECT: direct, PROXIED: proxied, FORWARDER: forwarded}
        for client in clients.values():
            for _ in range(s.warmup):
                await call_echo(client)
        for pid in proxy_children():
            await anyio.to_thread.run_sync(wait_until_quiet, pid)

        async def latency_batch(arm: str) -> Sequence[float]:
            return [await call_echo(clients[arm]) * 1e3 for _ in range(s.sdk_calls)]

        ctx.progress("sequential tools/call")
        latency = await alternate_async(s.rounds, latency_batch, FLOOR_ARMS)

        throughput: dict[int, Samples] = {}
        for window in s.windows:

            async def throughput_batch(arm: str, window: int = window) -> Sequence[float]:
                per_worker = max(s.throughput_requests // window, 1)

                async def worker() -> None:
                    for _ in range(per_worker):
                        await call_echo(clients[arm])

                started = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for _ in range(window):
                        tg.start_soon(worker)
                return [per_worker * window / (time.perf_counter() - started)]

            ctx.progress(f"throughput, {window} in flight")
            throughput[window] = await alternate_async(s.rounds, throughput_batch, FLOOR_ARMS)
    return latency, throughput


def run(ctx: RunContext) -> list[Row]:
    latency, throughput = anyio.run(measure, ctx)
    rows = latency_rows("1b", "SDK: tools/call p50", "SDK: tools/call p99", "ms", latency, RATIO_TARGET)
    rows.insert(1, floor_row("1b", "SDK: tools/call p50", "ms", latency, rows[0].detail))
    for window, samples in throughput.items():
        rows.append(
            Row(
                "1b",
                f"SDK: throughput, {window} in flight",
                "req/s",
                median(samples.direct),
                median(samples.proxied),
                THROUGHPUT_TARGET,
                {"batches_per_arm": len(samples.direct)},
            )
        )
        rows.append(
            floor_row("1b", f"SDK: throughput, {window} in flight", "req/s", samples, rows[-1].detail)
        )
    return rows
