"""`python -m benchmarks.critical_path`: what of the sidecar's work lies on a call's path (3b, one session).

At one session a call waits for the sidecar only while neither the client nor the upstream has
anything to do: from the request's arrival to its POST upstream, and from the upstream's answer to
the response. What the sidecar does while the upstream works is hidden by the upstream's own time
(the machine has a core for each), and what it does after the response may or may not delay the
next request. Its CPU per call alone does not say which; this does, two ways:

* `trace` (the default): the probe points of `benchmarks/probe.py` timed in a sidecar serving one
  session's `tools/call`s in front of the SDK server: the median wall and CPU time from each point
  to the next, for the calls that passed them in the most common order.
* `weigh`: for each point named (by default those in `SPIN_POINTS`), a sidecar that spends `--us`
  µs of CPU each time it passes that point, beside one that does not, their batches taking turns as
  in `compare_trees`: the throughput ratio, and the weight, the time a call gained per µs spent
  there (1: all on the call's path; 0: hidden).

Both start their sidecars with `servers/probe_site` first on the `PYTHONPATH` (`--src` adds a tree).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import anyio

from benchmarks.compare_trees import OTHER, THIS, Arm, both_orders, throughputs
from benchmarks.httpload import run_batch, session_pool
from benchmarks.httpservers import HttpServer, ready, sdk_http_server, sidecar
from benchmarks.measure import median
from benchmarks.probe import POINTS, SITE, SPIN_VARIABLE, TRACE_VARIABLE, segments
from benchmarks.procs import LogDir, wait_until_quiet
from mcp_backfill.cli import event_loop_options

SPIN_POINTS = (
    "request in",
    "relay routes it",
    "upstream written",
    "response complete",
    "answer written",
    "exchange ends",
)
WARM_UP_CALLS = 50


def trace(upstream: HttpServer, logs: LogDir, path: str, options: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        records = Path(scratch) / "trace.json"
        with sidecar(
            logs,
            "probe-trace",
            "--upstream-url",
            upstream.url,
            source=path,
            env={TRACE_VARIABLE: str(records)},
        ) as server:
            ready(server)
            throughput = anyio.run(_one_batch, server, options.seconds, backend_options=event_loop_options())
        if not records.exists():
            raise RuntimeError(f"the sidecar wrote no trace; its log: {server.log_path}")
        calls, taken, table = segments(json.loads(records.read_text()))
    print(f"{throughput:.0f} req/s at one session; {taken} of {calls} calls passed the points in this order:")
    print("| from | to | wall µs | CPU µs |")
    print("|---|---|---|---|")
    for row in table:
        print(f"| {row.start} | {row.end} | {row.wall_us:.1f} | {row.cpu_us:.1f} |")
    return 0 if table else 1


async def _one_batch(server: HttpServer, seconds: float) -> float:
    async with session_pool(server.url, 1, WARM_UP_CALLS) as (sessions, _):
        await anyio.to_thread.run_sync(wait_until_quiet, server.pid)
        return (await run_batch(sessions, seconds)).throughput


def weigh(upstream: HttpServer, logs: LogDir, path: str, options: argparse.Namespace) -> int:
    print(f"| point | throughput with {options.us:g} µs spent there | weight |")
    print("|---|---|---|")
    for point in options.points:
        spin = {SPIN_VARIABLE: f"{point}:{options.us}"}
        arms = {THIS: Arm("probe-spin", path, spin), OTHER: Arm("probe-control", path)}
        results = both_orders(upstream, logs, arms, options)
        spun, control = (median(throughputs(results, arm)) for arm in (THIS, OTHER))
        gained = 1 / spun - 1 / control  # seconds a call took longer
        print(f"| {point} | {spun / control:.3f}x | {gained / (options.us / 1e6):.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.critical_path", description=__doc__)
    parser.add_argument("mode", nargs="?", choices=("trace", "weigh"), default="trace")
    parser.add_argument("--src", type=Path, help="run the sidecar from this src directory")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per batch (default 3)")
    parser.add_argument("--us", type=float, default=50.0, help="weigh: µs of CPU spent per pass (default 50)")
    parser.add_argument("--rounds", type=int, default=8, help="weigh: batches per arm (default 8)")
    parser.add_argument(
        "--pairs", type=int, default=2, help="weigh: pairs of sidecars started in turn (default 2)"
    )
    parser.add_argument(
        "--point", dest="points", action="append", choices=list(POINTS), help="weigh: a point (repeatable)"
    )
    options = parser.parse_args(argv)
    options.points = options.points or list(SPIN_POINTS)
    options.sessions = 1
    path = str(SITE) if options.src is None else f"{SITE}:{options.src.resolve()}"
    logs = LogDir()
    with sdk_http_server(logs, "probe-upstream-sdk-http") as upstream:
        ready(upstream)
        run = trace if options.mode == "trace" else weigh
        return run(upstream, logs, path, options)


if __name__ == "__main__":
    sys.exit(main())
