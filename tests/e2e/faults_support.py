"""Shared pieces of the fault, retry and provider e2e tests: a raw client in front of the proxy,
with the raw echo server (tests/servers/echo_server.py) behind it and the fake Claude API."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.fake_claude import FakeClaude
from tests.harness import RawSession, initialize_params, proxy_argv, proxy_env, python_server, raw_proxy

ECHO_SERVER = python_server("echo_server.py")
PLAIN_PARAMS: dict[str, Any] = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}],
    "maxTokens": 50,
}
_ids = itertools.count(1000)


@asynccontextmanager
async def echo_session(
    fake: FakeClaude | None,
    *options: str,
    env: dict[str, str] | None = None,
    warm: bool = False,
    version: str = "2025-11-25",
) -> AsyncIterator[RawSession]:
    """A started and initialized proxy session (client without sampling) in front of the echo server.

    `warm`: one sampling request is answered first (the fake's default reply), then the fake is
    reset, so that timing-sensitive tests do not also measure building the Claude client, which
    the proxy does on the first sampling request (an import that takes seconds on a busy machine).
    `version`: the revision the client asks for, which the echo server accepts.
    """
    argv = proxy_argv("--log-level", "debug", *options, upstream=ECHO_SERVER)
    async with raw_proxy(argv, proxy_env(fake.url if fake else None, **(env or {}))) as session:
        await session.request(1, "initialize", initialize_params(version=version))
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if warm and fake is not None:
            assert "result" in await ask_sampling(session, timeout=60)
            fake.reset()
        yield session


async def ask_sampling(
    session: RawSession, params: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Make the upstream send sampling/createMessage; return the response the proxy gave it."""
    request_id = next(_ids)
    ask = {"method": "sampling/createMessage", "params": params or PLAIN_PARAMS, "id": f"ask-{request_id}"}
    await session.send({"jsonrpc": "2.0", "id": request_id, "method": "test/ask_client", "params": ask})
    response, _ = await session.recv_until(
        lambda m: m.get("id") == request_id and "method" not in m, timeout=timeout
    )
    answer: dict[str, Any] = response["result"]["client_response"]
    return answer


def rss_kib(pid: int) -> int:
    """Resident set size of a live process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
