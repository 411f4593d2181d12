"""HTTP-serving processes for the HTTP scenarios: started, found (their URL), stopped.

Three kinds, each told apart by how it says where it listens: `mcp-backfill serve --port 0` logs
`serving streamable HTTP … port=N` on stderr; the SDK server with `--http` prints its URL as its
first stdout line; `mcp-proxy` is given a free port and is ready once that port accepts (it starts
listening only after its upstream has answered `initialize`).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.peers import MCP_PROXY_REQUIREMENT, ensure_peer, mcp_proxy_command
from benchmarks.procs import PYTHON, ROOT, LogDir, bench_env, sdk_server_command
from benchmarks.scenarios import RunContext

SIDECAR_PORT_LINE = re.compile(r"serving streamable HTTP .*\bport=(\d+)")
# Starting a server includes its upstream's start (mcp-proxy) and the anthropic SDK's import
# (the sidecar), on a machine that may be busy.
START_TIMEOUT = 90.0


@dataclass
class HttpServer:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def sidecar_command(*options: str, upstream: Sequence[str] = ()) -> list[str]:
    """`mcp-backfill serve` on a free port, as users run it (default provider), in front of `upstream`
    (a stdio command) unless the options name an `--upstream-url`."""
    argv = [PYTHON, "-m", "mcp_backfill", "serve", "--port", "0", "--drain-timeout", "2", *options]
    return [*argv, "--", *upstream] if upstream else argv


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_server(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM (every server here drains and stops its upstreams on it), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _wait(process: subprocess.Popen[bytes], log_path: Path, ready: re.Pattern[str] | None, port: int) -> str:
    """Until the server is ready; returns its port (from its log line, or the one it was given)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}; log: {log_path}")
        if ready is not None:
            match = ready.search(log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
        else:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return str(port)
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"{process.args!r} did not start within {START_TIMEOUT:.0f} s; log: {log_path}")


@contextmanager
def _serving(
    argv: Sequence[str], logs: LogDir, name: str, ready: re.Pattern[str] | None = None, port: int = 0
) -> Iterator[HttpServer]:
    with logs.open(name) as stderr:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=bench_env(),
            cwd=ROOT,
        )
        try:
            found = _wait(process, Path(stderr.name), ready, port)
            yield HttpServer(process, f"http://127.0.0.1:{found}/mcp", Path(stderr.name))
        finally:
            stop_server(process)


@contextmanager
def sidecar(logs: LogDir, name: str, *options: str, upstream: Sequence[str] = ()) -> Iterator[HttpServer]:
    with _serving(sidecar_command(*options, upstream=upstream), logs, name, SIDECAR_PORT_LINE) as server:
        yield server


@contextmanager
def mcp_proxy(ctx: RunContext, name: str, upstream: Sequence[str]) -> Iterator[HttpServer]:
    bin_dir = ensure_peer("mcp-proxy", MCP_PROXY_REQUIREMENT, ctx.progress)
    port = free_port()
    with _serving(mcp_proxy_command(bin_dir, port, upstream), ctx.logs, name, port=port) as server:
        yield server


@contextmanager
def sdk_http_server(logs: LogDir, name: str) -> Iterator[HttpServer]:
    """The SDK server (benchmarks/servers/sdk_server.py) over streamable HTTP."""
    with logs.open(name) as stderr:
        process = subprocess.Popen(
            [*sdk_server_command(), "--http"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=bench_env(),
            cwd=ROOT,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode().strip()
            if not line.startswith("listening on "):
                raise RuntimeError(f"the SDK HTTP server did not start ({line!r}); log: {stderr.name}")
            yield HttpServer(process, line.removeprefix("listening on "), Path(stderr.name))
        finally:
            stop_server(process)
