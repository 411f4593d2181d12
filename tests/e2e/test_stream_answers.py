"""Answers on their way to the client: one answer per request, whatever the upstream sends."""

from __future__ import annotations

import httpx2
import pytest

from tests.harness import initialize_params, proxy_argv, proxy_env, python_server, raw_proxy
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    open_session,
    response_to,
    run_sidecar,
    sse_messages,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ECHO_SERVER = python_server("echo_server.py")
MARKER = {"jsonrpc": "2.0", "method": "notifications/marker", "params": {}}


def _answered_twice(request_id: int) -> dict[str, object]:
    """A request the echo server answers, then answers again (an array, as a stdio server may)."""
    second = {"jsonrpc": "2.0", "id": request_id, "result": {"second": True}}
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "test/answer_in_batch",
        "params": {"after": [second, MARKER]},
    }


async def test_a_second_answer_to_a_finished_request_does_not_reach_the_stdio_client() -> None:
    """JSON-RPC has one response per request: a second one, for an id the client no longer waits
    for, reached it (the SDKs report it as an error, or take it for a later request of that id)."""
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=ECHO_SERVER), proxy_env()) as proxy:
        await proxy.request(0, "initialize", initialize_params())
        await proxy.send(_answered_twice(7))
        seen = []
        with_marker = None
        while with_marker is None:
            message = await proxy.recv()
            for item in message if isinstance(message, list) else [message]:
                seen.append(item)
                if item.get("method") == "notifications/marker":
                    with_marker = item
        log = proxy.stderr()
    answers = [m for m in seen if m.get("id") == 7 and "method" not in m]
    assert answers == [{"jsonrpc": "2.0", "id": 7, "result": answers[0]["result"]}], seen
    assert "second" not in answers[0]["result"]
    assert "no request waiting for one" in log


async def test_a_second_answer_to_a_finished_request_does_not_reach_the_get_stream() -> None:
    """Through `serve`, the second answer went to the session's GET stream."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        answer = await http.post(sidecar.url, json=_answered_twice(7), headers=headers)
        assert "second" not in response_to(answer, 7)["result"]
        got = ""
        async with http.stream("GET", sidecar.url, headers=headers) as stream:
            assert stream.status_code == 200
            async for chunk in stream.aiter_text():
                got += chunk
                if "notifications/marker" in got and got.endswith("\n\n"):
                    break
    messages = [m for _, m in sse_messages(got)]
    assert [m.get("method") for m in messages if m.get("method") != "notifications/echo"] == [
        "notifications/marker"
    ], messages
    assert not [m for m in messages if m.get("id") == 7], messages
