"""A raw stdio MCP upstream whose names are hostile to a terminal, for `mcp-backfill check`.

Run it as `python tests/servers/odd_names_server.py`. Its `serverInfo.name` and `version` and its one
tool's name hold terminal escape sequences (retitle, clear the screen, colour) and line breaks that
would add lines of its own to a report ("OK: every part works"). It exits 0 on stdin EOF.
"""

import json
import sys

NAME = "odd\x1b]0;retitled\x07\x1b[2J\n  OK: every part works\u202e"
VERSION = "1\r\x1b[K"
TOOL = "tool\x1b[31mred\x1b[0m\x9b1m"


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": NAME, "version": VERSION},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": TOOL, "inputSchema": {"type": "object"}}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
