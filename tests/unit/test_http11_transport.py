"""`Http11Transport` against scripted HTTP/1.1 servers on loopback: framing, keep-alive, failures.

Each server here is an asyncio server on 127.0.0.1 whose handler reads one request head (and its
`Content-Length` body) at a time and writes what the test scripts, so that the transport meets
exactly the bytes a test is about: odd splits, trailers, early closes, silence.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_backfill.transports.http_upstream import http11
from mcp_backfill.transports.http_upstream.http11 import Http11Transport
from mcp_backfill.transports.http_upstream.settings import (
    HttpUpstreamSettings,
    UpstreamClient,
    make_http_client,
    post_message,
    write_message_now,
)

pytestmark = pytest.mark.anyio

Reply = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: close the connection


@dataclass
class Server:
    url: str
    connections: int = 0
    open: int = 0  # connections the client has not closed yet
    requests: list[bytes] = field(default_factory=list)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@asynccontextmanager
async def scripted(reply: Reply) -> AsyncIterator[Server]:
    """A server that answers its n-th request (counted over all connections) with `reply`."""
    server = Server("")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        server.open += 1
        try:
            while True:
                request = await _read_request(reader)
                server.requests.append(request)
                if not await reply(len(server.requests), request, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            server.open -= 1
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/mcp"
    try:
        yield server
    finally:
        listener.close()


def json_reply(body: bytes = b'{"ok":true}', extra: bytes = b"") -> Reply:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
            % (extra, len(body), body)
        )
        return b"connection: close" not in extra.lower()

    return reply


@asynccontextmanager
async def client(**timeouts: float) -> AsyncIterator[httpx2.AsyncClient]:
    timeout = httpx2.Timeout(timeouts.get("connect", 5.0), read=timeouts.get("read", 5.0))
    async with httpx2.AsyncClient(transport=Http11Transport(), timeout=timeout) as http:
        yield http


async def post(http: httpx2.AsyncClient, url: str, body: bytes = b'{"q":1}') -> httpx2.Response:
    response = await http.post(url, content=body, headers={"content-type": "application/json"})
    return response


async def test_requests_reuse_one_keep_alive_connection() -> None:
    async with scripted(json_reply()) as server, client() as http:
        for _ in range(5):
            response = await post(http, server.url)
            assert response.status_code == 200
            assert response.json() == {"ok": True}
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /mcp HTTP/1.1\r\n")
    assert b"\r\ncontent-length: 7\r\n" in first.lower()
    assert first.endswith(b'\r\n\r\n{"q":1}')


async def test_connection_close_is_honoured() -> None:
    async with scripted(json_reply(extra=b"Connection: close\r\n")) as server, client() as http:
        for _ in range(3):
            assert (await post(http, server.url)).status_code == 200
    assert server.connections == 3


async def test_chunked_body_with_extensions_and_trailers_streams_in_order() -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        writer.write(b"6;ext=1\r\ndata: \r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the first part reaches the reader before the rest is sent
        writer.write(b"5\r\nhello\r\n0\r\nx-trailer: yes\r\n\r\n")
        return True

    async with scripted(reply) as server, client() as http:
        async with http.stream("POST", server.url, content=b"{}") as response:
            parts = [part async for part in response.aiter_bytes()]
        assert b"".join(parts) == b"data: hello"
        assert len(parts) >= 2  # streamed, not buffered to the end
        assert (await post(http, server.url)).status_code == 200
    assert server.connections == 1  # read to its end, the connection went back to the pool


async def test_body_delimited_by_the_connection_end() -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"a":1}')
        return False

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url)).json() == {"a": 1}
        assert (await post(http, server.url)).json() == {"a": 1}
    assert server.connections == 2


async def test_interim_answers_are_skipped_and_reason_kept() -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Here\r\ncontent-length: 2\r\n\r\nno")
        return True

    async with scripted(reply) as server, client() as http:
        response = await post(http, server.url)
    assert (response.status_code, response.reason_phrase, response.content) == (404, "Not Here", b"no")


@pytest.mark.parametrize(
    "wire",
    [
        # RFC 9112 §2.2: a recipient may take a lone LF for a line's end; h11 (httpx2's own transport,
        # which `https://` upstreams use) does, so a server writing them worked there and timed out here.
        b"HTTP/1.1 100 Continue\n\nHTTP/1.1 201 Made\ncontent-length: 2\nx-a: 1\n\nok",
        b"HTTP/1.1 201 Made\r\ncontent-length: 2\nx-a: 1\r\n\r\nok",
        # The status line in CRLF, the rest in LF: the head was awaited up to a CRLF CRLF that never
        # came (the read timeout), or taken up to one in the body.
        b"HTTP/1.1 201 Made\r\ncontent-length: 2\nx-a: 1\n\nok",
        b"HTTP/1.1 201 Made\r\nx-a: 1\ncontent-length: 2\n\nok\n\r\n",
        b"HTTP/1.1 201 Made\r\n\r\n",
        b"HTTP/1.1 201 Made\r\nx-a: 1\r\n\r\n",
    ],
)
async def test_heads_whose_lines_end_in_a_lone_lf_are_read(wire: bytes) -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(wire)
        return False

    async with scripted(reply) as server, client(read=5) as http:
        response = await post(http, server.url)
    assert response.status_code == 201
    assert response.reason_phrase == "Made"
    assert response.content == (b"ok" if b"content-length" in wire else b"")


async def test_a_status_line_alone_is_no_stale_connection() -> None:
    """A reused connection that ends after the answer's status line was answered, if only in part: the
    request is not sent again (it was read), and the error says the answer broke off."""

    async def reply(n: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return True
        writer.write(b"HTTP/1.1 200 OK\r\n")
        return False

    async with scripted(reply) as server, client(read=5) as http:
        await http.delete(server.url)
        with pytest.raises(httpx2.RemoteProtocolError, match="without answering"):
            await http.delete(server.url)
    assert len(server.requests) == 2


async def test_a_head_of_many_short_lines_is_held_to_the_limit() -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\n" + b"a: b\n" * 20_000)
        return True

    async with scripted(reply) as server, client(read=5) as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="exceeds"):
            await post(http, server.url)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), as a kernel does for a socket closed with unread data in it."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _resetting_on_the_second(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
    """Answers every request but the second, on which it resets the connection without a byte of
    answer: the keep-alive race, the server closing the idle connection as a request went out (the
    request then meets a closed socket, which answers with a reset)."""
    if number == 2:
        reset(writer)
        return False
    await json_reply()(number, b"", writer)
    return True


async def _closing_on_the_second(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
    """Answers every request but the second, which it reads and then closes the connection on
    cleanly, without a byte of answer: it may have acted on it (a worker that died answering)."""
    if number == 2:
        return False
    await json_reply()(number, b"", writer)
    return True


async def test_a_reused_connection_reset_before_answering_is_retried_once_on_a_new_one() -> None:
    async with scripted(_resetting_on_the_second) as server, client() as http:
        assert (await post(http, server.url)).status_code == 200
        assert (await post(http, server.url)).status_code == 200
    assert server.connections == 2
    assert len(server.requests) == 3


async def test_a_post_read_and_left_unanswered_on_a_reused_connection_is_not_sent_again() -> None:
    """It used to be: a `tools/call` the upstream read (and may have run) before closing ran twice."""
    async with scripted(_closing_on_the_second) as server, client() as http:
        assert (await post(http, server.url)).status_code == 200
        with pytest.raises(httpx2.RemoteProtocolError, match="without answering"):
            await post(http, server.url)
    assert len(server.requests) == 2


async def test_a_get_read_and_left_unanswered_on_a_reused_connection_is_sent_again() -> None:
    async with scripted(_closing_on_the_second) as server, client() as http:
        assert (await http.get(server.url)).status_code == 200
        assert (await http.get(server.url)).status_code == 200
    assert len(server.requests) == 3


async def test_a_reset_after_part_of_an_answer_is_an_error_not_a_retry() -> None:
    """The upstream had begun answering (so it had the request): it used to be sent again."""

    async def reply(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 2:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: appl")
            await writer.drain()
            await asyncio.sleep(0.05)
            reset(writer)
            return False
        await json_reply()(number, b"", writer)
        return True

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url)).status_code == 200
        with pytest.raises(httpx2.ReadError):
            await post(http, server.url, b'{"q":2}')
    assert [request.endswith(b'{"q":2}') for request in server.requests] == [False, True]


@pytest.mark.parametrize(
    "stray",
    [
        # An answer longer than its Content-Length, the surplus shaped as a whole answer.
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{"forged":true}',
        # A 408 on an idle connection, before closing it (servers and balancers do).
        b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
    ],
)
async def test_bytes_no_request_asked_for_do_not_answer_the_next_request(stray: bytes) -> None:
    async def reply(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        await json_reply()(number, b"", writer)
        if number == 1:
            await writer.drain()
            await asyncio.sleep(0.05)  # after the answer was read: while the connection sits idle
            writer.write(stray)
        return True

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url)).json() == {"ok": True}
        await asyncio.sleep(0.2)
        assert (await post(http, server.url)).json() == {"ok": True}
    assert server.connections == 2


async def test_a_204_with_a_body_does_not_answer_the_next_request() -> None:
    async def reply(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1:
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello")
            return True
        await json_reply()(number, b"", writer)
        return True

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url)).status_code == 204
        await asyncio.sleep(0.1)
        assert (await post(http, server.url)).json() == {"ok": True}


async def test_a_new_connection_closed_without_an_answer_is_an_error() -> None:
    async def reply(*_: object) -> bool:
        return False

    async with scripted(reply) as server, client() as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="without answering"):
            await post(http, server.url)
    assert len(server.requests) == 1  # not retried: the server may have handled it


async def test_idle_connections_past_the_expiry_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http11, "KEEPALIVE_EXPIRY", 0.05)
    async with scripted(json_reply()) as server, client() as http:
        await post(http, server.url)
        await asyncio.sleep(0.1)
        await post(http, server.url)
    assert server.connections == 2


async def test_idle_connections_past_the_expiry_are_closed_without_waiting_for_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst of concurrent requests leaves as many idle connections in the pool; they were closed
    only when a later request looked at them, so a session left idle after a burst (for up to
    `--session-idle-timeout`) held every one of them, in CLOSE_WAIT once the server dropped its end."""
    monkeypatch.setattr(http11, "KEEPALIVE_EXPIRY", 0.2)

    all_in = asyncio.Event()

    async def slow(number: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 5:
            all_in.set()
        await all_in.wait()  # the requests overlap: each takes a connection of its own
        return await json_reply()(number, request, writer)

    async with scripted(slow) as server, client() as http:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(post, http, server.url)
        assert server.connections == 5
        with anyio.fail_after(10):
            while server.open:
                await asyncio.sleep(0.05)
        assert (await post(http, server.url)).status_code == 200  # a new connection, as after expiry
        assert server.connections == 6


async def test_a_body_cut_short_is_a_read_error_and_the_connection_is_dropped() -> None:
    async def reply(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
            return False
        await json_reply()(number, b"", writer)
        return True

    async with scripted(reply) as server, client() as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="mid-body"):
            await post(http, server.url)
        assert (await post(http, server.url)).status_code == 200
    assert server.connections == 2


async def test_an_unread_body_closes_its_connection() -> None:
    async with scripted(json_reply(b"x" * 1000)) as server, client() as http:
        async with http.stream("POST", server.url, content=b"{}") as response:
            assert response.status_code == 200  # closed without reading the body
        assert (await post(http, server.url)).status_code == 200
    assert server.connections == 2


async def test_silence_is_a_read_timeout() -> None:
    async def reply(*_: object) -> bool:
        await asyncio.sleep(5)
        return False

    async with scripted(reply) as server, client(read=0.2) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await post(http, server.url)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nsome of it",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nhel",
    ],
)
async def test_a_body_that_stalls_is_a_read_timeout(head: bytes) -> None:
    """What was already received is handed over; then silence past the read timeout is an error."""

    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(5)
        return False

    received: list[bytes] = []

    async def read_all(http: httpx2.AsyncClient, url: str) -> None:
        async with http.stream("POST", url, content=b"{}") as response:
            async for part in response.aiter_bytes():
                received.append(part)

    async with scripted(reply) as server, client(read=0.3) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await read_all(http, server.url)
    assert received  # what came before the stall was handed over
    assert b"".join(received) in head


async def test_nothing_listening_is_a_connect_error() -> None:
    async with scripted(json_reply()) as server:
        url = server.url
    async with client() as http:
        with pytest.raises(httpx2.ConnectError):
            await post(http, url)


@pytest.mark.parametrize(
    ("head", "error"),
    [
        (b"HTTP/1.1 OK\r\n\r\n", "status line"),
        (b"HTTP/2 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", "transfer coding"),
        # A coding under the chunked one would hand its coded bytes on as the body (h11 refuses it too).
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "transfer coding"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n", "coding"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "transfer coding"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n", "exceeds"),
        # No upgrade was asked for (h11 refuses it too): taken as the answer, it was read to the
        # connection's end, and a server keeping it open held the request for the read timeout.
        (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", "101"),
    ],
)
async def test_malformed_answers_are_protocol_errors(head: bytes, error: str) -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(head)
        return False

    async with scripted(reply) as server, client() as http:
        with pytest.raises(httpx2.RemoteProtocolError, match=error):
            await post(http, server.url)


async def test_header_injection_is_refused_before_anything_is_sent() -> None:
    async with scripted(json_reply()) as server, client() as http:
        with pytest.raises(httpx2.LocalProtocolError, match="CR, LF or NUL"):
            await http.post(server.url, content=b"{}", headers={"mcp-name": "echo\r\nx-evil: 1"})
    assert server.requests == []


async def test_large_bodies_go_out_whole() -> None:
    body = b"[" + b"1," * 200_000 + b"1]"

    async def reply(number: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        size = str(len(request.partition(b"\r\n\r\n")[2])).encode()
        return await json_reply(size)(number, request, writer)

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url, body)).json() == len(body)


async def test_a_streamed_body_goes_out_with_its_length() -> None:
    """httpx2 frames a body of unknown length as chunked; the transport reads it whole and sends it
    with `Content-Length` instead (the scripted server reads bodies by length only)."""

    async def parts() -> AsyncIterator[bytes]:
        yield b'{"a":'
        yield b"1}"

    async def reply(number: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        return await json_reply(request.partition(b"\r\n\r\n")[2])(number, request, writer)

    async with scripted(reply) as server, client() as http:
        response = await http.post(server.url, content=parts())
    assert response.json() == {"a": 1}
    assert b"transfer-encoding" not in server.requests[0].lower()
    assert b"\r\ncontent-length: 7\r\n" in server.requests[0].lower()


async def test_only_plain_http_is_spoken() -> None:
    async with client() as http:
        with pytest.raises(httpx2.UnsupportedProtocol):
            await http.post("https://127.0.0.1:1/mcp", content=b"{}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payload=st.binary(min_size=0, max_size=3000),
    chunk_sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20),
)
def test_any_chunking_and_any_segmenting_give_back_the_body(
    payload: bytes, chunk_sizes: list[int], cuts: list[int]
) -> None:
    """However the body is chunked, and however the bytes are split on the wire, it comes back whole."""
    encoded = bytearray()
    rest, sizes = payload, iter(chunk_sizes * 100)
    while rest:
        size = next(sizes)
        encoded += b"%x\r\n%s\r\n" % (size if size <= len(rest) else len(rest), rest[:size])
        rest = rest[size:]
    encoded += b"0\r\n\r\n"
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + bytes(encoded)

    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        at, pieces = 0, iter(cuts * 1000)
        while at < len(wire):
            step = next(pieces)
            writer.write(wire[at : at + step])
            await writer.drain()
            at += step
        return True

    async def run() -> None:
        async with scripted(reply) as server, client() as http:
            response = await post(http, server.url)
            assert response.content == payload
            assert (await post(http, server.url)).content == payload  # and the connection was reusable
            assert server.connections == 1

    asyncio.run(run())


# -- Dechunker: the chunked coding undone as the bytes arrive --------------------------------------


def _chunked(payload: bytes, sizes: list[int], extension: bytes, trailer: bytes) -> bytes:
    encoded, rest, cycle = bytearray(), payload, iter(sizes * (len(payload) + 1))
    while rest:
        size = min(next(cycle), len(rest))
        encoded += b"%x%s\r\n%s\r\n" % (size, extension, rest[:size])
        rest = rest[size:]
    return bytes(encoded) + b"0%s\r\n%s\r\n" % (extension, trailer)


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=2000),
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=6),
    extension=st.sampled_from([b"", b";ext=1", b" ; name=value"]),
    trailer=st.sampled_from([b"", b"x-trailer: yes\r\n", b"a: 1\r\nb: 2\r\n"]),
    after=st.binary(max_size=20),
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=20),
)
def test_the_dechunker_gives_back_the_body_however_the_bytes_arrive(
    payload: bytes, sizes: list[int], extension: bytes, trailer: bytes, after: bytes, cuts: list[int]
) -> None:
    wire = _chunked(payload, sizes, extension, trailer) + after
    dechunker = http11.Dechunker()
    body, at, steps = bytearray(), 0, iter(cuts * (len(wire) + 1))
    while not dechunker.done:
        assert at < len(wire), "the body's end was not found"
        step = next(steps)
        body += dechunker.feed(wire[at : at + step])
        at += step
    assert bytes(body) == payload
    assert dechunker.rest + wire[at:] == after  # nothing of what followed is lost or taken as body


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        (b"zz\r\n", "malformed chunk size"),
        (b"-5\r\nhello\r\n", "malformed chunk size"),
        # Not 1*HEXDIG, though `int(..., 16)` takes them: a peer framing the body otherwise would
        # disagree with this client on where it ends, and on a kept-alive connection about the next
        # answer's start.
        (b"0x5\r\nhello\r\n", "malformed chunk size"),
        (b"+5\r\nhello\r\n", "malformed chunk size"),
        (b"0_5\r\nhello\r\n", "malformed chunk size"),
        (b"\x0b5\r\nhello\r\n", "malformed chunk size"),
        (b"5\x0c\r\nhello\r\n", "malformed chunk size"),
        (b"-0\r\n\r\n", "malformed chunk size"),
        (b"1" * 17 + b"\r\n", "malformed chunk size"),
        (b"5\r\nhelloXX", "not followed by CRLF"),
        (b"5" * (http11.HEAD_LIMIT + 1), "a line without an end"),
        (b"0\r\n" + b"x" * (http11.HEAD_LIMIT + 1), "a line without an end"),
    ],
)
def test_the_dechunker_refuses_a_malformed_body(wire: bytes, error: str) -> None:
    with pytest.raises(httpx2.RemoteProtocolError, match=error):
        http11.Dechunker().feed(wire)


async def test_bytes_after_a_chunked_body_keep_its_connection_from_being_reused() -> None:
    async def reply(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nstray")
        return True

    async with scripted(reply) as server, client() as http:
        assert (await post(http, server.url)).content == b"ok"
        assert (await post(http, server.url)).content == b"ok"
    assert server.connections == 2  # the first connection, out of step, was closed


# -- post_message: the upstream's message POSTs, straight to this transport ---------------------


def _upstream_client(url: str, read: float = 5.0) -> UpstreamClient:
    settings = HttpUpstreamSettings(url=url, max_message_bytes=1 << 20, read_timeout=read)
    http = make_http_client(settings)
    assert isinstance(http, UpstreamClient)
    assert http.lean is not None
    return http


async def test_a_message_post_is_the_request_the_client_itself_would_send() -> None:
    """Same bytes on the wire as the client's own `send` (its default headers under the request's,
    Host, length), and the cookie the first answer set goes back on both."""
    cookie = b"set-cookie: affinity=node-2; Path=/\r\n"

    async def reply(n: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        return await json_reply(extra=cookie if n == 1 else b"")(n, request, writer)

    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with scripted(reply) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        for _ in range(2):
            response = await post_message(http, url, b'{"q":1}', headers)
            assert (await response.aread()) == b'{"ok":true}'
        await http.send(http.build_request("POST", url, content=b'{"q":1}', headers=headers))
    first, lean, own = server.requests
    assert b"cookie:" not in first.lower()
    assert b"\r\ncookie: affinity=node-2\r\n" in lean.lower()
    assert lean == own
    assert b"\r\nuser-agent: mcp-backfill/" in lean.lower()
    assert server.connections == 1


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"accept": "application/json, text/event-stream", "content-type": "application/json"},
        {"Accept": "text/event-stream", "User-Agent": "another/1"},  # the client's own, overridden
        {"mcp-session-id": "abc", "mcp-protocol-version": "2025-11-25", "x-upstream-token": "t"},
        {"connection": "close"},
    ],
)
async def test_a_message_post_without_cookies_is_the_request_the_client_itself_would_send(
    headers: dict[str, str],
) -> None:
    """The head rendered once and reused: the same bytes as the client's own `send`, for the first
    POST and for the next, which reuses it with another body."""
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        for body in (b'{"q":1}', b'{"q":"longer"}'):
            response = await post_message(http, url, body, headers)
            assert (await response.aread()) == b'{"ok":true}'
            await http.send(http.build_request("POST", url, content=body, headers=headers))
    assert len(server.requests) == 4
    assert server.requests[0] == server.requests[1]
    assert server.requests[2] == server.requests[3]
    assert server.connections == (4 if "connection" in headers else 1)


async def test_a_reused_message_head_follows_changes_to_the_clients_headers() -> None:
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        await (await post_message(http, url, b"{}", {"a": "1"})).aread()
        http.headers["x-added"] = "later"
        await (await post_message(http, url, b"{}", {"a": "1"})).aread()
        await (await post_message(http, url, b"{}", {"a": "2"})).aread()
    first, second, third = (request.lower() for request in server.requests)
    assert b"x-added" not in first
    assert b"\r\nx-added: later\r\n" in second
    assert b"\r\na: 2\r\n" in third


async def test_a_message_post_with_a_forbidden_header_value_sends_nothing() -> None:
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        for _ in range(2):  # and nothing was kept that would let the second through
            with pytest.raises(httpx2.LocalProtocolError):
                await post_message(http, httpx2.URL(server.url), b"{}", {"x-evil": "a\r\nx-injected: 1"})
    assert server.requests == []


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789", min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    client_headers=st.dictionaries(_TOKEN, _TOKEN, max_size=4),
    headers=st.dictionaries(
        st.one_of(_TOKEN, st.sampled_from(["Accept", "user-agent", "Content-Length", "transfer-encoding"])),
        _TOKEN,
        max_size=5,
    ),
    bodies=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=3),
)
def test_a_reused_message_head_renders_what_the_client_would(
    client_headers: dict[str, str], headers: dict[str, str], bodies: list[bytes]
) -> None:
    """Any header names and values, overriding the client's or not, and any bodies: a reusable head
    gives the head the client's own request would go out with; a length among the headers makes it
    not reusable (and a transfer coding may)."""
    http = _upstream_client("http://127.0.0.1:9/mcp")
    http.headers.update(client_headers)
    url = httpx2.URL("http://127.0.0.1:9/mcp")
    for body in bodies:
        head = http.message_head(url, headers)
        named = {name.lower() for name in headers}
        if "content-length" in named:
            assert head is None
            continue
        if head is None:  # httpx2 does not put the length last next to a transfer coding: not reused
            assert "transfer-encoding" in named
            continue
        own = http11.Outgoing.of(http.build_request("POST", url, content=body, headers=headers), body)
        assert head.outgoing(body, {}).head == own.head


def test_a_message_head_is_not_reused_when_the_headers_name_a_length() -> None:
    """Not even one that looks like the probe's own (the last header, saying 1)."""
    http = _upstream_client("http://127.0.0.1:9/mcp")
    url = httpx2.URL("http://127.0.0.1:9/mcp")
    assert http.message_head(url, {"a": "1", "Content-Length": "1"}) is None
    assert http.message_head(url, {"a": "1"}) is not None


@pytest.mark.parametrize("encoding", [None, "gzip", "identity"])
async def test_body_chunks_give_what_aiter_bytes_gives(encoding: str | None) -> None:
    """Straight from the transport when nothing is encoded; decoded as httpx2 decodes otherwise."""
    plain = b'{"jsonrpc":"2.0","id":1,"result":{}}' * 20
    body = gzip.compress(plain) if encoding == "gzip" else plain
    extra = b"content-encoding: %s\r\n" % encoding.encode() if encoding else b""
    async with scripted(json_reply(body, extra)) as server, _upstream_client(server.url) as http:
        for read in ("chunks", "aiter_bytes"):
            response = await post_message(http, httpx2.URL(server.url), b"{}", {})
            assert isinstance(response.stream, http11._Body)  # as the sidecar's POSTs get it
            if read == "chunks":
                received = b"".join([chunk async for chunk in http11.body_chunks(response)])
            else:
                received = b"".join([chunk async for chunk in response.aiter_bytes()])
            await response.aclose()
            assert received == plain
        assert server.connections == 1  # read to its end, the connection went back to the pool


async def test_a_message_post_keeps_the_clients_timeouts() -> None:
    async def reply(*_: object) -> bool:
        await asyncio.sleep(5)
        return False

    async with scripted(reply) as server, _upstream_client(server.url, read=0.2) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await post_message(http, httpx2.URL(server.url), b"{}", {})


async def test_a_client_without_the_lean_transport_posts_through_httpx2() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={"ok": True})

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler), headers={"x-a": "1"}) as http:
        response = await post_message(http, httpx2.URL("http://127.0.0.1:9/mcp"), b"{}", {"x-b": "2"})
        assert (await response.aread()) == b'{"ok":true}'
    (request,) = seen
    assert (request.headers["x-a"], request.headers["x-b"], request.content) == ("1", "2", b"{}")


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


async def test_a_message_post_written_at_once_is_answered_without_being_sent_again() -> None:
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        assert write_message_now(http, url, b'{"q":1}', {}) is None  # no idle connection yet
        await asyncio.sleep(0.01)
        assert server.requests == []
        await (await post_message(http, url, b'{"q":1}', {})).aread()
        written = write_message_now(http, url, b'{"q":2}', {})
        assert written is not None
        with anyio.fail_after(5):
            await _until(lambda: len(server.requests) == 2)  # on the wire before anyone awaits it
        response = await post_message(http, url, b'{"q":2}', {}, written)
        assert (await response.aread()) == b'{"ok":true}'
    assert server.requests[1].endswith(b'{"q":2}')
    assert len(server.requests) == 2
    assert server.connections == 1


async def test_a_post_written_at_once_on_a_stale_connection_goes_again_on_a_new_one() -> None:
    async with scripted(_resetting_on_the_second) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        await (await post_message(http, url, b"{}", {})).aread()
        written = write_message_now(http, url, b'{"again":1}', {})
        assert written is not None
        response = await post_message(http, url, b'{"again":1}', {}, written)
        assert response.status_code == 200
    assert [request.endswith(b'{"again":1}') for request in server.requests] == [False, True, True]
    assert server.connections == 2


async def test_a_discarded_post_frees_its_slot_and_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http11, "MAX_CONNECTIONS", 1)
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        await (await post_message(http, url, b"{}", {})).aread()
        written = write_message_now(http, url, b"{}", {})
        assert written is not None
        assert write_message_now(http, url, b"{}", {}) is None  # the one slot is taken
        written.discard()
        with anyio.fail_after(5):
            await (await post_message(http, url, b"{}", {})).aread()
    assert server.connections == 2


async def test_a_request_waits_for_a_slot_up_to_the_pool_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http11, "MAX_CONNECTIONS", 1)
    async with scripted(json_reply()) as server:
        timeout = httpx2.Timeout(5.0, pool=0.05)
        async with httpx2.AsyncClient(transport=Http11Transport(), timeout=timeout) as http:
            request = http.build_request("POST", server.url, content=b"{}")
            holding = await http.send(request, stream=True)  # its body unread: it keeps the slot
            with pytest.raises(httpx2.PoolTimeout):
                await http.post(server.url, content=b"{}")
            async with anyio.create_task_group() as tg:
                waiting: list[httpx2.Response] = []

                async def second() -> None:
                    waiting.append(await http.post(server.url, content=b"{}"))

                tg.start_soon(second)
                await anyio.wait_all_tasks_blocked()
                assert waiting == []
                await holding.aread()  # read to its end: the slot goes to the waiting request
            assert waiting[0].status_code == 200


async def test_an_immediate_write_that_fails_oddly_leaks_no_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http11, "MAX_CONNECTIONS", 1)
    async with scripted(json_reply()) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        await (await post_message(http, url, b"{}", {})).aread()

        def broken(*_: object) -> None:
            raise RuntimeError("the handle is closed")

        with monkeypatch.context() as patch:
            patch.setattr(Http11Transport, "_write", broken)
            with pytest.raises(RuntimeError):
                write_message_now(http, url, b"{}", {})
        with anyio.fail_after(5):  # the one slot is free again, and the connection was dropped
            await (await post_message(http, url, b"{}", {})).aread()
    assert server.connections == 2


async def test_a_cookie_that_is_not_ascii_does_not_break_the_sessions_later_posts() -> None:
    """The jar took it, and every later request failed to be built (UnicodeEncodeError, not a
    transport error): each of the session's requests then failed as an internal error."""

    async def reply(number: int, _: bytes, writer: asyncio.StreamWriter) -> bool:
        cookies = b"set-cookie: caf\xe9=1\r\nset-cookie: plain=1\r\n" if number == 1 else b""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: 2\r\n\r\n{}" % cookies
        )
        return True

    async with scripted(reply) as server, _upstream_client(server.url) as http:
        url = httpx2.URL(server.url)
        for _ in range(3):
            await (await post_message(http, url, b"{}", {})).aread()
        await http.get(server.url)  # httpx2's own way too
    assert len(server.requests) == 4
    assert all(b"cookie: plain=1" in request.lower() for request in server.requests[1:])
