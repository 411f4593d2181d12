"""Running `mcp-backfill serve` (the streamable-HTTP front) as a real process on loopback for tests."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2 as httpx
from anyio.abc import Process

from tests.conformance import free_port, stop
from tests.harness import ROOT, proxy_env


@dataclass(frozen=True)
class Sidecar:
    base_url: str  # http://127.0.0.1:PORT
    log_path: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def wait_healthy(base_url: str, process: Process, log_path: Path, timeout: float = 30.0) -> None:
    """Until GET /healthz answers 200; fails early, with the log, if the sidecar exits."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        with anyio.fail_after(timeout):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(
                        f"mcp-backfill serve exited ({process.returncode}): {log_path.read_text()}"
                    )
                try:
                    if (await http.get(f"{base_url}/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)


@asynccontextmanager
async def running_sidecar(
    args: Sequence[str], env: Mapping[str, str] | None = None, port: int | None = None
) -> AsyncIterator[Sidecar]:
    """`python -m mcp_backfill serve --port PORT ARGS...` on 127.0.0.1 (a free port unless given).
    `env` replaces the default environment (ours minus credentials and MCP_BACKFILL_*). With
    `port` given, no --port flag is added: the caller sets it (e.g. MCP_BACKFILL_PORT in `env`)."""
    port_flag = [] if port is not None else ["--port", str(port := free_port())]
    argv = [sys.executable, "-m", "mcp_backfill", "serve", *port_flag, *args]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "sidecar.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                argv, stdout=log, stderr=log, env=dict(env if env is not None else proxy_env()), cwd=ROOT
            )
            try:
                base_url = f"http://127.0.0.1:{port}"
                await wait_healthy(base_url, process, log_path)
                yield Sidecar(base_url, log_path)
            finally:
                await stop(process)
