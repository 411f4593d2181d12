"""What the upstream child inherits: the user's environment, never the proxy's own credentials.

A review found a child printing the gateway headers the proxy was configured with
(`MCP_BACKFILL_API_HEADERS`, `ANTHROPIC_CUSTOM_HEADERS`). The upstream here writes its whole
environment to a file; it must hold none of the proxy's secrets, in stdio mode and under `serve`.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.harness import initialize_params, proxy_argv, proxy_env, python_server, raw_proxy
from tests.sidecar_harness import HTTP_TIMEOUT, open_session, run_sidecar

pytestmark = pytest.mark.anyio

TOKEN = "sidecar-token-0123456789abcdef"
SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-proxy-key-0123456789",
    "ANTHROPIC_AUTH_TOKEN": "proxy-auth-token-0123456789",
    "ANTHROPIC_CUSTOM_HEADERS": "X-Gateway-Key: custom-header-secret-0123\nX-Team: team-secret-4567",
    "MCP_BACKFILL_API_HEADERS": "X-Api-Gateway: api-header-secret-0123",
    "MCP_BACKFILL_AUTH_TOKEN": TOKEN,
    "AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key-0123456789",
}
KEPT = {"AWS_SECRET_ACCESS_KEY": "the-users-own-cloud-identity", "SERVER_SETTING": "for-the-server"}


def secret_values() -> list[str]:
    values = [value for name, value in SECRETS.items() if name != "ANTHROPIC_CUSTOM_HEADERS"]
    values += ["custom-header-secret-0123", "team-secret-4567", "api-header-secret-0123"]
    return values


async def environment_of(path: Path) -> dict[str, str]:
    with anyio.fail_after(60):
        while not path.exists():
            await anyio.sleep(0.05)
    environment: dict[str, str] = json.loads(path.read_text())
    return environment


def check(environment: dict[str, str]) -> None:
    dumped = json.dumps(environment)
    for value in secret_values():
        assert value not in dumped
    assert not [name for name in environment if name.startswith(("MCP_BACKFILL_", "ANTHROPIC_"))]
    for name, value in KEPT.items():
        assert environment[name] == value


async def test_the_stdio_childs_environment_holds_none_of_the_proxys_credentials(tmp_path: Path) -> None:
    dump = tmp_path / "env.json"
    env = proxy_env(**SECRETS, **KEPT)
    argv = proxy_argv("--provider", "mock", upstream=python_server("env_dump.py", str(dump)))
    async with raw_proxy(argv, env) as session:
        response = await session.request(1, "initialize", initialize_params())
        assert "result" in response
        environment = await environment_of(dump)
        await session.close_stdin()
        await session.wait(60)
        stderr = session.stderr()
    check(environment)
    for value in secret_values():
        assert value not in stderr


async def test_a_serve_childs_environment_holds_none_of_the_proxys_credentials(tmp_path: Path) -> None:
    dump = tmp_path / "env.json"
    env = proxy_env(**SECRETS, **KEPT)
    upstream = python_server("env_dump.py", str(dump))
    async with (
        run_sidecar("--provider", "mock", upstream=upstream, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        await open_session(http, sidecar.url, {"authorization": f"Bearer {TOKEN}"})
        environment = await environment_of(dump)
    check(environment)
    for value in secret_values():
        assert value not in sidecar.stderr()
