"""Running the real `mcp-backfill serve` process in tests, and talking raw HTTP to it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from anyio.abc import Process

from tests.harness import ROOT, HttpServer, proxy_env, stop_process

# The log line `serve` writes once it listens, as text (`port=N`) or JSON (`"port": N`).
PORT_LINE = re.compile(r'serving streamable HTTP.*?\bport"?\s*[=:]\s*(\d+)')
ACCEPT_BOTH = "application/json, text/event-stream"
# Generous: a slow CI machine takes seconds to start an upstream process (it imports the mcp SDK).
HTTP_TIMEOUT = 30.0
HANDSHAKE_HEADERS = {"accept": ACCEPT_BOTH, "content-type": "application/json"}


@dataclass
class Sidecar:
    process: Process
    port: int
    stderr_path: Path
    captured: str | None = None  # the whole stderr, once the process is gone

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def stderr(self) -> str:
        if self.captured is not None:
            return self.captured
        return self.stderr_path.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait(self, timeout: float = 20.0) -> int:
        with anyio.fail_after(timeout):
            return await self.process.wait()


def sidecar_argv(
    *options: str, upstream: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> list[str]:
    """`--port 0` (a free port) unless `env` sets MCP_BACKFILL_PORT; `-- upstream` when given."""
    port = [] if env is not None and "MCP_BACKFILL_PORT" in env else ["--port", "0"]
    command = ["--", *upstream] if upstream else []
    return [sys.executable, "-m", "mcp_backfill", "serve", *port, *options, *command]


@asynccontextmanager
async def run_sidecar(
    *options: str, upstream: Sequence[str] = (), env: Mapping[str, str]
) -> AsyncIterator[Sidecar]:
    """Start `mcp-backfill serve` on loopback (on a free port unless `env` names one); stop it
    (SIGTERM, then SIGKILL) at the end. Without `upstream`, the options or `env` name one."""
    with tempfile.TemporaryDirectory() as tmp:
        stderr_path = Path(tmp) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = await anyio.open_process(
                sidecar_argv(*options, upstream=upstream, env=env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=dict(env),
                cwd=ROOT,
            )
            sidecar: Sidecar | None = None
            try:
                sidecar = Sidecar(process, await _wait_for_port(process, stderr_path), stderr_path)
                yield sidecar
            finally:
                await stop_process(process, grace=15)  # room for the sidecar's drain
                if sidecar is not None:
                    sidecar.captured = stderr_path.read_text(errors="replace")


def in_front_of(upstream: HttpServer, *options: str) -> AbstractAsyncContextManager[Sidecar]:
    """The sidecar in front of the streamable-HTTP server `upstream`, sampling with the mock provider."""
    return run_sidecar("--upstream-url", upstream.url, "--provider", "mock", *options, env=proxy_env())


async def _wait_for_port(process: Process, stderr_path: Path) -> int:
    with anyio.fail_after(20):
        while True:
            match = PORT_LINE.search(stderr_path.read_text(errors="replace"))
            if match:
                return int(match.group(1))
            if process.returncode is not None:
                raise AssertionError(f"mcp-backfill serve exited early:\n{stderr_path.read_text()}")
            await anyio.sleep(0.05)


def initialize_body(
    request_id: Any = 1, version: str = "2025-11-25", capabilities: Any = None
) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": capabilities if capabilities is not None else {},
            "clientInfo": {"name": "raw-http-test", "version": "0"},
        },
    }


def sse_messages(text: str) -> list[tuple[str | None, Any]]:
    """(event id, decoded data) of every non-empty SSE event in a response body."""
    events: list[tuple[str | None, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event_id = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data and "".join(data):
            events.append((event_id, json.loads("\n".join(data))))
    return events


def response_messages(response: httpx2.Response) -> list[Any]:
    """The JSON-RPC messages of a POST's answer, JSON or SSE."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [message for _, message in sse_messages(response.text)]
    return [response.json()]


def response_to(response: httpx2.Response, request_id: Any) -> Any:
    """The one JSON-RPC response with `request_id` in a POST's answer. Other messages may share the
    stream: a stdio upstream's notification that arrives while this is the only request in flight
    is routed to it (e.g. the echo server's announcement of `notifications/initialized`)."""
    replies = [m for m in response_messages(response) if "method" not in m and m.get("id") == request_id]
    assert len(replies) == 1, response.text
    return replies[0]


async def open_session(
    http: httpx2.AsyncClient, url: str, headers: Mapping[str, str] | None = None, version: str = "2025-11-25"
) -> str:
    """initialize (at `version`) + notifications/initialized over raw HTTP; returns the session id."""
    response = await http.post(
        url, json=initialize_body(version=version), headers={**HANDSHAKE_HEADERS, **(headers or {})}
    )
    assert response.status_code == 200, response.text
    session_id = response.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ack = await http.post(
        url,
        json=initialized,
        headers={**HANDSHAKE_HEADERS, **(headers or {}), "mcp-session-id": session_id},
    )
    assert ack.status_code == 202, ack.text
    return session_id


async def health(http: httpx2.AsyncClient, sidecar: Sidecar) -> dict[str, Any]:
    response = await http.get(f"{sidecar.base}/healthz")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result
