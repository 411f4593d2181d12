"""The commands the container files run, run here as real processes on loopback: the image's
HEALTHCHECK and compose's upstream service (examples/weather_http.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2 as httpx
import pytest

from tests.container_files import DOCKERFILE, final_stage, healthcheck_command, load_compose, parse_dockerfile
from tests.harness import ROOT, free_port, proxy_env
from tests.sidecar_harness import HANDSHAKE_HEADERS, initialize_body


def image_healthcheck() -> list[str]:
    [instruction] = [
        i for i in final_stage(parse_dockerfile(DOCKERFILE.read_text())) if i.keyword == "HEALTHCHECK"
    ]
    command = healthcheck_command(instruction)
    # `python` in the image is the virtualenv's; here it is ours (same standard library).
    return [sys.executable, *command[1:]]


@contextmanager
def status_server(status: int) -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP server answering every GET with `status`; yields its port and the paths asked."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], paths
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(port: int, **more: str) -> int:
    env = {"PATH": os.environ["PATH"], "MCP_BACKFILL_PORT": str(port), **more}
    return subprocess.run(
        image_healthcheck(), env=env, capture_output=True, timeout=30, check=False
    ).returncode


def test_healthcheck_passes_on_a_healthy_healthz() -> None:
    with status_server(200) as (port, paths):
        assert run_healthcheck(port) == 0
    assert paths == ["/healthz"]


def test_healthcheck_fails_on_an_unhealthy_answer() -> None:
    with status_server(503) as (port, paths):
        assert run_healthcheck(port) != 0
    assert paths == ["/healthz"]


def test_healthcheck_fails_when_nothing_listens() -> None:
    assert run_healthcheck(free_port()) != 0


def test_healthcheck_asks_the_sidecar_itself_whatever_the_proxy_variables_say() -> None:
    """A container whose egress goes through an HTTP proxy (`HTTP_PROXY`, without `127.0.0.1` in
    `NO_PROXY`) had its healthcheck sent to that proxy, which cannot reach the container's loopback:
    the sidecar was reported unhealthy while it served."""
    with status_server(503) as (proxy_port, proxied), status_server(200) as (port, paths):
        proxy = f"http://127.0.0.1:{proxy_port}"
        assert run_healthcheck(port, http_proxy=proxy, HTTP_PROXY=proxy, ALL_PROXY=proxy) == 0
    assert (paths, proxied) == (["/healthz"], [])


@contextmanager
def weather_http(*args: str) -> Iterator[str]:
    """examples/weather_http.py on a free loopback port; yields its base URL once it accepts connections."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "weather_http.py"), "--port", str(port), *args],
        env=proxy_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    assert process.stderr is not None
                    pytest.fail(f"weather_http.py did not start: {process.stderr.read().decode()}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def post_initialize(base_url: str, host: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}/mcp", content=json.dumps(initialize_body()), headers={**HANDSHAKE_HEADERS, "Host": host}
    )


def test_compose_upstream_accepts_only_the_host_the_sidecar_sends() -> None:
    """compose.yaml's upstream command, on loopback: the service-name Host passes, others are refused."""
    command = load_compose()["services"]["weather"]["command"]
    allowed = command[command.index("--allowed-hosts") + 1]
    with weather_http("--allowed-hosts", allowed) as base_url:
        accepted = post_initialize(base_url, allowed)
        refused = post_initialize(base_url, "evil.example.com")
    assert accepted.status_code == 200
    assert "weather-example" in accepted.text
    assert accepted.headers.get("mcp-session-id")
    assert refused.status_code == 421


def test_weather_http_protects_loopback_by_default() -> None:
    with weather_http() as base_url:
        local = post_initialize(base_url, base_url.removeprefix("http://"))
        rebound = post_initialize(base_url, "evil.example.com")
    assert local.status_code == 200
    assert rebound.status_code == 421
