"""A raw stdio JSON-RPC upstream (no MCP SDK) whose `tools/list` comes in two pages.

Run it as `python tests/servers/paged_tools_server.py`. Page one (no cursor) lists `regional`, whose
`region` argument carries `x-mcp-header: Region`, and names the cursor `"page-2"`; page two lists
`echo` and ends the listing. `tools/call` answers `{"called": <name>, "arguments": <arguments>}` as
JSON text; any other request gets an empty result. It exits 0 on stdin EOF.
"""

import json
import sys
from typing import Any

REGIONAL = {
    "name": "regional",
    "inputSchema": {
        "type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "city": {"type": "string"}},
    },
}
ECHO = {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    params = request.get("params") or {}
    if request["method"] == "tools/list":
        if params.get("cursor") == "page-2":
            return {"tools": [ECHO]}
        return {"tools": [REGIONAL], "nextCursor": "page-2"}
    if request["method"] == "tools/call":
        text = json.dumps({"called": params.get("name"), "arguments": params.get("arguments")})
        return {"content": [{"type": "text", "text": text}]}
    return {}


for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
