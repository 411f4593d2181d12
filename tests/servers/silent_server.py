"""A stdio "server" that reads its input and never answers (a command that is no MCP server, or one
stuck starting), for `mcp-backfill check`. It exits 0 on stdin EOF."""

import sys

for _ in sys.stdin:
    pass
