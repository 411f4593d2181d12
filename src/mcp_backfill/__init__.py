"""mcp-backfill: answer MCP sampling requests against Claude for clients that cannot."""

__version__ = "0.1.0"
