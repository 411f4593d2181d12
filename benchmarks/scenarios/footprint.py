"""5. Footprint: time from spawn to the first answer, and the resident memory of an idle proxy.

Startup is timed from just before the spawn to the `initialize` answer, which the client sends at
once (a pipe buffers it until the server reads). Idle RSS is read once the session has settled
after the handshake and a `tools/list`; it counts the proxy process alone (not its upstream), run
with `--no-warm-up`: by default the proxy imports and builds the Claude client in the background
once it knows it answers a session's sampling (about 54 MB more), so that the first sampling answer
does not wait for it. A proxy with `--provider mock` (no anthropic SDK loaded) is measured too, for
reference. Startup is measured with the defaults, warm-up included. So is the longest a message
waits while the warm-up runs: pings one at a time for a few seconds after the handshake, against the
same with `--no-warm-up`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.measure import DIRECT, PROXIED, alternate, median
from benchmarks.procs import proxy_command, raw_echo_command, rss, sdk_server_command, started
from benchmarks.rawclient import RawClient, check_answers, request_line
from benchmarks.report import Row, Target
from benchmarks.scenarios import RunContext
from benchmarks.settings import MB

IDLE_RSS_TARGET = Target("proxied_max", 60.0, "≤ 60 MB")
RAW_STARTUP_TARGET = Target("added_max", 250.0, "added ≤ 250 ms")
# The warm-up starts with the handshake; it must not slow it (5% for the noise of process starts).
WARM_UP_STARTUP_TARGET = Target("ratio_max", 1.05, "≤ 1.05x --no-warm-up")
NO_WARM_UP = "no-warm-up"
# The raw echo upstream's starts read no memory, so they need no settling and can be many: medians of
# five starts per arm moved by up to 9% between runs, more than the warm-up row's 5% allows.
RAW_STARTS_FACTOR = 3
RAW_SETTLE = 0.1


def start_once(ctx: RunContext, argv: list[str], name: str, settle: float) -> tuple[float, float]:
    """Spawn, handshake, settle; (seconds to the initialize answer, idle RSS in MB of the spawned process)."""
    started_at = time.perf_counter()
    with started(argv, ctx.logs, name) as process:
        client = RawClient(process)
        client.initialize()
        startup = time.perf_counter() - started_at
        client.request("tools/list")
        time.sleep(settle)
        return startup, rss(process.pid) / MB


def longest_wait(ctx: RunContext, options: Sequence[str], window: float) -> float:
    """Milliseconds: the longest `ping` round trip through a fresh proxy (raw echo upstream) in the
    `window` seconds after its handshake, one ping at a time, which covers the warm-up's import."""
    with started(proxy_command(raw_echo_command(), *options), ctx.logs, "5-wait") as process:
        client = RawClient(process)
        client.initialize()
        longest = 0.0
        ends = time.perf_counter() + window
        while time.perf_counter() < ends:
            line = request_line(client.next_id(), "ping")
            (seconds,), answers = client.round_trips([line])
            check_answers(answers, [line])
            longest = max(longest, seconds)
    return longest * 1e3


def warm_up_wait_row(ctx: RunContext) -> Row:
    window = 1.5 if ctx.settings.quick else 3.0
    ctx.progress("longest message wait during the warm-up")
    waits = alternate(
        ctx.settings.startup_repeats,
        lambda arm: [longest_wait(ctx, ("--no-warm-up",) if arm == DIRECT else (), window)],
    )
    return Row(
        "5",
        f"longest ping round trip in the {window:g} s after the handshake: warm-up on (direct: --no-warm-up)",
        "ms",
        median(waits.direct),
        median(waits.proxied),
        detail={"starts_per_arm": len(waits.direct), "proxied_ms": [round(ms, 2) for ms in waits.proxied]},
    )


def run(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    settle = 0.3 if s.quick else 1.0
    rows: list[Row] = []
    for label, upstream in (
        ("SDK upstream", sdk_server_command()),
        ("raw echo upstream", raw_echo_command()),
    ):
        memory: dict[str, list[float]] = {DIRECT: [], PROXIED: [], NO_WARM_UP: []}
        raw = label == "raw echo upstream"
        pause = RAW_SETTLE if raw else settle

        def batch(
            arm: str,
            upstream: list[str] = upstream,
            memory: dict[str, list[float]] = memory,
            pause: float = pause,
        ) -> Sequence[float]:
            options = ("--no-warm-up",) if arm == NO_WARM_UP else ()
            argv = upstream if arm == DIRECT else proxy_command(upstream, *options)
            startup, megabytes = start_once(ctx, argv, f"5-{arm}", pause)
            memory[arm].append(megabytes)
            return [startup * 1e3]

        ctx.progress(f"startup, {label}")
        startups = alternate(
            s.startup_repeats * RAW_STARTS_FACTOR if raw else s.startup_repeats,
            batch,
            (DIRECT, PROXIED, NO_WARM_UP) if raw else (DIRECT, PROXIED),
        )
        rows.append(
            Row(
                "5",
                f"startup to initialize answered, {label}",
                "ms",
                median(startups.direct),
                median(startups.proxied),
                RAW_STARTUP_TARGET if raw else None,
                {"starts_per_arm": len(startups.direct)},
            )
        )
        if raw:
            rows.append(
                Row(
                    "5",
                    "startup to initialize answered, raw echo upstream: warm-up on (direct: --no-warm-up)",
                    "ms",
                    median(startups.by_arm[NO_WARM_UP]),
                    median(startups.proxied),
                    WARM_UP_STARTUP_TARGET,
                    {"starts_per_arm": len(startups.proxied)},
                )
            )
            rows.append(warm_up_wait_row(ctx))
        if label == "SDK upstream":
            ctx.progress("idle RSS with --no-warm-up")
            cold = [
                start_once(ctx, proxy_command(upstream, "--no-warm-up"), "5-proxy-cold", settle)[1]
                for _ in range(s.startup_repeats)
            ]
            rows.append(
                Row(
                    "5",
                    "idle RSS (direct: the SDK upstream; proxied: the proxy process, --no-warm-up)",
                    "MB",
                    median(memory["direct"]),
                    median(cold),
                    IDLE_RSS_TARGET,
                    {"proxy_rss_mb": cold},
                )
            )
    ctx.progress("idle RSS with --provider mock")
    mock = [
        start_once(ctx, proxy_command(raw_echo_command(), "--provider", "mock"), "5-proxy-mock", settle)[1]
        for _ in range(s.startup_repeats)
    ]
    rows.append(
        Row(
            "5",
            "idle RSS of the proxy with --provider mock (no anthropic SDK)",
            "MB",
            None,
            median(mock),
            detail={"proxy_rss_mb": mock},
        )
    )
    return rows
