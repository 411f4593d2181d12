"""The protocol-aware relay: one client session <-> one upstream session, with the sampling backfill.

`relay` routes and intercepts messages (ids both ways, capability backfill, sampling answered by the
proxy), `rounds` drives 2026-07-28 `input_required` rounds for the client, `capabilities` decides
who answers a sampling request, `input_required` holds the pure round logic and `progress` the
progress notifications sent while Claude streams.
"""

from mcp_backfill.relay.relay import Relay, UpstreamAtOnce
from mcp_backfill.relay.state import RelayOptions

__all__ = ["Relay", "RelayOptions", "UpstreamAtOnce"]
