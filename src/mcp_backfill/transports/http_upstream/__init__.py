"""A streamable-HTTP MCP server as the relay's upstream, split by protocol era.

`channel` is the `MessageChannel` the relay talks to; it hands each message to a leg: `handshake`
(the session an `initialize` opens) or `stateless` (2026-07-28 routing headers). `exchange` reads a
POST's answer, `sse` decodes event streams, `headers` derives the stateless routing headers, and
`settings` says how to reach the upstream.
"""

from mcp_backfill.transports.http_upstream.channel import HttpUpstream, open_http_upstream
from mcp_backfill.transports.http_upstream.settings import (
    HttpUpstreamSettings,
    display_url,
    make_http_client,
    tls_context,
)

__all__ = [
    "HttpUpstream",
    "HttpUpstreamSettings",
    "display_url",
    "make_http_client",
    "open_http_upstream",
    "tls_context",
]
