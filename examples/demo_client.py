"""A plain MCP client with no sampling support, talking to the weather example through mcp-backfill.

The client is built with the mcp SDK and has no `sampling_callback`, so it declares no `sampling`
capability: exactly like Claude Desktop, Cursor and most other clients. Without the proxy the
weather server's tools fail; with mcp-backfill in between, the proxy answers the server's
`sampling/createMessage` requests itself.

    python examples/demo_client.py -- mcp-backfill --provider mock -- python examples/weather_server.py
    ANTHROPIC_API_KEY=sk-ant-... python examples/demo_client.py -- \\
        mcp-backfill -- python examples/weather_server.py

Everything after `--` is the command to launch over stdio. When that command holds a `--` of its
own (the proxy's, before the server's command), the demo first calls the server directly, without
the proxy, to show the failure the proxy removes. Options before the first `--`:
`--question TEXT`, `--text TEXT` (what `summarize` gets), `--city NAME` (for `packing_advice`, called
in a second session on protocol 2026-07-28), `--timeout SECONDS`.
Exit status: 0 when every call succeeded, 1 when one failed, 2 on bad usage.
"""

import argparse
import os
import sys
import textwrap
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

DEFAULT_QUESTION = "Should I bring an umbrella in Paris and in Oslo tomorrow?"
DEFAULT_TEXT = (
    "mcp-backfill is a transparent MCP proxy. It sits between an MCP client and an MCP server and "
    "answers the server's sampling requests with Claude when the client cannot, so servers that "
    "need a language model work in every client, including tool use during sampling."
)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="demo_client.py",
        usage="%(prog)s [--question TEXT] [--text TEXT] [--city NAME] [--timeout S] -- COMMAND [ARGS...]",
        description="Call the weather example's tools through a stdio MCP server command.",
    )
    parser.add_argument("--question", default=DEFAULT_QUESTION, help="question for weather_assistant")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="text for summarize")
    parser.add_argument("--city", default="Oslo", help="city for packing_advice")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per tool call")
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    args = parser.parse_args(options)
    if not command:
        parser.error("give the server command after `--`")
    return args, command


def say(speaker: str, text: str) -> None:
    body = textwrap.indent(text.strip(), "    ")
    print(f"{speaker}:\n{body}\n", flush=True)


def text_of(result: CallToolResult) -> str:
    parts = [
        block.text if isinstance(block, TextContent) else f"[{block.type} content]"
        for block in result.content
    ]
    return "\n".join(parts)


async def call(client: Client, tool: str, arguments: dict[str, Any], read_timeout: float) -> bool:
    """Call one tool, print the exchange, and report whether it succeeded."""
    say(f"client -> {tool}", "\n".join(f"{key}: {value}" for key, value in arguments.items()))
    try:
        result = await client.call_tool(tool, arguments, read_timeout_seconds=read_timeout)
    except MCPError as error:
        say(f"{tool} FAILED", f"JSON-RPC error {error.code}: {error.message}")
        return False
    if result.is_error:
        say(f"{tool} FAILED", text_of(result))
        return False
    say(f"{tool} -> client", text_of(result))
    return True


async def without_the_proxy(args: argparse.Namespace, command: list[str]) -> bool:
    """The server alone, for a client that cannot sample: its sampling tool fails. True if it did."""
    direct = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    print(f"Without mcp-backfill: {' '.join(command)}\n")
    async with Client(direct, mode="legacy") as client:
        failed = not await call(client, "summarize", {"text": args.text}, args.timeout)
    print("As expected: a client that cannot sample cannot use this tool.\n" if failed else "")
    return failed


async def run(args: argparse.Namespace, command: list[str]) -> int:
    if "--" in command:  # the proxy's separator: what follows it is the server alone
        server_alone = command[len(command) - command[::-1].index("--") :]
        if not await without_the_proxy(args, server_alone):
            return 1
        print(f"With mcp-backfill in between: {' '.join(command)}\n")
    # stdio_client only passes a small safe subset of the environment to the child by default;
    # the proxy needs PATH, ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL and MCP_BACKFILL_*, so pass it all.
    server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    # No sampling_callback: this client declares no sampling capability at all.
    # First a handshake-era session (initialize; the server sends sampling/createMessage requests)...
    async with Client(server, mode="legacy") as client:
        info = client.server_info
        name = info.name if info is not None else "(unnamed server)"
        print(f"Connected to {name} (protocol {client.protocol_version}) via: {' '.join(command)}\n")
        tools = await client.list_tools()
        print("Tools: " + ", ".join(tool.name for tool in tools.tools) + "\n")
        ok = await call(client, "weather_assistant", {"question": args.question}, args.timeout)
        ok = await call(client, "summarize", {"text": args.text}, args.timeout) and ok
    # ...then the SDK's default, the stateless 2026-07-28 revision (sampling inside input_required).
    async with Client(server) as client:
        print(f"Connected again (protocol {client.protocol_version})\n")
        ok = await call(client, "packing_advice", {"city": args.city}, args.timeout) and ok
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return anyio.run(run, args, command)
    except MCPError as error:
        print(f"demo_client: MCP error {error.code}: {error.message}", file=sys.stderr)
    except OSError as error:
        print(f"demo_client: cannot run {command[0]!r}: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
