"""`OneWriteResponse`: a response of known length goes out in one write, a stream's head at once."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

from mcp_backfill.sidecar.connections import BIG_WRITE, OneWriteResponse


@dataclass
class Cycle:
    """What the wrapper reads of uvicorn's response cycle."""

    response_started: bool = False
    chunked_encoding: bool | None = None
    transport: Any = None
    scope: dict[str, Any] = field(default_factory=lambda: {"http_version": "1.1"})
    keep_alive: bool = True


@dataclass
class Transport:
    writes: list[bytes] = field(default_factory=list)
    closed: bool = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def wrapped(cycle: Cycle) -> tuple[OneWriteResponse, Transport]:
    transport = Transport()
    return OneWriteResponse(cast(asyncio.Transport, transport), cycle), transport


def test_a_response_of_known_length_goes_out_in_one_write() -> None:
    cycle = Cycle()
    wrapper, transport = wrapped(cycle)
    cycle.response_started, cycle.chunked_encoding = True, False
    wrapper.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert transport.writes == []
    wrapper.write(b"{}")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


def test_an_empty_body_still_sends_the_head() -> None:
    cycle = Cycle(response_started=True, chunked_encoding=False)
    wrapper, transport = wrapped(cycle)
    wrapper.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
    wrapper.write(b"")
    assert transport.writes == [b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"]


def test_a_big_body_follows_the_head_in_the_same_call() -> None:
    cycle = Cycle(response_started=True, chunked_encoding=False)
    wrapper, transport = wrapped(cycle)
    body = b"x" * BIG_WRITE
    wrapper.write(b"head\r\n\r\n")
    wrapper.write(body)
    assert transport.writes == [b"head\r\n\r\n" + body]


def test_a_streamed_response_has_its_head_written_at_once() -> None:
    cycle = Cycle(response_started=True, chunked_encoding=True)
    wrapper, transport = wrapped(cycle)
    wrapper.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert len(transport.writes) == 1
    wrapper.write(b"5\r\nhello\r\n")
    assert len(transport.writes) == 2


def test_a_stream_to_an_http10_client_goes_without_chunks() -> None:
    cycle = Cycle(
        response_started=True, chunked_encoding=True, scope={"http_version": "1.0"}, keep_alive=False
    )
    wrapper, transport = wrapped(cycle)
    wrapper.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n")
    wrapper.write(b"5\r\nhello\r\n")
    wrapper.write(b"0\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", b"hello"]


def test_writes_before_the_response_starts_go_out_as_they_come() -> None:
    cycle = Cycle()
    wrapper, transport = wrapped(cycle)
    wrapper.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.response_started, cycle.chunked_encoding = True, False
    wrapper.write(b"head")
    wrapper.write(b"body")
    wrapper.write(b"more")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", b"headbody", b"more"]


def test_closing_sends_a_held_head_first_and_the_rest_passes_through() -> None:
    cycle = Cycle(response_started=True, chunked_encoding=False)
    wrapper, transport = wrapped(cycle)
    wrapper.write(b"head")
    wrapper.close()
    assert transport.writes == [b"head"]
    assert transport.closed
    assert wrapper.get_extra_info("peername") == "extra peername"


def test_a_cycle_and_its_wrapped_transport_are_freed_without_the_garbage_collector() -> None:
    """uvicorn's cycle holds the wrapper as its transport: the wrapper must not hold the cycle back
    (a reference cycle would keep each request's body until a full collection)."""
    cycle = Cycle()
    cycle.transport, _ = wrapped(cycle)
    probe = weakref.ref(cycle)
    gc.disable()
    try:
        del cycle
        assert probe() is None
    finally:
        gc.enable()


def test_unchunked_takes_the_data_out_of_uvicorns_chunks() -> None:
    from mcp_backfill.sidecar.connections import unchunked

    assert unchunked(b"5\r\nevent\r\n") == b"event"
    assert unchunked(b"b\r\ndata: x\r\n\r\n\r\n0\r\n\r\n") == b"data: x\r\n\r\n"
    assert unchunked(b"0\r\n\r\n") == b""
