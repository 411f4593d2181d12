"""A real mcp SDK upstream (MCPServer over stdio) with trivial tools, for the SDK-level scenarios.

Tools:

* `echo(text)`: returns the text (the cheapest tool the SDK can serve).
* `sample(prompt, max_tokens, with_tools)`: one handshake-era `sampling/createMessage` related to the
  running call (offering one tool unless `with_tools` is false). Returns JSON
  `{"elapsed": seconds the sampling request took as this server saw it, "model": ...}`: the time
  from sending the request to holding the validated result, which is what the proxy adds to.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import warnings

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import SamplingMessage, TextContent, Tool, ToolChoice

warnings.filterwarnings(
    "ignore", message="The sampling capability is deprecated", category=MCPDeprecationWarning
)

SAMPLING_PARAMS_TOOL = Tool(
    name="lookup",
    description="Look up the value stored under a key.",
    input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)

server = MCPServer("bench-sdk-server")


@server.tool()
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def sample(
    ctx: Context, prompt: str = "Say hello.", max_tokens: int = 64, with_tools: bool = True
) -> str:
    """Ask the client for one completion and report how long that took from here."""
    messages = [SamplingMessage(role="user", content=TextContent(text=prompt))]
    started = time.perf_counter()
    if with_tools:
        result = await ctx.session.create_message(
            messages,
            max_tokens=max_tokens,
            tools=[SAMPLING_PARAMS_TOOL],
            tool_choice=ToolChoice(mode="auto"),
            related_request_id=ctx.request_id,
        )
    else:
        result = await ctx.session.create_message(
            messages, max_tokens=max_tokens, related_request_id=ctx.request_id
        )
    elapsed = time.perf_counter() - started
    return json.dumps({"elapsed": elapsed, "model": result.model})


def serve_http() -> None:
    """Streamable HTTP on 127.0.0.1, port picked by the kernel; quiet (no access log)."""
    import anyio
    import uvicorn

    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and without it a
    # keep-alive client waits 40 ms (delayed ACK) for the SSE event that follows the headers.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(socket.SOMAXCONN)
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")

    async def run() -> None:
        print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
        await uvicorn.Server(config).serve(sockets=[sock])

    anyio.run(run)


if __name__ == "__main__":
    if sys.argv[1:] == ["--http"]:
        serve_http()
    else:
        server.run()
