"""The scenarios, in the issue's numbering; each measures the direct connection and the proxied one.

A scenario is a function from a `RunContext` to result rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.procs import LogDir
from benchmarks.report import Row
from benchmarks.settings import Settings


@dataclass(frozen=True)
class RunContext:
    settings: Settings
    logs: LogDir
    progress: Callable[[str], None]


@dataclass(frozen=True)
class Scenario:
    key: str
    number: str
    title: str
    run: Callable[[RunContext], list[Row]]


def all_scenarios() -> list[Scenario]:
    from benchmarks.scenarios import (
        adversarial,
        footprint,
        footprint_http,
        http_front,
        passthrough_raw,
        passthrough_sdk,
        payloads,
        replicas,
        sampling,
        stateless_clients,
    )

    return [
        Scenario("stdio-raw", "1a", "pass-through latency, raw echo upstream", passthrough_raw.run),
        Scenario("stdio-sdk", "1b", "pass-through latency, mcp SDK upstream and client", passthrough_sdk.run),
        Scenario("payloads", "2", "large tool results", payloads.run),
        Scenario(
            "http-stdio", "3a", "HTTP front, stdio upstream: the sidecar vs mcp-proxy", http_front.run_stdio
        ),
        Scenario(
            "http-upstream", "3b", "HTTP front, HTTP upstream: the sidecar vs direct", http_front.run_http
        ),
        Scenario("sampling", "4", "sampling path against a fake Messages API", sampling.run),
        Scenario("footprint", "5", "startup time and idle memory", footprint.run),
        Scenario("footprint-http", "5", "sidecar memory with idle HTTP sessions", footprint_http.run),
        Scenario(
            "adversarial", "6", "hostile clients and upstream beside a well-behaved client", adversarial.run
        ),
        Scenario("replicas", "7", "a shared state store, and replicas behind HAProxy", replicas.run),
        Scenario(
            "stateless-1000", "8", "1,000 concurrent 2026-07-28 clients on one sidecar", stateless_clients.run
        ),
    ]
