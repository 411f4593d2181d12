"""An HTTP upstream's last answer reaches the relay before its POST's exchange winds down.

When the end of a POST's body comes with its answer (as it does for a JSON body, and for an SSE
stream that ends right after its response event), the exchange's task has nothing to wait for after
handing the answer over: without giving way, it would read the body to its end, give back the
connection and end the exchange before the relay's task, which the hand-over only wakes, could take
the answer to the client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest

from mcp_backfill import jsonrpc
from mcp_backfill.transports.http_upstream import HttpUpstream, HttpUpstreamSettings, open_http_upstream
from tests.defaults import CONFIG

pytestmark = pytest.mark.anyio

URL = "http://upstream.test/mcp"
ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'


class RecordedBody(httpx2.AsyncByteStream):
    """One body, given in one piece; notes when its reader asks past that piece and when it is
    closed (the exchange giving its connection back)."""

    def __init__(self, data: bytes, happened: list[str]) -> None:
        self.data = data
        self.happened = happened

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        self.happened.append("body read to its end")

    async def aclose(self) -> None:
        self.happened.append("body closed")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/event-stream", b"event: message\ndata: " + ANSWER + b"\n\n"),
        ("application/json", ANSWER),
    ],
)
async def test_the_relay_takes_the_last_answer_before_the_exchange_reads_on(
    content_type: str, body: bytes
) -> None:
    happened: list[str] = []
    before = HttpUpstream.exchanges_everywhere

    def handle(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": content_type}, stream=RecordedBody(body, happened)
        )

    async def relay_side(channel: HttpUpstream) -> None:
        raw, _ = await channel.receive_with_origin()
        assert raw == ANSWER
        # The exchange that carried it is still under way: nothing of its ending ran first.
        happened.append(f"answer taken, exchanges in flight: {HttpUpstream.exchanges_everywhere - before}")

    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as http,
        open_http_upstream(HttpUpstreamSettings(URL, CONFIG.max_message_bytes), http) as channel,
    ):
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay_side, channel)
                await anyio.sleep(0)  # the relay's side waits for the answer
                await channel.send(jsonrpc.encode({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        with anyio.fail_after(5):
            while "body closed" not in happened:
                await anyio.sleep(0.01)
        await channel.stop(0)

    taken = "answer taken, exchanges in flight: 1"
    assert taken in happened, happened
    if content_type == "text/event-stream":  # a JSON body is read whole before its answer is known
        assert happened == [taken, "body read to its end", "body closed"]
