"""How much work each scenario does: the full run, and `--quick` (a smoke run of the same rows)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

MB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int
    """Alternation rounds: each arm runs one batch per round, turns taken ABBA."""
    warmup: int
    """Untimed requests per arm before the first round (imports, caches, connections)."""
    raw_round_trips: int
    """Sequential raw-echo round trips per batch."""
    sdk_calls: int
    """Sequential SDK `call_tool`s per batch."""
    throughput_requests: int
    """Requests per throughput batch (each at 1 and at 16 in flight)."""
    windows: tuple[int, ...]
    payload_sizes: tuple[int, ...]
    payload_calls: int
    """Calls per batch, per payload size."""
    sampling_calls: int
    """Sequential sampling requests per batch."""
    concurrent_sampling: int
    concurrent_delay: float
    concurrent_rounds: int
    startup_repeats: int
    """Process starts per arm and upstream, for startup time and idle RSS."""
    http_sessions: tuple[int, ...]
    """Concurrent client sessions in the HTTP throughput batches (the largest is every pool's size)."""
    http_rounds: int
    http_batch_seconds: float
    http_warmup: int
    """Untimed calls per HTTP session right after it opens."""
    http_stdio_upstream: Literal["sdk", "raw-echo"]
    """The stdio upstream of 3a. The smoke run uses the raw echo server: 64 SDK servers take half a
    minute of CPU just to start, and the smoke run checks the rows, not the figures."""
    idle_http_sessions: int
    """Sessions held open (and idle) for the sidecar's RSS with many sessions."""
    stateless_clients: int
    """Concurrent 2026-07-28 clients on one sidecar (8), each on its own keep-alive connection."""
    stateless_warmup: int
    """Untimed calls per 2026-07-28 client before its timed ones (the lone client's too)."""
    stateless_calls: int
    """Timed sequential calls per client, once all the clients are connected."""
    stateless_solo_calls: int
    """Timed sequential calls of the lone client measured first (the direct column)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


FULL = Settings(
    quick=False,
    rounds=10,
    warmup=200,
    raw_round_trips=1000,
    sdk_calls=200,
    throughput_requests=1000,
    windows=(1, 16),
    payload_sizes=(1 * MB, 10 * MB),
    payload_calls=5,
    sampling_calls=50,
    concurrent_sampling=100,
    concurrent_delay=0.5,
    concurrent_rounds=3,
    startup_repeats=5,
    http_sessions=(1, 8, 64),
    http_rounds=4,
    http_batch_seconds=1.0,
    http_warmup=5,
    http_stdio_upstream="sdk",
    idle_http_sessions=100,
    stateless_clients=1000,
    stateless_warmup=2,
    stateless_calls=20,
    stateless_solo_calls=1000,
)

QUICK = Settings(
    quick=True,
    rounds=2,
    warmup=5,
    raw_round_trips=20,
    sdk_calls=5,
    throughput_requests=32,
    windows=(1, 16),
    payload_sizes=(1 * MB, 10 * MB),
    payload_calls=1,
    sampling_calls=3,
    concurrent_sampling=100,
    concurrent_delay=0.5,
    concurrent_rounds=1,
    startup_repeats=1,
    http_sessions=(1, 8, 64),
    http_rounds=1,
    http_batch_seconds=0.3,
    http_warmup=2,
    http_stdio_upstream="raw-echo",
    idle_http_sessions=100,
    stateless_clients=1000,
    stateless_warmup=1,
    stateless_calls=2,
    stateless_solo_calls=20,
)
