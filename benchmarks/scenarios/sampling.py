"""4. The sampling path: the proxy answering a real server's sampling requests via the anthropic SDK.

The proxy runs with `--provider anthropic` against the lean fake Messages API
(benchmarks/fake_api.py) in front of the SDK server, whose `sample` tool sends one handshake-era
`sampling/createMessage` and reports how long the answer took as the server saw it. The direct arm
is the same Claude request sent straight to the same fake by the same SDK client configuration
(benchmarks/direct_sampler.py), through the SDK's stream helper as a sampling client would: the
fake's own time. The difference is what the proxy adds per sampling request: two relay hops,
validation and conversion both ways, and its SDK call (which reads the answer's events as JSON,
lighter than the helper: see the benchmarks README).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from benchmarks.measure import ARMS, DIRECT, PROXIED, alternate, median
from benchmarks.procs import PYTHON, bench_env, proxy_command, raw_echo_command, sdk_server_command, started
from benchmarks.rawclient import RawClient, check_answers, tool_call_line
from benchmarks.report import Row, Target, latency_rows
from benchmarks.scenarios import RunContext

OVERHEAD_TARGET = Target("added_max", 1.0, "added ≤ 1 ms")
# The proxy's spending limits off: this scenario measures its machinery, not its limits. With the
# defaults (600 requests a minute, 4 Claude calls at once) the 100 concurrent calls would queue
# 4 at a time (12.5 s for 500 ms calls), and a full run's 500-odd requests would near the rate limit.
UNLIMITED = ("--rate-limit", "0", "--max-concurrent-sampling", "1000")
CONCURRENT_TARGET = Target("proxied_max", 1.5, "≤ 1.5 s")
# The first sampling answer of a fresh stdio proxy, against a warm one, when the request comes this
# long after the spawn (the Claude client has had time to be built in the background).
COLD_DELAY = 3.0
COLD_LATE_TARGET = Target("ratio_max", 1.2, "≤ 1.2x a warm answer")
COLD_AT_ONCE_TARGET = Target("ratio_max", 1.0, "no slower than --no-warm-up")
WARM_ANSWERS = 5
# A third arm of the sequential rows with the raw echo upstream: the fake through the proxy's own
# way of reading an answer (the SDK's `post` and `MessageFold`), lighter than the stream helper of
# the direct arm, so that the proxy's cost apart from that difference is on record too.
LEAN = "lean"
IDLE_REPEATS = 2


class DirectSampler:
    """Drives a benchmarks.direct_sampler process."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout

    def run(self, count: int, concurrency: int, *, lean: bool = False) -> dict[str, Any]:
        command = {"count": count, "concurrency": concurrency, "lean": lean}
        self._stdin.write(json.dumps(command).encode() + b"\n")
        line = self._stdout.readline()
        if not line:
            raise RuntimeError("the direct sampler exited")
        answer: dict[str, Any] = json.loads(line)
        return answer


@contextmanager
def sampling_setup(
    ctx: RunContext, delay: float, tag: str, upstream: Sequence[str]
) -> Iterator[tuple[DirectSampler, RawClient]]:
    """The fake API, the direct sampler and the proxied upstream, all pointed at the same fake."""
    with ExitStack() as stack:
        fake = stack.enter_context(
            started([PYTHON, "-m", "benchmarks.fake_api", "--delay", str(delay)], ctx.logs, f"4-fake-{tag}")
        )
        assert fake.stdout is not None
        port = int(fake.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        direct = stack.enter_context(
            started(
                [PYTHON, "-m", "benchmarks.direct_sampler", "--base-url", url], ctx.logs, f"4-direct-{tag}"
            )
        )
        proxy = stack.enter_context(
            started(
                proxy_command(upstream, "--provider", "anthropic", *UNLIMITED),
                ctx.logs,
                f"4-proxy-{tag}",
                env=bench_env(url),
            )
        )
        client = RawClient(proxy)
        client.initialize()
        yield DirectSampler(direct), client


def sample_lines(count: int, first_id: int = 1000) -> list[bytes]:
    return [tool_call_line(first_id + n, "sample", {}) for n in range(count)]


def sampling_seconds(answer: bytes) -> float:
    """The sampling time the server measured, from its tool result."""
    result = json.loads(answer)["result"]
    if result.get("isError"):
        raise RuntimeError(f"sample failed: {result['content']}")
    elapsed: float = json.loads(result["content"][0]["text"])["elapsed"]
    return elapsed


def measure_overhead(ctx: RunContext, raw_upstream: bool) -> list[Row]:
    """Sequential sampling requests from the raw echo server (the proxy's own cost: nothing else
    between the request and the fake) or from the SDK server (what an SDK server sees)."""
    s = ctx.settings
    upstream = raw_echo_command() if raw_upstream else sdk_server_command()
    tag = "raw" if raw_upstream else "sdk"
    with sampling_setup(ctx, 0.0, f"instant-{tag}", upstream) as (direct, client):
        warmup = min(s.warmup, 20)
        direct.run(warmup, 1)
        direct.run(warmup, 1, lean=True)
        client.round_trips(sample_lines(warmup))
        lines = sample_lines(s.sampling_calls)

        def batch(arm: str) -> Sequence[float]:
            if arm != PROXIED:
                return [t * 1e3 for t in direct.run(len(lines), 1, lean=arm == LEAN)["times"]]
            _, answers = client.round_trips(lines)
            check_answers(answers, lines)
            return [sampling_seconds(answer) * 1e3 for answer in answers]

        ctx.progress(f"sequential sampling requests, {tag} upstream")
        samples = alternate(s.rounds, batch, (DIRECT, PROXIED, LEAN) if raw_upstream else ARMS)
    who = "raw echo upstream (the proxy's own cost)" if raw_upstream else "SDK server upstream"
    rows = latency_rows(
        "4",
        f"sampling request p50, {who} (direct: the fake alone)",
        f"sampling request p99, {who}",
        "ms",
        samples,
        OVERHEAD_TARGET if raw_upstream else None,
    )
    if raw_upstream:
        rows.append(
            Row(
                "4",
                f"sampling request p50, {who} (direct: the fake alone, read as the proxy reads it)",
                "ms",
                median(samples.by_arm[LEAN]),
                median(samples.proxied),
                detail={"samples_per_arm": len(samples.by_arm[LEAN])},
            )
        )
    return rows


def measure_concurrency(ctx: RunContext) -> list[Row]:
    s = ctx.settings
    count = s.concurrent_sampling
    with sampling_setup(ctx, s.concurrent_delay, "slow", sdk_server_command()) as (direct, client):
        direct.run(1, 1)
        client.round_trips(sample_lines(1))
        lines = sample_lines(count)

        def batch(arm: str) -> Sequence[float]:
            if arm == DIRECT:
                return [float(direct.run(count, count)["wall"])]
            wall, answers = client.pipelined(lines, count)
            check_answers(answers, lines)
            return [wall]

        ctx.progress(f"{count} concurrent sampling requests")
        samples = alternate(s.concurrent_rounds, batch)
    return [
        Row(
            "4",
            f"{count} concurrent sampling calls, {s.concurrent_delay * 1000:.0f} ms each: wall",
            "s",
            median(samples.direct),
            median(samples.proxied),
            CONCURRENT_TARGET,
            {"rounds": len(samples.direct)},
        )
    ]


def _first_answers(ctx: RunContext, api_url: str, *options: str, delay: float) -> tuple[float, float]:
    """A fresh proxy (raw echo upstream): its first sampling answer, asked for `delay` seconds after
    the spawn (or right after the handshake if that came later); and, once it has answered a few
    more, the median of `IDLE_REPEATS` answers each asked for after the same `delay` of idleness.
    Milliseconds, as the upstream saw them. The second figure is the fair "warm" one: after seconds
    of idleness every process involved (the upstream, the proxy, the fake API) answers a request
    1-3 ms slower than back to back, warm-up or not."""
    spawned = time.perf_counter()
    argv = proxy_command(raw_echo_command(), "--provider", "anthropic", *UNLIMITED, *options)
    with started(argv, ctx.logs, "4-cold-proxy", env=bench_env(api_url)) as proxy:
        client = RawClient(proxy)
        client.initialize()
        time.sleep(max(0.0, spawned + delay - time.perf_counter()))
        lines = sample_lines(1 + WARM_ANSWERS)
        _, answers = client.round_trips(lines)
        check_answers(answers, lines)
        idle: list[float] = []
        for repeat in range(IDLE_REPEATS if delay else 0):
            time.sleep(delay)
            line = sample_lines(1, 2000 + repeat)
            _, again = client.round_trips(line)
            check_answers(again, line)
            idle.append(sampling_seconds(again[0]) * 1e3)
    return sampling_seconds(answers[0]) * 1e3, median(idle) if idle else float("nan")


def _rounded(milliseconds: Iterable[float]) -> list[float]:
    return [round(value, 2) for value in milliseconds]


def measure_cold_start(ctx: RunContext) -> list[Row]:
    """The first sampling answer of a new stdio session (each a new process, as clients start them):
    3 s after the spawn against a warm answer of the same process after 3 s of idleness; and at
    once, right after the handshake, against a proxy that builds the Claude client only then
    (`--no-warm-up`)."""
    s = ctx.settings
    with started([PYTHON, "-m", "benchmarks.fake_api"], ctx.logs, "4-cold-fake") as fake:
        assert fake.stdout is not None
        url = f"http://127.0.0.1:{int(fake.stdout.readline())}"
        ctx.progress(f"first sampling answer {COLD_DELAY:.0f} s after start")
        late = [_first_answers(ctx, url, delay=COLD_DELAY) for _ in range(s.startup_repeats)]
        ctx.progress("first sampling answer right after the handshake")

        def at_once(arm: str) -> Sequence[float]:
            options = ("--no-warm-up",) if arm == DIRECT else ()
            return [_first_answers(ctx, url, *options, delay=0.0)[0]]

        immediate = alternate(s.startup_repeats, at_once)
    detail = {
        "processes": len(late),
        "warm_answers_after_idle_each": IDLE_REPEATS,
        "first_ms": _rounded(first for first, _ in late),
        "warm_after_idle_ms": _rounded(warm for _, warm in late),
    }
    return [
        Row(
            "4",
            f"cold first sampling answer, {COLD_DELAY:.0f} s after start (direct: warm, as long idle)",
            "ms",
            median([warm for _, warm in late]),
            median([first for first, _ in late]),
            COLD_LATE_TARGET,
            detail,
        ),
        Row(
            "4",
            "cold first sampling answer, right after the handshake (direct: --no-warm-up)",
            "ms",
            median(immediate.direct),
            median(immediate.proxied),
            COLD_AT_ONCE_TARGET,
            {
                "processes_per_arm": len(immediate.direct),
                "first_ms": {DIRECT: _rounded(immediate.direct), PROXIED: _rounded(immediate.proxied)},
            },
        ),
    ]


def run(ctx: RunContext) -> list[Row]:
    return (
        measure_overhead(ctx, raw_upstream=True)
        + measure_overhead(ctx, raw_upstream=False)
        + measure_concurrency(ctx)
        + measure_cold_start(ctx)
    )
