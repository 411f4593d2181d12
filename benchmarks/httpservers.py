"""HTTP-serving processes for the HTTP scenarios: started, found (their URL), stopped.

Three kinds, each told apart by how it says where it listens: `mcp-backfill serve --port 0` logs
`serving streamable HTTP … port=N` on stderr; the SDK server with `--http` prints its URL as its
first stdout line; `mcp-proxy` is given a free port and is ready once that port accepts (it starts
listening only after its upstream has answered `initialize`).
"""

from __future__ import annotations

import re
import select
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.peers import MCP_PROXY_REQUIREMENT, ensure_peer, mcp_proxy_command
from benchmarks.procs import BENCH, PYTHON, ROOT, LogDir, bench_env, python_script, sdk_server_command
from benchmarks.scenarios import RunContext

SIDECAR_PORT_LINE = re.compile(r"serving streamable HTTP .*\bport=(\d+)")
# Starting a server includes its upstream's start (mcp-proxy) and the anthropic SDK's import
# (the sidecar), on a machine that may be busy.
START_TIMEOUT = 90.0


@dataclass
class HttpServer:
    """A started server; `ready()` waits until it listens and sets `url`. Several servers started
    one after the other and then waited for start side by side (their imports overlap)."""

    process: subprocess.Popen[bytes]
    log_path: Path
    locate: Callable[[], str | None]  # the URL once the server says it listens, else None
    url: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def ready(self) -> HttpServer:
        deadline = time.monotonic() + START_TIMEOUT
        while not self.url:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.process.args!r} exited with {self.process.returncode}; log: {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.process.args!r} did not start in {START_TIMEOUT:.0f} s; log: {self.log_path}"
                )
            self.url = self.locate() or ""
            if not self.url:
                time.sleep(0.05)
        return self


def ready(*servers: HttpServer) -> None:
    for server in servers:
        server.ready()


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


def _log_port(log_path: Path, pattern: re.Pattern[str]) -> Callable[[], str | None]:
    def locate() -> str | None:
        match = pattern.search(log_path.read_text(errors="replace"))
        return f"http://127.0.0.1:{match.group(1)}/mcp" if match else None

    return locate


def _accepting(port: int) -> Callable[[], str | None]:
    def locate() -> str | None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return None
        return f"http://127.0.0.1:{port}/mcp"

    return locate


def _first_line(process: subprocess.Popen[bytes], prefix: str) -> Callable[[], str | None]:
    def locate() -> str | None:
        assert process.stdout is not None
        if not select.select([process.stdout], [], [], 0)[0]:
            return None
        line = process.stdout.readline().decode().strip()
        if not line.startswith(prefix):
            raise RuntimeError(f"{process.args!r} said {line!r} instead of {prefix!r}")
        return line.removeprefix(prefix)

    return locate


@contextmanager
def _launched(
    argv: Sequence[str],
    logs: LogDir,
    name: str,
    locate: Callable[[subprocess.Popen[bytes], Path], Callable[[], str | None]],
    read_stdout: bool = False,
    source: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[HttpServer]:
    environment = {**bench_env(), **(env or {})}
    if source is not None:  # another tree's code first on the path
        environment["PYTHONPATH"] = source
    with logs.open(name) as stderr:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if read_stdout else subprocess.DEVNULL,
            stderr=stderr,
            env=environment,
            cwd=ROOT,
        )
        try:
            log_path = Path(stderr.name)
            yield HttpServer(process, log_path, locate(process, log_path))
        finally:
            stop_server(process)


def sidecar(
    logs: LogDir,
    name: str,
    *options: str,
    upstream: Sequence[str] = (),
    source: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ContextManager[HttpServer]:
    """`mcp-backfill serve` (started; call `ready()`), from `source` when given (a `PYTHONPATH`: another
    tree's `src`, as `benchmarks/compare_trees.py` runs it) instead of this tree's, with `env` added to
    its environment."""
    argv = sidecar_command(*options, upstream=upstream)
    locate = lambda _, log_path: _log_port(log_path, SIDECAR_PORT_LINE)  # noqa: E731
    return _launched(argv, logs, name, locate, source=source, env=env)


def mcp_proxy(ctx: RunContext, name: str, upstream: Sequence[str]) -> ContextManager[HttpServer]:
    """`mcp-proxy` in its own virtualenv, made on first use (started; call `ready()`)."""
    bin_dir = ensure_peer("mcp-proxy", MCP_PROXY_REQUIREMENT, ctx.progress)
    port = free_port()
    return _launched(mcp_proxy_command(bin_dir, port, upstream), ctx.logs, name, lambda *_: _accepting(port))


def tcp_forwarder(logs: LogDir, name: str, target: str, *, parse: bool = False) -> ContextManager[HttpServer]:
    """The TCP forwarder (benchmarks/servers/tcp_forwarder.py) in front of `target`, an HTTP URL,
    bare or (`parse`) reading every message it forwards (started; call `ready()`)."""
    argv = python_script(BENCH / "servers" / "tcp_forwarder.py", target, *(["--parse"] if parse else []))
    return _launched(
        argv, logs, name, lambda process, _: _first_line(process, "listening on "), read_stdout=True
    )


def terminating_forwarder(logs: LogDir, name: str, target: str) -> ContextManager[HttpServer]:
    """A front that ends HTTP on both sides below ASGI (benchmarks/servers/terminating_forwarder.py)
    in front of `target`, an HTTP URL (started; call `ready()`)."""
    argv = python_script(BENCH / "servers" / "terminating_forwarder.py", target)
    return _launched(
        argv, logs, name, lambda process, _: _first_line(process, "listening on "), read_stdout=True
    )


def asgi_forwarder(logs: LogDir, name: str, target: str) -> ContextManager[HttpServer]:
    """uvicorn and a bare ASGI forwarder (benchmarks/servers/asgi_forwarder.py) in front of
    `target`, an HTTP URL (started; call `ready()`)."""
    port = free_port()
    argv = [PYTHON, "-m", "benchmarks.servers.asgi_forwarder", target, str(port)]
    return _launched(argv, logs, name, lambda *_: _accepting(port))


def sdk_http_server(logs: LogDir, name: str) -> ContextManager[HttpServer]:
    """The SDK server (benchmarks/servers/sdk_server.py) over streamable HTTP (started; call `ready()`)."""
    argv = [*sdk_server_command(), "--http"]
    return _launched(
        argv, logs, name, lambda process, _: _first_line(process, "listening on "), read_stdout=True
    )
