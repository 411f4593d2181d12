"""The Claude client is got ready in the background once the proxy knows it answers a session's
sampling, so that the first sampling answer does not wait for the SDK's import; `--no-warm-up`
leaves it to the first request."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import (
    SERVERS,
    RawSession,
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
)

pytestmark = pytest.mark.anyio

SAMPLING_SERVER = python_server("sampling_server.py")
HELLO = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 20}


def readiness(session: RawSession) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in session.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("msg") == "provider ready"]


async def wait_until_ready(session: RawSession) -> dict[str, Any]:
    with anyio.fail_after(60):
        while not (ready := readiness(session)):
            await anyio.sleep(0.05)
    [line] = ready
    return line


async def sample(session: RawSession) -> dict[str, Any]:
    arguments = {"name": "sample_raw", "arguments": {"params_json": json.dumps(HELLO)}}
    response = await session.request(5, "tools/call", arguments)
    outcome: dict[str, Any] = json.loads(response["result"]["content"][0]["text"])
    return outcome


def connected_ahead(session: RawSession) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in session.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("msg") == "connected ahead to the API"]


@pytest.mark.parametrize(("options", "built_for"), [((), "warm-up"), (("--no-warm-up",), "first request")])
async def test_the_client_is_ready_before_the_first_sampling_request(
    fake_claude: FakeClaude, options: tuple[str, ...], built_for: str
) -> None:
    """Warmed up, the proxy has also opened its connection to the API, with a `HEAD` of the base URL
    that carries no credentials; the first sampling request then goes over that connection."""
    fake_claude.enqueue(text_reply("warm"))
    gateway = ("--api-header", "X-Gateway-Key: gw-secret-1")
    argv = proxy_argv(
        "--log-format", "json", "--log-level", "debug", *gateway, *options, upstream=SAMPLING_SERVER
    )
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if built_for == "warm-up":
            ready = await wait_until_ready(session)  # no sampling request has been made
            with anyio.fail_after(30):
                while not connected_ahead(session):
                    await anyio.sleep(0.05)
            # The build primes the SDK with a canned in-memory answer; only the HEAD reached the API.
            [ahead] = fake_claude.requests
            assert (ahead.method, ahead.path, ahead.raw_body) == ("HEAD", "/", b"")
            assert not {"x-api-key", "authorization", "x-gateway-key"} & set(ahead.headers)
            assert connected_ahead(session)[0]["status"] == 401  # the fake wants a key on every path
        outcome = await sample(session)
        ready = await wait_until_ready(session)
        await session.close_stdin()
        await session.wait(30)
        logged = session.stderr()
    assert ready["built_for"] == built_for
    assert ready["provider"] == "anthropic"
    assert outcome["result"]["content"]["text"] == "warm"
    [message] = fake_claude.message_requests
    assert message.headers["x-gateway-key"] == "gw-secret-1"
    if built_for == "warm-up":
        assert [r.peer for r in fake_claude.requests] == [ahead.peer, ahead.peer]  # one connection
    else:
        assert fake_claude.requests == [message]  # nothing ahead of the first request
    assert "gw-secret-1" not in logged


async def test_a_client_that_samples_itself_gets_no_warm_up(fake_claude: FakeClaude) -> None:
    """In fallback mode a client that samples with tools answers everything: nothing is imported."""
    argv = proxy_argv("--log-format", "json", upstream=SAMPLING_SERVER)
    capabilities: dict[str, Any] = {"sampling": {"tools": {}}}
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(0, "initialize", initialize_params(capabilities))
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = await session.request(1, "tools/list", {})
        await session.request(2, "ping", {})
        await session.close_stdin()
        await session.wait(30)  # a warm-up once started would finish (and say so) before the exit
        unready = readiness(session)
    assert listed["result"]["tools"]
    assert unready == []


async def test_the_warm_up_starts_while_the_upstream_is_still_starting(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """From the client's `initialize`: an upstream that answers it only once the Claude client is
    ready (it waits for a file the test creates after seeing "provider ready") is answered at all
    only if the warm-up did not wait for the upstream's answer."""
    gate = tmp_path / "gate"
    upstream = [
        "sh",
        "-c",
        'while [ ! -e "$0" ]; do sleep 0.05; done; exec "$1" "$2"',
        str(gate),
        sys.executable,
        str(SERVERS / "sampling_server.py"),
    ]
    argv = proxy_argv("--log-format", "json", upstream=upstream)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize_params()})
        ready = await wait_until_ready(session)
        gate.touch()
        answer = await session.recv(timeout=60)
        await session.close_stdin()
        await session.wait(30)
    assert ready["built_for"] == "warm-up"
    assert answer["id"] == 0
    assert answer["result"]["serverInfo"]
