"""5 (HTTP). The sidecar's resident memory with 100 idle handshake-era HTTP sessions.

In front of a stdio upstream each session has its own upstream process, so the sidecar's own RSS
and its children's total are reported apart; the upstream here is the raw echo server (a hundred
SDK servers would take a minute of CPU to start and say nothing more about the sidecar). In front
of an HTTP upstream (the SDK server over streamable HTTP) each session is one upstream session and
there are no children. The "direct" column is the same sidecar before any session was opened.
RSS is read once every session has been opened, made one call, and then sat idle for a moment.
The sidecars run with `--no-warm-up`: what is measured is what sessions cost, not the Claude client
(about 54 MB, built in the background once the first session is backfilled; see scenario 5).
"""

from __future__ import annotations

import contextlib
from contextlib import ExitStack
from typing import Any

import anyio

from benchmarks.httpload import session_pool
from benchmarks.httpservers import HttpServer, ready, sdk_http_server, sidecar
from benchmarks.procs import children, raw_echo_command, rss
from benchmarks.report import Row
from benchmarks.scenarios import RunContext
from benchmarks.settings import MB
from mcp_backfill.cli import event_loop_options


def _total_rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, KeyError):  # gone meanwhile
            total += rss(pid)
    return total


async def _with_sessions(url: str, count: int, settle: float, pid: int) -> dict[str, Any]:
    await anyio.sleep(settle)
    before = rss(pid)
    async with session_pool(url, count, warmup=1) as (_, opening):
        await anyio.sleep(settle)
        kids = children(pid)
        return {
            "before": before,
            "after": rss(pid),
            "children": len(kids),
            "children_rss": _total_rss(kids),
            "opening_s": round(opening, 2),
        }


def _measure(server: HttpServer, count: int, settle: float) -> dict[str, Any]:
    reading: dict[str, Any] = anyio.run(
        _with_sessions, server.url, count, settle, server.pid, backend_options=event_loop_options()
    )
    return reading


def run(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    count = s.idle_http_sessions
    settle = 0.3 if s.quick else 1.0
    with ExitStack() as stack:
        # Both sidecars and the HTTP upstream start side by side; each is measured alone.
        stdio_sidecar = stack.enter_context(
            sidecar(ctx.logs, "5-sidecar-stdio", "--no-warm-up", upstream=raw_echo_command())
        )
        upstream = stack.enter_context(sdk_http_server(ctx.logs, "5-upstream-sdk-http")).ready()
        http_sidecar = stack.enter_context(
            sidecar(ctx.logs, "5-sidecar-http", "--no-warm-up", "--upstream-url", upstream.url)
        )
        ready(stdio_sidecar, http_sidecar)
        ctx.progress(f"{count} sessions, stdio upstream (raw echo)")
        stdio = _measure(stdio_sidecar, count, settle)
        if stdio["children"] < count:
            raise RuntimeError(f"expected {count} upstream processes, found {stdio['children']}")
        ctx.progress(f"{count} sessions, HTTP upstream (SDK server)")
        upstream_before = rss(upstream.pid)
        http = _measure(http_sidecar, count, settle)
        http["upstream_rss_mb"] = {"before": upstream_before / MB, "after": rss(upstream.pid) / MB}
    return [
        Row(
            "5",
            f"sidecar RSS, {count} idle HTTP sessions, stdio upstream (direct: no session yet)",
            "MB",
            stdio["before"] / MB,
            stdio["after"] / MB,
            detail={"sessions": count, "opening_s": stdio["opening_s"]},
        ),
        Row(
            "5",
            f"upstream processes' total RSS, {count} sessions (raw echo children of the sidecar)",
            "MB",
            None,
            stdio["children_rss"] / MB,
            detail={"children": stdio["children"]},
        ),
        Row(
            "5",
            f"sidecar RSS, {count} idle HTTP sessions, HTTP upstream (direct: no session yet)",
            "MB",
            http["before"] / MB,
            http["after"] / MB,
            detail={
                "sessions": count,
                "opening_s": http["opening_s"],
                "upstream_rss_mb": {k: round(v, 1) for k, v in http["upstream_rss_mb"].items()},
            },
        ),
    ]
