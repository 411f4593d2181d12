"""`python -m benchmarks.compare_trees OTHER_SRC`: this tree's sidecar against another tree's, 3b-style.

For a change to the sidecar's per-request work, whose effect (a few percent) is smaller than what
separate runs of `scripts/bench` differ by: both sidecars run side by side in front of one SDK
server over streamable HTTP, each with its own client sessions, and their batches alternate (ABBA)
so that both meet the same machine. `OTHER_SRC` is the other tree's `src` directory (e.g. of
`git worktree add /tmp/before <rev>`); it goes first on that sidecar's `PYTHONPATH` (`--this` does
the same for the other arm, which otherwise runs this tree). Prints, per arm, the medians over
batches of throughput, tools/call p50, and the sidecar's and the upstream's CPU time per call.

Half the batches run with this tree's sidecar (and its sessions) started first, half, on a fresh
pair, with the other's: with one order for the whole run, the arm started first did 3-4% more calls
a second than the other when both ran the same tree (the thirty-second round). Which vCPU each
process settles on also holds for a pair's life and moves its arm by as much as a change worth
measuring here (the thirty-fourth round): `--pairs` starts more pairs, the rounds spread over them,
and the ratio of each pair is printed beside the median over all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import anyio

from benchmarks.httpload import Batch, run_batch, session_pool
from benchmarks.httpservers import HttpServer, ready, sdk_http_server, sidecar
from benchmarks.measure import median, percentile, turn_order
from benchmarks.procs import LogDir, cpu_seconds, wait_until_quiet
from mcp_backfill.cli import event_loop_options

THIS, OTHER = "this tree", "other tree"


Measured = dict[str, list[tuple[Batch, float, float]]]  # per arm: batch, CPU s per call: sidecar, upstream
Results = dict[str, list[tuple[Batch, float, float, int]]]  # the same, and the pair it ran on


@dataclass(frozen=True)
class Arm:
    """One arm's sidecar: its log name, and `sidecar()`'s `source` and `env`."""

    name: str
    source: str | None = None
    env: Mapping[str, str] | None = None


def both_orders(
    upstream: HttpServer, logs: LogDir, arms: dict[str, Arm], options: argparse.Namespace
) -> Results:
    """Every arm's batches (`options.rounds` each, taking turns), from `options.pairs` pairs of
    sidecars in front of `upstream`, one pair after another, started in the order of `arms` and the
    other by turns; the rounds are spread over the pairs."""
    results: Results = {arm: [] for arm in arms}
    pairs = max(options.pairs, 1)
    for pair in range(pairs):
        order = list(arms) if pair % 2 == 0 else list(arms)[::-1]
        with ExitStack() as started:
            servers = {
                arm: started.enter_context(
                    sidecar(
                        logs,
                        f"{arms[arm].name}-{pair}",
                        "--upstream-url",
                        upstream.url,
                        source=arms[arm].source,
                        env=arms[arm].env,
                    )
                )
                for arm in order
            }
            ready(*servers.values())
            urls = {arm: server.url for arm, server in servers.items()}
            pids = {arm: server.pid for arm, server in servers.items()}
            rounds = max(options.rounds // pairs + (pair < options.rounds % pairs), 1)
            measured = anyio.run(
                _compare, urls, pids, upstream.pid, rounds, options, backend_options=event_loop_options()
            )
        for arm, rows in measured.items():
            results[arm].extend((*row, pair) for row in rows)
    return results


def throughputs(results: Results, arm: str, pair: int | None = None) -> list[float]:
    """An arm's batches' throughputs (of one pair, if given)."""
    return [batch.throughput for batch, _, _, on in results[arm] if pair is None or on == pair]


async def _compare(
    urls: dict[str, str], pids: dict[str, int], upstream: int, rounds: int, options: argparse.Namespace
) -> Measured:
    """Every arm's batches, taking turns (`urls` in the order their sidecars were started)."""
    results: Measured = {arm: [] for arm in urls}
    first, second = urls
    async with (
        session_pool(urls[first], options.sessions, 20) as (opened_first, _),
        session_pool(urls[second], options.sessions, 20) as (opened_second, _),
    ):
        pools = {first: opened_first, second: opened_second}
        for pid in pids.values():  # the warm-up each sidecar's first session started
            await anyio.to_thread.run_sync(wait_until_quiet, pid)
        for index in range(rounds):
            for arm in turn_order(index, [OTHER, THIS]):
                before = cpu_seconds(pids[arm]), cpu_seconds(upstream)
                batch = await run_batch(pools[arm], options.seconds)
                calls = max(batch.calls, 1)
                sidecar_cpu = (cpu_seconds(pids[arm]) - before[0]) / calls
                results[arm].append((batch, sidecar_cpu, (cpu_seconds(upstream) - before[1]) / calls))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_trees", description=__doc__)
    parser.add_argument("other_src", type=Path, help="the other tree's src directory")
    parser.add_argument("--this", type=Path, help="run 'this tree' from this src directory instead")
    parser.add_argument("--sessions", type=int, default=1, help="client sessions per arm (default 1)")
    parser.add_argument("--rounds", type=int, default=6, help="batches per arm (default 6)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per batch (default 2)")
    parser.add_argument("--pairs", type=int, default=2, help="pairs of sidecars started in turn (default 2)")
    options = parser.parse_args(argv)
    for source in (options.other_src, options.this):
        if source is not None and not (source / "mcp_backfill").is_dir():
            parser.error(f"{source} holds no mcp_backfill package")
    logs = LogDir()
    arms = {
        THIS: Arm("compare-this", options.this and str(options.this.resolve())),
        OTHER: Arm("compare-other", str(options.other_src.resolve())),
    }
    with sdk_http_server(logs, "compare-upstream-sdk-http") as upstream:
        ready(upstream)
        results = both_orders(upstream, logs, arms, options)
    throughput = {arm: median(throughputs(results, arm)) for arm in results}
    for arm, rows in results.items():
        p50 = median([percentile(batch.latencies, 50) * 1e3 for batch, _, _, _ in rows])
        sidecar_cpu = median([cpu * 1e6 for _, cpu, _, _ in rows])
        upstream_cpu = median([cpu * 1e6 for _, _, cpu, _ in rows])
        print(
            f"{arm:10}  {throughput[arm]:7.0f} req/s  p50 {p50:.3f} ms  CPU per call: "
            f"sidecar {sidecar_cpu:.0f} µs, upstream {upstream_cpu:.0f} µs"
        )
    each = [
        median(throughputs(results, THIS, pair)) / median(throughputs(results, OTHER, pair))
        for pair in sorted({row[3] for row in results[THIS]})
    ]
    print("each pair: " + ", ".join(f"{ratio:.3f}x" for ratio in each))
    print(f"this tree / other tree, throughput: {throughput[THIS] / throughput[OTHER]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
