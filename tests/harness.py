"""Running the real `mcp-backfill` process in tests: command lines, environments, raw sessions."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from mcp import types
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
EXAMPLES = ROOT / "examples"
TEST_API_KEY = "sk-ant-test-SECRET-0123456789"


def proxy_argv(*options: str, upstream: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "mcp_backfill", *options, "--", *upstream]


def proxy_url_argv(*options: str, url: str) -> list[str]:
    return [sys.executable, "-m", "mcp_backfill", *options, "--upstream-url", url]


def run_clients(
    action: str, *args: str, home: Path, project: Path, os_name: str, client: str, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """`mcp-backfill clients ACTION` for one client, on a scratch home and project, as a user runs it."""
    place = ["--home", str(home), "--os", os_name, "--project", str(project), "--client", client]
    argv = [sys.executable, "-m", "mcp_backfill", "clients", action, *place, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(env), cwd=home.parent, timeout=60)


def python_server(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SERVERS / name), *args]


def proxy_env(fake_url: str | None = None, **extra: str) -> dict[str, str]:
    """The proxy's environment: ours minus any real credentials, plus the fake API when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "MCP_BACKFILL_"))}
    if fake_url is not None:
        env["ANTHROPIC_BASE_URL"] = fake_url
        env["ANTHROPIC_API_KEY"] = TEST_API_KEY
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def tool_json(result: types.CallToolResult) -> Any:
    """The JSON a test server's tool returned as its one text block (the call must have succeeded)."""
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return json.loads(block.text)


def run_example(
    client: str, *client_args: str, proxy_options: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`examples/<client>` in front of the proxy (mock provider) in front of the weather example."""
    command = [
        sys.executable,
        str(EXAMPLES / client),
        *client_args,
        "--",
        sys.executable,
        "-m",
        "mcp_backfill",
        "--provider",
        "mock",
        *proxy_options,
        "--",
        sys.executable,
        str(EXAMPLES / "weather_server.py"),
    ]
    return subprocess.run(command, capture_output=True, text=True, env=proxy_env(), cwd=ROOT, timeout=120)


def stdio_params(argv: Sequence[str], env: Mapping[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=argv[0], args=list(argv[1:]), env=dict(env), cwd=str(ROOT))


class RawSession:
    """Line-level access to a running proxy: what a client writes and reads, byte for byte."""

    def __init__(self, process: Process, stderr_path: Path) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self._buffer = b""

    async def send(self, message: Any) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(data)

    async def read_line(self, timeout: float = 15.0) -> bytes:
        assert self.process.stdout is not None
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.process.stdout.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def recv(self, timeout: float = 15.0) -> Any:
        return json.loads(await self.read_line(timeout))

    async def recv_until(self, predicate: Any, timeout: float = 15.0) -> tuple[Any, list[Any]]:
        """Read messages until `predicate(msg)`; returns it and everything read before it."""
        seen: list[Any] = []
        with anyio.fail_after(timeout):
            while True:
                message = await self.recv(timeout)
                if predicate(message):
                    return message, seen
                seen.append(message)

    async def request(self, request_id: Any, method: str, params: Any = None) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        response, _ = await self.recv_until(lambda m: m.get("id") == request_id and "method" not in m)
        return response

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def wait(self, timeout: float = 15.0) -> int:
        with anyio.fail_after(timeout):
            return await self.process.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@asynccontextmanager
async def raw_proxy(argv: Sequence[str], env: Mapping[str, str]) -> AsyncIterator[RawSession]:
    with tempfile.TemporaryDirectory() as tmp:
        stderr_path = Path(tmp) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = await anyio.open_process(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=dict(env),
                cwd=ROOT,
            )
            session = RawSession(process, stderr_path)
            try:
                yield session
            finally:
                await stop_process(process)
                for stream in (process.stdin, process.stdout):
                    if stream is not None:
                        await stream.aclose()


def initialize_params(
    capabilities: dict[str, Any] | None = None, version: str = "2025-11-25"
) -> dict[str, Any]:
    return {
        "protocolVersion": version,
        "capabilities": capabilities if capabilities is not None else {},
        "clientInfo": {"name": "raw-test-client", "version": "0"},
    }


@dataclass
class HttpServer:
    """An upstream MCP server running as its own process, serving streamable HTTP on loopback."""

    process: Process
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def stop_process(process: Process, grace: float = 10.0) -> None:
    """Terminate, then kill after `grace` seconds; a process that already exited is fine."""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    with anyio.move_on_after(grace, shield=True):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_for_port(port: int, process: Process, log_path: Path, timeout: float = 30.0) -> None:
    """Until something accepts connections on 127.0.0.1:port; fails early if the process exits."""
    with anyio.fail_after(timeout):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"server exited ({process.returncode}): {log_path.read_text()}")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def port_http_server(argv: Sequence[str], path: str = "/mcp") -> AsyncIterator[HttpServer]:
    """A server that takes `--port N` (appended to `argv`), on a free loopback port."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [*argv, "--port", str(port)], stdout=log, stderr=log, env=proxy_env(), cwd=ROOT
            )
            try:
                await wait_for_port(port, process, log_path)
                yield HttpServer(process, f"http://127.0.0.1:{port}{path}", log_path)
            finally:
                await stop_process(process)


@asynccontextmanager
async def python_http_server(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> AsyncIterator[HttpServer]:
    """A test server that prints `listening on URL` as its first stdout line."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                list(argv), stdout=subprocess.PIPE, stderr=log, env=dict(env or proxy_env()), cwd=ROOT
            )
            try:
                assert process.stdout is not None
                first = b""
                with anyio.fail_after(30):
                    while b"\n" not in first:
                        first += await process.stdout.receive()
                line = first.partition(b"\n")[0].decode()
                assert line.startswith("listening on "), line
                yield HttpServer(process, line.removeprefix("listening on "), log_path)
            finally:
                await stop_process(process)
                if process.stdout is not None:
                    await process.stdout.aclose()


NPM_LOOPBACK = ROOT / "tests" / "npm" / "loopback.cjs"


@asynccontextmanager
async def npm_http_server(
    argv: Sequence[str], path: str = "/mcp", extra_env: Mapping[str, str] | None = None
) -> AsyncIterator[HttpServer]:
    """An npm server that takes its port from $PORT and binds every interface: kept on loopback by
    a preloaded module (tests/npm/loopback.cjs), which also reports the free port it got. It runs in
    a temporary directory, where anything it writes is thrown away."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        port_file = Path(tmp) / "port"
        env = proxy_env(
            PORT="0",
            MCP_TEST_PORT_FILE=str(port_file),
            NODE_OPTIONS=f"--require {NPM_LOOPBACK}",
        )
        env.update(extra_env or {})
        with log_path.open("wb") as log:
            process = await anyio.open_process(list(argv), stdout=log, stderr=log, env=env, cwd=tmp)
            try:
                with anyio.fail_after(30):
                    while not port_file.exists() or not port_file.read_text().strip().isdigit():
                        if process.returncode is not None:
                            raise RuntimeError(f"{argv[0]} exited: {log_path.read_text()}")
                        await anyio.sleep(0.05)
                url = f"http://127.0.0.1:{port_file.read_text().strip()}{path}"
                yield HttpServer(process, url, log_path)
            finally:
                await stop_process(process)


class ProgressHeard(list[tuple[float, float | None, str | None]]):
    """A client's progress callback that keeps what it heard, in order: `(progress, total, message)`."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.append((progress, total, message))


def assert_kept_informed_while_sampling(heard: list[tuple[float, float | None, str | None]]) -> None:
    """The progress a client heard through a 2026-07-28 round the proxy drove while Claude answered
    (`(progress, total, message)` each): the server's first request's, then the proxy's own while
    it sampled (at least two), then the re-sent round's, every value above the one before."""
    messages = [message or "" for _, _, message in heard]
    assert messages[0] == "started", heard
    assert messages[-2:] == ["started", "sampled"], heard
    assert len(messages) >= 4, heard
    assert all("Claude" in message for message in messages[1:-2]), heard
    values = [progress for progress, _, _ in heard]
    assert all(a < b for a, b in itertools.pairwise(values)), heard
