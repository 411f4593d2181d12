"""`mcp-backfill serve`: the streamable-HTTP front (sessions, 2026-07-28 requests, security, metrics)."""
