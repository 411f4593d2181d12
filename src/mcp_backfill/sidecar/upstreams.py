"""Where a client session's upstream comes from: an async context manager per use.

The sidecar opens one upstream per handshake-era client session and one shared upstream for all
2026-07-28 requests; it neither knows nor cares what the upstream is. Entering the context starts
the upstream and yields its `MessageChannel`; leaving it stops the upstream (for a child process:
stdin closed, then SIGTERM, then SIGKILL; for an HTTP upstream: its session DELETEd).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from mcp_backfill.assembly import http_upstream_settings, spawn_child
from mcp_backfill.config import Config
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_upstream import (
    display_url,
    make_http_client,
    open_http_upstream,
    tls_context,
)

UPSTREAM_START_FAILED = "Upstream MCP server could not be started; the sidecar's log says why"
"""What a client is told when its session's upstream cannot be started: the reason (the command's
path, what the system said, the sidecar's PATH) is for the operator, in the log."""

log = get_logger("sidecar")


@dataclass(frozen=True)
class UpstreamRequest:
    """What the sidecar knows when it opens an upstream."""

    # "session <id>" or "2026-07-28 requests": for log lines.
    label: str
    # Headers of the HTTP request that caused the opening (lowercase names); the sidecar's own
    # credentials (its bearer token) are already removed.
    client_headers: Mapping[str, str] = field(default_factory=dict)


UpstreamFactory = Callable[[UpstreamRequest], AbstractAsyncContextManager[MessageChannel]]


def child_process_upstreams(config: Config) -> UpstreamFactory:
    """Each use starts `config.upstream_command` as a new child process."""

    @asynccontextmanager
    async def open_child(request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
        async with spawn_child(config) as child:
            log.info("upstream process started", extra={"for": request.label, "pid": child.pid})
            try:
                yield child.channel
            finally:
                log.info("stopping upstream process", extra={"for": request.label, "pid": child.pid})

    return open_child


def http_upstreams(config: Config) -> UpstreamFactory:
    """Each use opens a new session with the streamable-HTTP server at `config.upstream_url`."""
    assert config.upstream_url is not None
    url = config.upstream_url
    # Each session keeps a client of its own (its cookies, e.g. a load balancer's affinity, must not
    # leak to other sessions), but they all share one certificate-checking context: building one
    # per client cost 25 ms of CPU and 0.8 MB of memory per session.
    tls = tls_context()
    # The environment's proxy variables are read as each client is built: one httpx2 cannot use
    # stops the start with its `ConfigError` (each session failed with an internal error).
    make_http_client(http_upstream_settings(config), tls)

    @asynccontextmanager
    async def open_http(request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
        authorization = request.client_headers.get("authorization")
        forwarded = (
            (("Authorization", authorization),) if config.forward_authorization and authorization else ()
        )
        async with open_http_upstream(http_upstream_settings(config, forwarded), tls=tls) as upstream:
            log.info(
                "upstream session opened", extra={"for": request.label, "upstream_url": display_url(url)}
            )
            yield upstream

    return open_http
