"""3. The HTTP front: `mcp-backfill serve` against `mcp-proxy`, and against no proxy at all.

3a. The sidecar in front of a stdio upstream against `mcp-proxy` (the common Python stdio->HTTP
    bridge, in its own virtualenv: benchmarks/peers.py) in front of the same command. The sidecar
    starts one upstream process per client session; mcp-proxy shares one upstream among them all.
    The "direct" column of these rows is mcp-proxy.
3b. The sidecar in front of an HTTP upstream (the same SDK server over streamable HTTP, uvicorn)
    against that upstream directly; each client session is one upstream session. At one session
    four more arms go to the direct upstream through floors, each a layer of what the sidecar is
    built on: a bare TCP forwarder (benchmarks/servers/tcp_forwarder.py), what the extra hop alone
    costs; the same forwarder parsing HTTP and decoding every message (`--parse`); uvicorn with a
    bare ASGI forwarder (benchmarks/servers/asgi_forwarder.py); and a front that ends HTTP on both
    sides below ASGI, with the least work per call a front of the proxy's own would do
    (benchmarks/servers/terminating_forwarder.py). (At 8 and 64 sessions their
    batches would load the direct arm's upstream more and slow the next batch.) The CPU time per
    call of the process in the middle is recorded for the sidecar and each floor, and at one
    session the upstream's CPU time and how often its event loop waited for work, per call, for
    every arm: direct, the upstream is still busy with a call when the next one comes (it hardly
    waits); through a proxy slow enough, it waits once a call and spends more CPU on each
    (`benchmarks/README.md`, the thirty-fourth round).

Load: 1, 8 and 64 concurrent client sessions, each calling `tools/call echo` one call at a time,
for a fixed time per batch (benchmarks/httpload.py), from a lean raw-HTTP client
(benchmarks/httpclient.py) whose CPU time per call is recorded with every row: the direct arm of
3b shows what the client and the upstream manage without a proxy. Both arms' sessions stay open
for the whole scenario; batches take turns (ABBA per round, every concurrency in each round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from typing import Any

import anyio

from benchmarks.httpload import Batch, run_batch, session_pool
from benchmarks.httpservers import (
    asgi_forwarder,
    mcp_proxy,
    ready,
    sdk_http_server,
    sidecar,
    tcp_forwarder,
    terminating_forwarder,
)
from benchmarks.measure import DIRECT, PROXIED, median, percentile, turn_order
from benchmarks.procs import cpu_seconds, raw_echo_command, sdk_server_command, wait_until_quiet, waits
from benchmarks.report import Row, Target
from benchmarks.scenarios import RunContext
from mcp_backfill.cli import event_loop_options

PEER_TARGET = Target("ratio_min", 1.0, "≥ mcp-proxy's")
UPSTREAM_TARGET = Target("ratio_min", 0.80, "≥ 0.80x direct")
ONE_SESSION_ADDED_TARGET = Target("added_max", 1.5, "added ≤ 1.5 ms")

FLOOR = "tcp-forwarder"
PARSING_FLOOR = "parsing-forwarder"
ASGI_FLOOR = "asgi-forwarder"
TERMINATING_FLOOR = "terminating-forwarder"
FLOORS = {
    FLOOR: "throughput via a bare TCP forwarder (the floor)",
    PARSING_FLOOR: "throughput via a forwarder that parses HTTP and decodes each message",
    ASGI_FLOOR: "throughput via uvicorn and a bare ASGI forwarder",
    TERMINATING_FLOOR: "throughput via a front that ends HTTP on both sides, below ASGI",
}

Results = dict[int, dict[str, list[Batch]]]


async def measure(
    ctx: RunContext,
    urls: dict[str, str],
    middles: dict[str, int],
    one_session: Sequence[str] = (),
    upstreams: dict[str, int] | None = None,
) -> tuple[Results, dict[str, float]]:
    """Batches per concurrency and arm, and the seconds each arm took to open its sessions.

    `middles`: the pid of the process between client and server per arm, whose CPU time each batch
    records (the sidecar's is waited for first: its warm-up, started by its first session). The
    arms in `one_session` run at one session only (a reference that must not add load elsewhere).
    `upstreams`: the pid of the server each arm reaches, whose CPU time and waits each one-session
    batch records."""
    s = ctx.settings
    most = max(s.http_sessions)
    results: Results = {
        sessions: {arm: [] for arm in urls if sessions == 1 or arm not in one_session}
        for sessions in s.http_sessions
    }
    opening: dict[str, float] = {}
    async with AsyncExitStack() as stack:
        pools = {}
        for arm, url in urls.items():
            size = 1 if arm in one_session else most
            ctx.progress(f"{arm}: opening {size} session{'s' if size > 1 else ''}")
            pools[arm], opening[arm] = await stack.enter_async_context(session_pool(url, size, s.http_warmup))
        for pid in middles.values():
            await anyio.to_thread.run_sync(wait_until_quiet, pid)
        for index in range(s.http_rounds):
            ctx.progress(f"round {index + 1} of {s.http_rounds}")
            for sessions, arms in results.items():
                for arm in turn_order(index, list(arms)):
                    middle = middles.get(arm)
                    server = (upstreams or {}).get(arm) if sessions == 1 else None
                    before = cpu_seconds(middle) if middle is not None else 0.0
                    server_cpu, server_waits = (
                        (cpu_seconds(server), waits(server)) if server is not None else (0.0, 0)
                    )
                    batch = await run_batch(pools[arm][:sessions], s.http_batch_seconds)
                    if middle is not None:
                        batch.middle_cpu = cpu_seconds(middle) - before
                    if server is not None:
                        batch.upstream_cpu = cpu_seconds(server) - server_cpu
                        batch.upstream_waits = waits(server) - server_waits
                    arms[arm].append(batch)
    return results, opening


def _measure(
    ctx: RunContext,
    urls: dict[str, str],
    middles: dict[str, int],
    one_session: Sequence[str] = (),
    upstreams: dict[str, int] | None = None,
) -> tuple[Results, dict[str, float]]:
    return anyio.run(
        measure, ctx, urls, middles, one_session, upstreams, backend_options=event_loop_options()
    )


def _per_call(batches: Sequence[Batch], figure: Callable[[Batch], float | None]) -> float:
    return sum(figure(b) or 0.0 for b in batches) / max(sum(b.calls for b in batches), 1)


def _cpu_per_call_us(batches: Sequence[Batch], cpu: Callable[[Batch], float | None]) -> float:
    return _per_call(batches, cpu) * 1e6


def _upstream_timed(batches: Sequence[Batch]) -> bool:
    return bool(batches) and all(b.upstream_waits is not None for b in batches)


def _upstream_rows(number: str, name: str, arms: dict[str, list[Batch]], counts: dict[str, Any]) -> list[Row]:
    """The upstream's CPU time and waits per call, direct and through the sidecar (one session)."""
    if not (_upstream_timed(arms.get(DIRECT, [])) and _upstream_timed(arms.get(PROXIED, []))):
        return []
    figures: dict[str, tuple[str, Callable[[Batch], float | None]]] = {
        "the upstream's CPU time per call": ("µs", lambda b: (b.upstream_cpu or 0.0) * 1e6),
        "the upstream's waits for work per call": ("waits", lambda b: b.upstream_waits),
    }
    return [
        Row(
            number,
            name.format(what=what),
            unit,
            _per_call(arms[DIRECT], f),
            _per_call(arms[PROXIED], f),
            None,
            counts,
        )
        for what, (unit, f) in figures.items()
    ]


def rows(
    number: str,
    label: str,
    results: Results,
    detail: dict[str, Any],
    target: Target | None,
    one_session_p50_target: Target | None = None,
) -> list[Row]:
    out: list[Row] = []
    for sessions, arms in results.items():
        direct = arms[DIRECT]
        latency = {arm: [lat * 1e3 for b in batches for lat in b.latencies] for arm, batches in arms.items()}
        counts = {
            **detail,
            "batches_per_arm": len(direct),
            "calls": {arm: sum(b.calls for b in batches) for arm, batches in arms.items()},
            "client_cpu_us_per_call": {
                arm: round(_cpu_per_call_us(batches, lambda b: b.client_cpu), 1)
                for arm, batches in arms.items()
            },
            "middle_cpu_us_per_call": {
                arm: round(_cpu_per_call_us(batches, lambda b: b.middle_cpu), 1)
                for arm, batches in arms.items()
                if all(b.middle_cpu is not None for b in batches)  # timed, even when 0 (10 ms ticks)
            },
        }
        upstream_timed = {arm: batches for arm, batches in arms.items() if _upstream_timed(batches)}
        if upstream_timed:
            counts["upstream_cpu_us_per_call"] = {
                arm: round(_cpu_per_call_us(batches, lambda b: b.upstream_cpu), 1)
                for arm, batches in upstream_timed.items()
            }
            counts["upstream_waits_per_call"] = {
                arm: round(_per_call(batches, lambda b: b.upstream_waits), 3)
                for arm, batches in upstream_timed.items()
            }
        name = f"{sessions} session{'s' if sessions > 1 else ''}, {label}"
        for arm, what in {PROXIED: "throughput", **FLOORS}.items():
            row_target = target if arm == PROXIED else None
            if arm in arms:
                out.append(
                    Row(
                        number,
                        name.format(what=what),
                        "req/s",
                        median([b.throughput for b in direct]),
                        median([b.throughput for b in arms[arm]]),
                        row_target,
                        counts,
                    )
                )
        out += _upstream_rows(number, name, arms, counts)
        for q in (50, 99):
            out.append(
                Row(
                    number,
                    name.format(what=f"tools/call p{q}"),
                    "ms",
                    percentile(latency[DIRECT], q),
                    percentile(latency[PROXIED], q),
                    one_session_p50_target if (sessions, q) == (1, 50) else None,
                    counts,
                )
            )
    return out


def run_stdio(ctx: RunContext) -> list[Row]:
    """3a: the sidecar vs mcp-proxy, both in front of the same stdio command."""
    s = ctx.settings
    upstream = sdk_server_command() if s.http_stdio_upstream == "sdk" else raw_echo_command()
    with ExitStack() as stack:
        peer = stack.enter_context(mcp_proxy(ctx, "3a-mcp-proxy", upstream))
        ours = stack.enter_context(sidecar(ctx.logs, "3a-sidecar", upstream=upstream))
        ready(peer, ours)
        results, opening = _measure(ctx, {DIRECT: peer.url, PROXIED: ours.url}, {PROXIED: ours.pid})
    detail = {
        "upstream": "SDK server (stdio)" if s.http_stdio_upstream == "sdk" else "raw echo (stdio)",
        "direct_arm": "mcp-proxy",
        "session_opening_s": {arm: round(seconds, 2) for arm, seconds in opening.items()},
    }
    return rows("3a", "stdio upstream: {what} (direct: mcp-proxy)", results, detail, PEER_TARGET)


def run_http(ctx: RunContext) -> list[Row]:
    """3b: the sidecar in front of the SDK server over HTTP vs that server directly."""
    with ExitStack() as stack:
        direct = stack.enter_context(sdk_http_server(ctx.logs, "3b-direct-sdk-http"))
        behind = stack.enter_context(sdk_http_server(ctx.logs, "3b-upstream-sdk-http"))
        ready(direct, behind)
        ours = stack.enter_context(sidecar(ctx.logs, "3b-sidecar", "--upstream-url", behind.url)).ready()
        floors = {
            FLOOR: tcp_forwarder(ctx.logs, "3b-tcp-forwarder", direct.url),
            PARSING_FLOOR: tcp_forwarder(ctx.logs, "3b-parsing-forwarder", direct.url, parse=True),
            ASGI_FLOOR: asgi_forwarder(ctx.logs, "3b-asgi-forwarder", direct.url),
            TERMINATING_FLOOR: terminating_forwarder(ctx.logs, "3b-terminating-forwarder", direct.url),
        }
        servers = {PROXIED: ours} | {arm: stack.enter_context(server) for arm, server in floors.items()}
        ready(*servers.values())
        urls = {DIRECT: direct.url} | {arm: server.url for arm, server in servers.items()}
        middles = {arm: server.pid for arm, server in servers.items()}
        # The floors forward to the direct arm's server; batches take turns, so each is timed alone.
        upstreams = {arm: direct.pid for arm in urls} | {PROXIED: behind.pid}
        results, opening = _measure(ctx, urls, middles, one_session=list(floors), upstreams=upstreams)
    detail = {
        "upstream": "SDK server (streamable HTTP, uvicorn)",
        "session_opening_s": {arm: round(seconds, 2) for arm, seconds in opening.items()},
    }
    return rows("3b", "HTTP upstream: {what}", results, detail, UPSTREAM_TARGET, ONE_SESSION_ADDED_TARGET)
