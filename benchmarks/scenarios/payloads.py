"""2. Large tool results (1 MB, 10 MB) through the proxy: time per call and the proxy's peak memory.

Each size gets a fresh proxy, so its peak RSS (VmHWM, reset once the session is warm) belongs to
that size alone. The target compares the peak's rise above the idle proxy with the payload: the
idle interpreter and its libraries are the footprint scenario's business.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.measure import FLOOR_ARMS, FORWARDER, PROXIED, alternate, median
from benchmarks.procs import (
    peak_rss,
    reset_peak_rss,
    rss,
)
from benchmarks.rawclient import check_answers, tool_call_line
from benchmarks.report import Row, Target, floor_row
from benchmarks.scenarios import RunContext
from benchmarks.scenarios.passthrough_raw import raw_echo_arms
from benchmarks.settings import MB

TARGET_SIZE = 10 * MB
TIME_TARGET = Target("ratio_max", 1.5, "≤ 1.5x direct")


def size_label(size: int) -> str:
    return f"{size // MB} MB" if size % MB == 0 else f"{size} B"


def measure_size(ctx: RunContext, size: int) -> list[Row]:
    s = ctx.settings
    label = size_label(size)
    with raw_echo_arms(ctx, f"2-{size}") as (clients, proxy_pid):
        for client in clients.values():
            client.round_trips([tool_call_line(1, "echo", {"text": "warm"})] * 10)
        idle = rss(proxy_pid)
        peak_was_reset = reset_peak_rss(proxy_pid)
        lines = [tool_call_line(2, "echo", {"size": size})] * s.payload_calls
        answer_bytes = 0
        for client in clients.values():  # the echo servers build and cache the payload once
            _, answers = client.round_trips(lines[:1])
            answer_bytes = len(answers[0])

        def batch(arm: str) -> Sequence[float]:
            times, answers = clients[arm].round_trips(lines)
            if any(len(answer) != answer_bytes for answer in answers):
                raise RuntimeError(f"{arm}: a {label} answer arrived truncated or altered")
            return [t * 1e3 for t in times]

        ctx.progress(f"{label} results")
        samples = alternate(s.rounds, batch, FLOOR_ARMS)
        check_answers(clients[PROXIED].round_trips(lines[:1])[1], lines[:1])
        peak = peak_rss(proxy_pid)

    growth_mb = (peak - idle) / MB
    memory_detail = {
        "payload_bytes": answer_bytes,
        "proxy_idle_rss_mb": round(idle / MB, 1),
        "proxy_peak_rss_mb": round(peak / MB, 1),
        "growth_per_payload": round((peak - idle) / answer_bytes, 2),
        "peak_reset_after_warmup": peak_was_reset,
    }
    memory_target = (
        Target("proxied_max", 4 * answer_bytes / MB, f"≤ 4x payload ({4 * answer_bytes / MB:.0f} MB)")
        if size == TARGET_SIZE
        else None
    )
    rows = [
        Row(
            "2",
            f"{label} result: call time p50",
            "ms",
            median(samples.direct),
            median(samples.proxied),
            TIME_TARGET if size == TARGET_SIZE else None,
            {"samples_per_arm": len(samples.direct), "forwarder_ms": median(samples.by_arm[FORWARDER])},
        ),
        Row(
            "2",
            f"{label} result: proxy peak RSS above idle",
            "MB",
            None,
            growth_mb,
            memory_target,
            memory_detail,
        ),
    ]
    if size == TARGET_SIZE:
        rows.insert(1, floor_row("2", f"{label} result: call time p50", "ms", samples))
    return rows


def run(ctx: RunContext) -> list[Row]:
    rows: list[Row] = []
    for size in ctx.settings.payload_sizes:
        rows += measure_size(ctx, size)
    return rows
