"""The image's configuration against the real `mcp-backfill serve`: the env names the container files
use are real options, the image's command serves compose.yaml's stack (here on loopback, without
Docker), and the image's defaults refuse to serve every interface without a token."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

from mcp_backfill.config import SECRET_FILE_VARIABLES
from tests.container_files import (
    DOCKERFILE,
    cli_env_names,
    final_stage,
    healthcheck_command,
    image_env,
    load_compose,
    parse_dockerfile,
)
from tests.fake_claude import FakeClaude, text_reply
from tests.harness import EXAMPLES, ROOT, TEST_API_KEY, free_port, port_http_server, proxy_env
from tests.sidecar_harness import HANDSHAKE_HEADERS, initialize_body, run_sidecar

pytestmark = pytest.mark.anyio

TOKEN = "test-sidecar-token-0123456789abcdef"
ENV_NAME = re.compile(r"\bMCP_BACKFILL_[A-Z0-9_]+\b")


def container_section() -> str:
    """The container page of the docs (every variable it names must be real)."""
    return (ROOT / "docs" / "container.md").read_text()


def test_every_env_name_the_container_files_use_is_a_real_option() -> None:
    real = cli_env_names() | set(SECRET_FILE_VARIABLES)  # some secrets are variables only
    used = set(image_env(parse_dockerfile(DOCKERFILE.read_text())))
    for service in load_compose()["services"].values():
        used |= set(service.get("environment", {}))
    used |= set(ENV_NAME.findall(container_section()))
    used = {name.removesuffix("_FILE") for name in used if name.startswith("MCP_BACKFILL_")}
    assert {"MCP_BACKFILL_HOST", "MCP_BACKFILL_PORT", "MCP_BACKFILL_UPSTREAM_URL"} <= used
    assert used <= real, f"not options of mcp-backfill: {sorted(used - real)}"


def sidecar_env(fake_url: str, port: int, upstream_url: str, secrets: Path) -> dict[str, str]:
    """The image's ENV plus compose's `environment`, as Docker would merge them, except that the
    sidecar binds loopback here (no container around it), the upstream is the local one, and
    compose's secrets (`/run/secrets/NAME`) are files under `secrets`."""
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    compose_env = load_compose()["services"]["mcp-backfill"]["environment"]
    env = proxy_env(fake_url)  # ANTHROPIC_BASE_URL (the fake)
    env.update({k: v for k, v in image_env(dockerfile).items() if k.startswith("MCP_BACKFILL_")})
    values = {"anthropic_api_key": env.pop("ANTHROPIC_API_KEY"), "mcp_backfill_auth_token": TOKEN}
    for name, path in compose_env.items():
        if name.endswith("_FILE"):
            local = secrets / Path(path).name
            local.write_text(values[local.name] + "\n")
            env[name] = str(local)
        elif name.startswith("MCP_BACKFILL_"):
            env[name] = path
    env.update(
        MCP_BACKFILL_HOST="127.0.0.1", MCP_BACKFILL_PORT=str(port), MCP_BACKFILL_UPSTREAM_URL=upstream_url
    )
    return env


def healthcheck(port: int, **more: str) -> int:
    """The image's HEALTHCHECK, in the container's environment (`more`: what else it sets)."""
    [instruction] = [
        i for i in final_stage(parse_dockerfile(DOCKERFILE.read_text())) if i.keyword == "HEALTHCHECK"
    ]
    command = [sys.executable, *healthcheck_command(instruction)[1:]]
    env = {"PATH": "/usr/bin:/bin", "MCP_BACKFILL_PORT": str(port), **more}
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode


async def test_the_image_command_serves_the_compose_stack(fake_claude: FakeClaude, tmp_path: Path) -> None:
    fake_claude.enqueue(text_reply("One sentence from the fake Claude."))
    port = free_port()
    async with port_http_server([sys.executable, str(EXAMPLES / "weather_http.py")]) as upstream:
        env = sidecar_env(fake_claude.url, port, upstream.url, tmp_path)
        async with run_sidecar(env=env) as sidecar:
            assert await anyio.to_thread.run_sync(healthcheck, port) == 0
            headers = HANDSHAKE_HEADERS
            async with httpx.AsyncClient(timeout=10) as raw:
                anonymous = await raw.post(sidecar.url, json=initialize_body(), headers=headers)
                wrong = await raw.post(
                    sidecar.url, json=initialize_body(), headers={**headers, "Authorization": "Bearer nope"}
                )
            assert anonymous.status_code == 401
            assert wrong.status_code == 401

            http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            async with (
                http,
                Client(streamable_http_client(sidecar.url, http_client=http), mode="legacy") as client,
            ):
                tools = {tool.name for tool in (await client.list_tools()).tools}
                result = await client.call_tool("summarize", {"text": "A long text about the weather."})
            log = sidecar.stderr()

    assert {"weather_assistant", "summarize"} <= tools
    assert not result.is_error
    [block] = result.content
    assert isinstance(block, types.TextContent)
    assert block.text == "One sentence from the fake Claude."
    assert len(fake_claude.message_requests) == 1
    assert TEST_API_KEY not in log
    assert TOKEN not in log


@pytest.mark.parametrize("allowed", ["mcp-backfill:{port}", "mcp-backfill:*", "gateway.example:{port},*"])
async def test_the_healthcheck_passes_the_host_check_the_operator_configured(allowed: str) -> None:
    """Clients of a container reach it by a name (compose service, network alias), which the
    operator lists in MCP_BACKFILL_ALLOWED_HOSTS as docs/container.md says; that list replaces the
    loopback names, and the healthcheck's `Host: 127.0.0.1:8080` got 403: unhealthy while serving."""
    port = free_port()
    hosts = allowed.format(port=port)
    env = proxy_env(MCP_BACKFILL_PORT=str(port), MCP_BACKFILL_ALLOWED_HOSTS=hosts)
    async with run_sidecar("--provider", "mock", "--upstream-url", "http://127.0.0.1:9/mcp", env=env):
        assert (
            await anyio.to_thread.run_sync(lambda: healthcheck(port, MCP_BACKFILL_ALLOWED_HOSTS=hosts)) == 0
        )


def can_unshare_network() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "--net", "--map-root-user", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def test_the_image_defaults_refuse_every_interface_without_a_token() -> None:
    """Exactly the image's environment (MCP_BACKFILL_HOST=0.0.0.0), no token: `serve` must refuse to
    start. Run in a private network namespace, so even a regression binds nothing reachable."""
    if not can_unshare_network():
        pytest.skip("needs unshare --net (a private network namespace) to run serve on 0.0.0.0 safely")
    env = proxy_env()
    env.update(image_env(parse_dockerfile(DOCKERFILE.read_text())))
    env.update(
        PATH=proxy_env()["PATH"],
        MCP_BACKFILL_PROVIDER="mock",
        MCP_BACKFILL_UPSTREAM_URL="http://127.0.0.1:9/mcp",
    )
    assert env["MCP_BACKFILL_HOST"] == "0.0.0.0"
    argv = ["unshare", "--net", "--map-root-user", sys.executable, "-m", "mcp_backfill", "serve"]
    try:
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("serve started on 0.0.0.0 without a token (it should refuse at once)")
    assert result.returncode != 0
    assert "MCP_BACKFILL_AUTH_TOKEN" in result.stderr or "--auth-token" in result.stderr, result.stderr
