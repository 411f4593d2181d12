"""The sampling scenario's direct arm: `python -m benchmarks.direct_sampler --base-url URL`.

A separate process, like the proxy, holding one `AsyncAnthropic` client configured as the proxy
configures its own, on the same event loop (uvloop when installed). It sends the Claude request
the proxy would build for the scenario's sampling request, streaming, through the SDK's stream
helper (`messages.stream()`), as a client that samples itself would; or, with `"lean": true`, the
proxy's own way (the SDK's `post` and `MessageFold`, `providers.anthropic.streamed_message`). Commands
arrive on stdin, one JSON object per line: `{"count": N, "concurrency": C, "lean": false}` runs N
calls with C in flight and answers `{"times": [seconds per call...], "wall": seconds for all}` on
stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anthropic
import anyio
import anyio.abc

from benchmarks.procs import BENCH_API_KEY
from benchmarks.servers.raw_echo import SAMPLING_PARAMS
from mcp_backfill.assembly import conversion_options
from mcp_backfill.cli import event_loop_options
from mcp_backfill.config import Config
from mcp_backfill.providers.anthropic import streamed_message
from mcp_backfill.sampling.convert import to_claude_request

# The proxy's settings with every option at its default (the provider does not shape the request).
PROXY_CONFIG = Config(upstream_command=("server",), provider="mock")


def claude_request() -> dict[str, Any]:
    """What the proxy sends to the API for the scenario's sampling request (the one the raw echo
    and SDK servers send): built by the proxy's own converter."""
    converted = to_claude_request(dict(SAMPLING_PARAMS), conversion_options(PROXY_CONFIG))
    return dict(converted.kwargs, model=PROXY_CONFIG.model)


async def helper_call(client: anthropic.AsyncAnthropic, request: dict[str, Any]) -> None:
    async with client.messages.stream(**request) as stream:
        await stream.get_final_message()


async def lean_call(client: anthropic.AsyncAnthropic, request: dict[str, Any]) -> None:
    await streamed_message(client, request)


async def run_batch(
    client: anthropic.AsyncAnthropic, count: int, concurrency: int, lean: bool = False
) -> dict[str, Any]:
    request = claude_request()
    call = lean_call if lean else helper_call
    times: list[float] = []
    limiter = anyio.CapacityLimiter(max(concurrency, 1))

    async def one() -> None:
        async with limiter:
            started = time.perf_counter()
            await call(client, request)
            times.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return {"times": times, "wall": time.perf_counter() - started}


async def serve(base_url: str) -> None:
    client = anthropic.AsyncAnthropic(api_key=BENCH_API_KEY, base_url=base_url, max_retries=2, timeout=600.0)
    stdin = anyio.wrap_file(sys.stdin)
    try:
        async for line in stdin:
            command = json.loads(line)
            answer = await run_batch(
                client, int(command["count"]), int(command["concurrency"]), bool(command.get("lean"))
            )
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.direct_sampler")
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    anyio.run(serve, args.base_url, backend_options=event_loop_options())
    return 0


if __name__ == "__main__":
    sys.exit(main())
