"""MCPServer (stdio) for the sidecar's tests: tools that talk while they work, and process control.

Run it as `python tests/servers/chatty_server.py [MARKER_DIR]`. With MARKER_DIR, the process writes
`MARKER_DIR/started-<pid>` when it starts, so tests can count the upstream processes spawned. With
`--http 127.0.0.1:0` instead, it serves streamable HTTP at /mcp (see tests/servers/http_serving.py).

* `chatter(tag, count=3, delay=0.05)`: sends `count` progress notifications (message `"<tag> <i>"`)
  and `count` info log messages (data `"<tag> log <i>"`), `delay` seconds apart, then returns
  `{"tag": tag, "pid": <pid>}`. Progress needs the caller's progress token; logs on 2026-07-28 need
  the caller's log level opt-in.
* `pid()`: returns `{"pid": <pid>}`.
* `sleep(seconds, note="")`: sleeps, then returns `{"slept": seconds}`. With a MARKER_DIR it writes
  `MARKER_DIR/sleeping-<note>` when it starts, and `MARKER_DIR/cancelled-<note>` if cancelled.
* `crash(code=3)`: exits the process at once with `code`, without answering.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

server = MCPServer("chatty-test-server")
HTTP = len(sys.argv) == 3 and sys.argv[1] == "--http"
MARKER_DIR = Path(sys.argv[1]) if len(sys.argv) > 1 and not HTTP else None


@server.tool()
async def chatter(tag: str, ctx: Context, count: int = 3, delay: float = 0.05) -> str:
    """Progress and log messages tagged with `tag`, then the tag back."""
    for i in range(count):
        await ctx.report_progress(i + 1, count, message=f"{tag} {i}")
        await ctx.log("info", f"{tag} log {i}")
        await anyio.sleep(delay)
    return json.dumps({"tag": tag, "pid": os.getpid()})


@server.tool()
async def pid() -> str:
    """This process's id."""
    return json.dumps({"pid": os.getpid()})


@server.tool()
async def sleep(seconds: float, note: str = "") -> str:
    """Take `seconds` to answer; leave markers when starting and when cancelled."""
    if MARKER_DIR is not None:
        (MARKER_DIR / f"sleeping-{note}").touch()
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if MARKER_DIR is not None:
            (MARKER_DIR / f"cancelled-{note}").touch()
        raise
    return json.dumps({"slept": seconds})


@server.tool()
async def crash(code: int = 3) -> str:
    """Exit the process without answering."""
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    if HTTP:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.servers.http_serving import serve_http

        serve_http(server, sys.argv[2])
    else:
        if MARKER_DIR is not None:
            (MARKER_DIR / f"started-{os.getpid()}").touch()
        server.run()
