"""`mcp-backfill serve` when requests overlap: a session's requests against its own ending (idle
reaping, DELETE), bursts of one client against its limits. Moments are held open with events in the
test (a body held back, a Claude answer that hangs), never with sleeps that assume a timing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest

from tests.harness import proxy_env, python_server
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    health,
    open_session,
    response_to,
    run_sidecar,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")


async def test_a_session_is_not_reaped_while_a_post_body_of_it_is_arriving() -> None:
    """A POST holds its session only once its body was read: a session whose next request was still
    uploading its body when `--session-idle-timeout` came was closed under it (404). Session A's POST
    sends its head and holds its body back until session B, opened after it, has been reaped."""
    async with (
        run_sidecar(
            "--provider", "mock", "--session-idle-timeout", "4", upstream=SAMPLING_SERVER, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_a = await open_session(http, sidecar.url)
        release, started = anyio.Event(), anyio.Event()
        body = b'{"jsonrpc": "2.0", "id": 5, "method": "tools/list"}'

        async def held_body() -> AsyncIterator[bytes]:
            yield body[:10]
            started.set()
            await release.wait()
            yield body[10:]

        answer: dict[str, httpx2.Response] = {}

        async def post_a() -> None:
            headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_a, "content-length": str(len(body))}
            answer["a"] = await http.post(sidecar.url, content=held_body(), headers=headers)

        async with anyio.create_task_group() as tg:
            tg.start_soon(post_a)
            await started.wait()
            await open_session(http, sidecar.url)  # B: idle from now on, and A's POST is older
            with anyio.fail_after(60):
                while (await health(http, sidecar))["sessions"] == 2:  # until one was reaped
                    await anyio.sleep(0.1)
            release.set()
        response = answer["a"]
        assert response.status_code == 200, response.text
        assert "tools" in response_to(response, 5)["result"]
