"""1a. Pass-through latency over stdio against the cheapest possible upstream and client.

The arms run side by side for the whole scenario: the raw echo server spawned directly, the proxy
spawned in front of its own raw echo server, and (for reference) a bare byte forwarder in front of
a third one. A blocking JSON-lines client (no SDK) drives them all, so the difference between the
direct and the proxied arm is the proxy's own cost per round trip, and the forwarder shows how much
of it any extra process with two more pipe hops costs on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from benchmarks.measure import DIRECT, FLOOR_ARMS, FORWARDER, PROXIED, Samples, alternate, median
from benchmarks.procs import forwarder_command, proxy_command, raw_echo_command, started, wait_until_quiet
from benchmarks.rawclient import RawClient, check_answers, tool_call_line
from benchmarks.report import Row, Target, floor_row, latency_rows
from benchmarks.scenarios import RunContext

ADDED_P50_TARGET = Target("added_max", 100.0, "added ≤ 100 µs")
FLOOR_TARGET = Target("ratio_max", 1.15, "≤ 1.15x the forwarder's")


@contextmanager
def raw_echo_arms(ctx: RunContext, tag: str) -> Iterator[tuple[dict[str, RawClient], int]]:
    """The raw echo server three ways, each session initialized: directly, through the proxy and
    through the bare byte forwarder. Yields the clients by arm, and the proxy's pid."""
    with (
        started(raw_echo_command(), ctx.logs, f"{tag}-direct-echo") as direct_process,
        started(proxy_command(raw_echo_command()), ctx.logs, f"{tag}-proxy") as proxy_process,
        started(forwarder_command(raw_echo_command()), ctx.logs, f"{tag}-forwarder") as forwarder_process,
    ):
        clients = {
            DIRECT: RawClient(direct_process),
            PROXIED: RawClient(proxy_process),
            FORWARDER: RawClient(forwarder_process),
        }
        for client in clients.values():
            client.initialize()
        wait_until_quiet(proxy_process.pid)
        yield clients, proxy_process.pid


def echo_lines(count: int, first_id: int = 1000) -> list[bytes]:
    return [tool_call_line(first_id + n, "echo", {"text": "hello"}) for n in range(count)]


def run(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    with raw_echo_arms(ctx, "1a") as (clients, _):
        for client in clients.values():
            client.round_trips(echo_lines(s.warmup))

        latency_lines = echo_lines(s.raw_round_trips)

        def latency_batch(arm: str) -> Sequence[float]:
            times, answers = clients[arm].round_trips(latency_lines)
            check_answers(answers, latency_lines)
            return [t * 1e6 for t in times]

        ctx.progress("sequential round trips")
        latency = alternate(s.rounds, latency_batch, FLOOR_ARMS)

        throughput: dict[int, Samples] = {}
        throughput_lines = echo_lines(s.throughput_requests)
        for window in s.windows:

            def throughput_batch(arm: str, window: int = window) -> Sequence[float]:
                wall, answers = clients[arm].pipelined(throughput_lines, window)
                check_answers(answers, throughput_lines)
                return [len(throughput_lines) / wall]

            ctx.progress(f"throughput, {window} in flight")
            throughput[window] = alternate(s.rounds, throughput_batch, FLOOR_ARMS)

    rows = latency_rows(
        "1a", "raw echo: round trip p50", "raw echo: round trip p99", "µs", latency, ADDED_P50_TARGET
    )
    rows.insert(1, floor_row("1a", "raw echo: round trip p50", "µs", latency, rows[0].detail))
    direct_p50 = median(latency.direct)
    rows.insert(
        2,
        Row(
            "1a",
            "raw echo: added p50, the proxy against the bare forwarder (direct: the forwarder's added µs)",
            "µs",
            median(latency.by_arm[FORWARDER]) - direct_p50,
            median(latency.proxied) - direct_p50,
            FLOOR_TARGET,
            detail=rows[0].detail,
        ),
    )
    for window, samples in throughput.items():
        rows.append(
            Row(
                "1a",
                f"raw echo: throughput, {window} in flight",
                "req/s",
                median(samples.direct),
                median(samples.proxied),
                detail={
                    "batches_per_arm": len(samples.direct),
                    "requests_per_batch": s.throughput_requests,
                    "forwarder_req_s": median(samples.by_arm[FORWARDER]),
                },
            )
        )
    return rows
