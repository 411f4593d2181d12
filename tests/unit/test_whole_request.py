"""`read_whole`: one whole keep-alive HTTP/1.1 POST read without uvicorn, and nothing else; and
`KnownHead`: the next such POST with the same head but for its length, read as llhttp reads it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from mcp_backfill.sidecar.whole_request import KnownHead, read_whole

BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


def post(*headers: str, body: bytes = BODY, start: str = "POST /mcp HTTP/1.1") -> bytes:
    lines = [start, "Host: 127.0.0.1", *headers, f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Parsed(HttpToolsProtocol):
    """uvicorn's protocol, which only reads: its application is never started."""

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        pass


class _Transport(asyncio.Transport):
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def is_closing(self) -> bool:
        return False


async def _ignored(scope: Any, receive: Any, send: Any) -> None:
    pass


def uvicorn_reads(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """The target, headers and body uvicorn's own protocol reads from `data`."""
    loop = asyncio.new_event_loop()
    try:
        protocol = _Parsed(Config(_ignored, http="httptools"), ServerState(), {}, _loop=loop)
        protocol.connection_made(_Transport())
        protocol.data_received(data)
        scope = protocol.cycle.scope
        return scope["raw_path"], list(scope["headers"]), bytes(protocol.cycle.body)
    finally:
        loop.close()


def test_a_whole_post_is_read_as_uvicorn_reads_it() -> None:
    data = post("Mcp-Session-Id: Ab1", "X-Odd:  spaced  ")
    request = read_whole(data)
    assert request is not None
    assert (request.url, request.headers, request.body) == uvicorn_reads(data)
    assert request.headers[1] == (b"mcp-session-id", b"Ab1")  # names lowercased, values as they came


@pytest.mark.parametrize(
    "data",
    [
        post(start="GET /mcp HTTP/1.1"),
        post(start="POST /mcp HTTP/1.0"),
        post("Connection: close"),
        post("Connection: Upgrade", "Upgrade: websocket"),
        post() + post(),  # two pipelined
        post() + b"GET",  # the start of another
        post()[:-1],  # a body short of its length
        post()[:40],  # a part of the head
        b"NOT HTTP AT ALL\r\n\r\n",
        post("Bad Header Name: x"),
    ],
    ids=[
        "get",
        "http-1.0",
        "connection-close",
        "upgrade",
        "two",
        "another-begun",
        "short-body",
        "part-of-head",
        "not-http",
        "bad-header",
    ],
)
def test_anything_but_one_whole_keep_alive_post_is_left_to_uvicorn(data: bytes) -> None:
    assert read_whole(data) is None


def test_a_chunked_body_is_read_whole() -> None:
    head = b"POST /mcp HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    data = head + b"5\r\nhello\r\n3\r\n!!!\r\n0\r\n\r\n"
    request = read_whole(data)
    assert request is not None
    assert request.body == b"hello!!!"


_names = st.from_regex(r"\A[A-Za-z][A-Za-z0-9-]{0,15}\Z").filter(
    lambda name: name.lower() not in {"content-length", "transfer-encoding", "connection", "upgrade", "host"}
)
_values = st.from_regex(r"\A[!-~]([ -~]{0,30}[!-~])?\Z")
_headers = st.lists(st.tuples(_names, _values), max_size=8)


@given(
    headers=_headers,
    body=st.binary(max_size=300),
    cut=st.integers(min_value=1),
)
def test_any_whole_post_is_read_and_any_part_of_it_is_not(
    headers: list[tuple[str, str]], body: bytes, cut: int
) -> None:
    data = post(*(f"{name}: {value}" for name, value in headers), body=body)
    request = read_whole(data)
    assert request is not None
    assert (request.url, request.headers, request.body) == uvicorn_reads(data)
    assert request.body == body
    assert [name for name, _ in request.headers[1:-1]] == [name.lower().encode() for name, _ in headers]
    assert read_whole(data[: cut % len(data)]) is None


def known(data: bytes) -> KnownHead:
    request = read_whole(data)
    assert request is not None
    head = KnownHead.of(data, request)
    assert head is not None
    return head


def without_length(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [header for header in headers if header[0] != b"content-length"]


@given(
    headers=_headers,
    first=st.binary(max_size=300),
    second=st.binary(max_size=300),
)
def test_the_next_post_with_the_same_head_is_read_from_it_as_llhttp_reads_it(
    headers: list[tuple[str, str]], first: bytes, second: bytes
) -> None:
    lines = [f"{name}: {value}" for name, value in headers]
    head = known(post(*lines, body=first))
    data = post(*lines, body=second)
    request = read_whole(data)
    assert request is not None
    assert head.body_of(data) == request.body == second
    assert without_length(head.headers) == without_length(request.headers)


@given(
    first=st.binary(max_size=40),
    second=st.binary(max_size=40),
    at=st.integers(min_value=0),
    cut=st.integers(min_value=0, max_value=3),
    put=st.binary(max_size=4) | st.sampled_from([b"0", b"1", b"12", b" ", b"\r\n", b"+", b"-"]),
)
def test_whatever_a_known_head_reads_llhttp_reads_the_same(
    first: bytes, second: bytes, at: int, cut: int, put: bytes
) -> None:
    # The same head with its bytes changed anywhere (its length, its other headers, the body):
    # what `body_of` reads is exactly what llhttp reads; anything else is left to llhttp.
    lines = ("Mcp-Session-Id: Ab1", "Accept: application/json, text/event-stream")
    head = known(post(*lines, body=first))
    data = post(*lines, body=second)
    at %= len(data) + 1
    changed = data[:at] + put + data[at + cut :]
    body = head.body_of(changed)
    if body is not None:
        request = read_whole(changed)
        assert request is not None
        assert request.body == body
        assert without_length(request.headers) == without_length(head.headers)


def test_a_head_without_a_length_is_not_kept() -> None:
    data = b"POST /mcp HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    request = read_whole(data)
    assert request is not None
    assert KnownHead.of(data, request) is None


@pytest.mark.parametrize(
    "data",
    [
        post("Mcp-Session-Id: Ab2"),  # another head
        post("Mcp-Session-Id: Ab1") + post("Mcp-Session-Id: Ab1"),  # two
        post("Mcp-Session-Id: Ab1")[:-1],  # short of its length
        post("Mcp-Session-Id: Ab1").replace(b"Content-Length: ", b"Content-Length: +"),
        post("Mcp-Session-Id: Ab1").replace(b"Content-Length: ", b"Content-Length:  "),
        post("Mcp-Session-Id: Ab1").replace(
            b"Content-Length: %d" % len(BODY), b"Content-Length: " + b"0" * 19
        ),
        b"",
    ],
    ids=["another-head", "two", "short", "signed-length", "spaced-length", "too-many-digits", "nothing"],
)
def test_anything_else_is_left_to_llhttp(data: bytes) -> None:
    head = known(post("Mcp-Session-Id: Ab1", body=b"{}"))
    assert head.body_of(data) is None


class _Post:
    """What the guard asks of the lane's post (`LanePost.adopt`), over the real guard."""

    def __init__(self, connection: Any, raw: bytes) -> None:
        self._connection = connection
        self._raw: bytes | None = raw
        self.cycle: Any = None

    def adopt(self) -> Any:
        if self._raw is not None:
            self.cycle = self._connection.adopt(self._raw)
            self._raw = None
        return self.cycle


class _Lane:
    """Takes every read whole, as the lane takes a quick call's."""

    def may_take(self, scope: Any) -> bool:
        return False

    def take_whole(self, connection: Any, data: bytes) -> bool:
        if read_whole(data) is None:
            return False
        connection.lane_post = _Post(connection, data)
        return True


class _Recorded(_Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.reading = True

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _guarded(loop: asyncio.AbstractEventLoop) -> tuple[Any, _Recorded]:
    from mcp_backfill.sidecar.connections import guarded_protocol

    protocol_class = guarded_protocol(10.0, 100, _Lane())  # type: ignore[arg-type]
    protocol = protocol_class(Config(_ignored, http="httptools"), ServerState(), {}, _loop=loop)
    transport = _Recorded()
    protocol.connection_made(transport)
    return protocol, transport


def test_a_request_read_whole_gets_uvicorns_cycle_only_when_bytes_come_behind_it() -> None:
    loop = asyncio.new_event_loop()
    try:
        protocol, transport = _guarded(loop)
        protocol.data_received(post())
        assert protocol.cycle is None  # uvicorn never read it
        post_ = protocol.lane_post
        protocol.data_received(post(body=b'{"jsonrpc":"2.0","id":2,"method":"ping"}'))
        cycle = post_.cycle
        assert cycle is not None
        assert cycle.scope["path"] == "/mcp"
        assert not cycle.response_complete
        assert not protocol.tasks  # its application was not started: the lane holds it
        assert len(protocol.pipeline) == 1  # the next waits for its answer
        assert not transport.reading
    finally:
        loop.close()


def test_a_shutdown_lets_a_request_read_whole_have_its_answer_then_closes() -> None:
    loop = asyncio.new_event_loop()
    try:
        protocol, transport = _guarded(loop)
        protocol.data_received(post())
        protocol.shutdown()
        assert not transport.closed
        assert protocol.lane_post.cycle.keep_alive is False  # its answer says `connection: close`
    finally:
        loop.close()
