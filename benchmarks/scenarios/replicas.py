"""7. More than one replica: what a shared state store costs, and what replicas behind HAProxy buy.

7a. Sampling overhead by store: three proxies (stdio front, raw echo upstream, the lean fake API),
    alike but for `--state-store`: memory (the "direct" arm), a SQLite file, and a local
    `redis-server`. Each has a process budget and a rate limit, so every sampling call does the
    store's whole work (check, rate admission, reservation, settlement). Batches take turns. The
    Redis arm also reports the store load per sampling call (`INFO commandstats`: commands and the
    server's own microseconds), the figure that says how far one Redis goes.
7b. Throughput of 1 and of 3 `mcp-backfill serve` replicas behind HAProxy (deploy/haproxy/haproxy.cfg
    as shipped), handshake sessions calling `echo` through a stdio raw echo upstream: what spreading
    over processes buys on this machine, where the load generator, HAProxy and the upstreams share
    the same cores.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import Any

import anyio
import redis
from tests.services import binary

from benchmarks.httpload import Batch, run_batch, session_pool
from benchmarks.httpservers import HttpServer, free_port, ready, sidecar
from benchmarks.measure import DIRECT, PROXIED, alternate, median, percentile, turn_order
from benchmarks.procs import PYTHON, ROOT, LogDir, bench_env, proxy_command, raw_echo_command, started
from benchmarks.rawclient import RawClient, check_answers
from benchmarks.report import Row, Target
from benchmarks.scenarios import RunContext
from benchmarks.scenarios.sampling import sample_lines, sampling_seconds

REDIS_TARGET = Target("added_max", 1.0, "added ≤ 1 ms")
# Limits that never bind but make every call do the store's whole work.
LIMITS = ("--budget-tokens", "1000000000", "--rate-limit", "1000000", "--max-concurrent-sampling", "1000")
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
SQLITE, REDIS = "sqlite", "redis"


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{process.args!r} does not listen on {port}") from None
            time.sleep(0.05)


@contextmanager
def redis_server(logs: LogDir, directory: str) -> Iterator[str]:
    port = free_port()
    argv = [binary("redis-server", "redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    with started([*argv, "--appendonly", "no", "--dir", directory], logs, "7-redis") as process:
        _wait_for_port(port, process)
        yield f"redis://127.0.0.1:{port}/0"


def redis_load(url: str) -> dict[str, float]:
    """Scripts run (`EVALSHA`: one round trip each) and the server's microseconds in them (the
    commands inside a script included), from `INFO commandstats`."""
    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    scripts = stats.get("cmdstat_evalsha", {})
    return {"calls": float(scripts.get("calls", 0)), "usec": float(scripts.get("usec", 0))}


def measure_stores(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    with ExitStack() as stack:
        directory = stack.enter_context(_tempdir())
        fake = stack.enter_context(
            started([PYTHON, "-m", "benchmarks.fake_api", "--delay", "0"], ctx.logs, "7-fake")
        )
        assert fake.stdout is not None
        api = f"http://127.0.0.1:{int(fake.stdout.readline())}"
        redis_url = stack.enter_context(redis_server(ctx.logs, directory))
        stores = {DIRECT: "memory", SQLITE: f"sqlite://{directory}/ledger.db", REDIS: redis_url}
        clients: dict[str, RawClient] = {}
        for arm, store in stores.items():
            command = proxy_command(
                raw_echo_command(), "--provider", "anthropic", *LIMITS, "--state-store", store
            )
            process = stack.enter_context(started(command, ctx.logs, f"7-proxy-{arm}", env=bench_env(api)))
            clients[arm] = RawClient(process)
            clients[arm].initialize()
        warmup = sample_lines(min(s.warmup, 20))
        for client in clients.values():
            client.round_trips(warmup)
        lines = sample_lines(s.sampling_calls)
        load: dict[str, float] = {"calls": 0.0, "usec": 0.0, "sampling": 0.0}

        def batch(arm: str) -> Sequence[float]:
            before = redis_load(redis_url) if arm == REDIS else None
            _, answers = clients[arm].round_trips(lines)
            check_answers(answers, lines)
            if before is not None:
                after = redis_load(redis_url)
                load["calls"] += after["calls"] - before["calls"]
                load["usec"] += after["usec"] - before["usec"]
                load["sampling"] += len(lines)
            return [sampling_seconds(answer) * 1e3 for answer in answers]

        ctx.progress("sequential sampling requests: memory, SQLite and Redis stores")
        samples = alternate(s.rounds, batch, [DIRECT, SQLITE, REDIS])
    memory = samples.by_arm[DIRECT]
    detail = {"samples_per_arm": len(memory)}
    per_call = {
        "store_scripts_per_sampling_call": load["calls"] / max(1.0, load["sampling"]),
        "redis_usec_per_sampling_call": load["usec"] / max(1.0, load["sampling"]),
    }
    rows = [
        Row(
            "7",
            "sampling call p50, Redis store (direct: memory store)",
            "ms",
            median(memory),
            median(samples.by_arm[REDIS]),
            REDIS_TARGET,
            {**detail, **per_call},
        ),
        Row(
            "7",
            "sampling call p99, Redis store",
            "ms",
            percentile(memory, 99),
            percentile(samples.by_arm[REDIS], 99),
            detail=detail,
        ),
        Row(
            "7",
            "sampling call p50, SQLite store (direct: memory store)",
            "ms",
            median(memory),
            median(samples.by_arm[SQLITE]),
            detail=detail,
        ),
        Row(
            "7",
            "Redis server time per sampling call (scripts per call in the detail)",
            "µs",
            None,
            per_call["redis_usec_per_sampling_call"],
            detail=per_call,
        ),
    ]
    return rows


@contextmanager
def _tempdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="mcp-backfill-bench-") as directory:
        yield directory


@contextmanager
def haproxy(logs: LogDir, name: str, replicas: Sequence[int]) -> Iterator[str]:
    """HAProxy with the shipped config in front of `replicas` (ports; repeated to fill its 3 slots)."""
    port = free_port()
    chosen = [replicas[n % len(replicas)] for n in range(3)]
    env = {
        **bench_env(),
        "MCP_FRONT": f"127.0.0.1:{port}",
        "MCP_HOST": f"127.0.0.1:{port}",
        **{f"REPLICA_{n}": f"127.0.0.1:{each}" for n, each in enumerate(chosen, 1)},
    }
    with started(
        [binary("haproxy", "haproxy"), "-db", "-f", str(HAPROXY_CONFIG)], logs, name, env=env
    ) as process:
        _wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"


def measure_replicas(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    sessions = max(s.http_sessions[:2])  # 8: enough to keep three replicas busy without 64 upstreams
    ports = [free_port() for _ in range(4)]
    fronts: dict[str, str] = {}
    with ExitStack() as stack:
        servers: list[HttpServer] = [
            stack.enter_context(
                sidecar(
                    ctx.logs,
                    f"7-replica-{n}",
                    "--port",
                    str(port),
                    "--allowed-hosts",
                    "127.0.0.1:*",  # their own port and HAProxy's
                    upstream=raw_echo_command(),
                )
            )
            for n, port in enumerate(ports)
        ]
        ready(*servers)
        fronts[DIRECT] = stack.enter_context(haproxy(ctx.logs, "7-haproxy-1", ports[:1]))
        fronts[PROXIED] = stack.enter_context(haproxy(ctx.logs, "7-haproxy-3", ports[1:]))
        ctx.progress(f"1 vs 3 replicas behind HAProxy, {sessions} sessions")
        results = anyio.run(_throughput, ctx, fronts, sessions)
    throughput = {arm: [batch.throughput for batch in batches] for arm, batches in results.items()}
    latency = {
        arm: [x * 1e3 for batch in batches for x in batch.latencies] for arm, batches in results.items()
    }
    detail = {"sessions": sessions, "rounds": len(throughput[DIRECT]), "cpus": os.cpu_count()}
    return [
        Row(
            "7",
            f"throughput behind HAProxy, {sessions} sessions: 3 replicas (direct: 1 replica)",
            "calls/s",
            median(throughput[DIRECT]),
            median(throughput[PROXIED]),
            detail=detail,
        ),
        Row(
            "7",
            f"call p50 behind HAProxy, {sessions} sessions: 3 replicas (direct: 1 replica)",
            "ms",
            median(latency[DIRECT]),
            median(latency[PROXIED]),
            detail=detail,
        ),
    ]


async def _throughput(ctx: RunContext, fronts: dict[str, str], sessions: int) -> dict[str, list[Batch]]:
    s = ctx.settings
    results: dict[str, list[Batch]] = {arm: [] for arm in fronts}
    pools = {}
    async with AsyncExitStack() as stack:
        for arm, url in fronts.items():
            pools[arm], _ = await stack.enter_async_context(session_pool(url, sessions, s.http_warmup))
        for index in range(s.http_rounds):
            for arm in turn_order(index, list(fronts)):
                results[arm].append(await run_batch(pools[arm], s.http_batch_seconds))
    return results


def run(ctx: RunContext) -> list[Row]:
    return measure_stores(ctx) + measure_replicas(ctx)
