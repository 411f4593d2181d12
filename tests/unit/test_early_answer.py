"""`EarlyAnswer`: an upstream's answer read from the connection's read callback (`early.py`).

Fed the bytes of an answer in any split, it hands on each message an event or JSON body brings, in
order, once; it reports the answer read whole (and whether the connection may be reused), or gives
it up to the exchange's task at the first thing that is not a plain answer, taking nothing after.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.transports.http_upstream.early import EarlyAnswer, WatchedReader

LIMIT = 64 * 1024


@dataclass
class Told:
    """What an `EarlyAnswer` told its exchange."""

    refuse_after: int | None = None  # take this many messages, then refuse
    taken: list[bytes] = field(default_factory=list)
    gave_up: int = 0
    finished: list[bool] = field(default_factory=list)

    def take(self, data: bytes) -> bool:
        if self.refuse_after is not None and len(self.taken) >= self.refuse_after:
            return False
        self.taken.append(data)
        return True

    def gave_up_now(self) -> None:
        self.gave_up += 1


class _Hooks:
    def __init__(self, told: Told) -> None:
        self._told = told

    def take(self, data: bytes) -> bool:
        return self._told.take(data)

    def gave_up(self) -> None:
        self._told.gave_up_now()

    def finished(self, reusable: bool) -> None:
        self._told.finished.append(reusable)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def read(
    loop: asyncio.AbstractEventLoop, chunks: list[bytes], told: Told, max_bytes: int = LIMIT
) -> WatchedReader:
    reader = WatchedReader(limit=LIMIT, loop=loop)
    EarlyAnswer(reader, _Hooks(told), max_bytes)
    for chunk in chunks:
        reader.feed_data(chunk)
    return reader


def message(n: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}}).encode()


ANSWER = b'{"jsonrpc":"2.0","id":7,"result":{"ok":true}}'


def sse_answer(*datas: bytes, headers: bytes = b"", chunked: bool = True) -> bytes:
    body = b"id: p-0\nretry: 100\ndata:\n\n" + b"".join(
        b"event: message\ndata: " + d + b"\n\n" for d in datas
    )
    if chunked:
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        framing = b"transfer-encoding: chunked\r\n"
    else:
        framed, framing = body, b"content-length: %d\r\n" % len(body)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + framing + headers + b"\r\n" + framed


def json_answer(body: bytes = ANSWER, status: bytes = b"200 OK", headers: bytes = b"") -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (status, len(body))
    return head + headers + b"\r\n" + body


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if data[a:b]]


@given(cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12), chunked=st.booleans())
def test_an_event_stream_in_any_split_hands_on_each_message_once_in_order(
    cuts: list[int], chunked: bool
) -> None:
    loop = asyncio.new_event_loop()
    try:
        told = Told()
        data = sse_answer(message(1), message(2), ANSWER, chunked=chunked)
        reader = read(loop, splits(data, cuts), told)
        assert told.taken == [message(1), message(2), ANSWER]
        assert told.finished == [True]
        assert told.gave_up == 0
        assert reader.watch is None
    finally:
        loop.close()


@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_a_json_answer_in_any_split_is_handed_on_whole(cuts: list[int]) -> None:
    loop = asyncio.new_event_loop()
    try:
        told = Told()
        read(loop, splits(json_answer(), cuts), told)
        assert told.taken == [ANSWER]
        assert told.finished == [True]
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (json_answer(status=b"404 Not Found"), "an HTTP error is the task's"),
        (json_answer(status=b"202 Accepted"), "so is any status but 200"),
        (json_answer(headers=b"set-cookie: lb=7\r\n"), "cookies go to the client's jar"),
        (json_answer(headers=b"content-encoding: gzip\r\n"), "a coded body is not plain"),
        (json_answer(b'[{"jsonrpc":"2.0","id":7,"result":{}}]'), "a batch is split by the task"),
        (json_answer().replace(b"application/json", b"text/plain"), "an unknown content type"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", "no content type at all"),
        (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + ANSWER, "a body ended by the close"),
        (b"NOT HTTP AT ALL\r\n\r\n", "what does not parse"),
    ],
)
def test_what_is_not_a_plain_answer_is_given_up_taking_nothing(
    loop: asyncio.AbstractEventLoop, data: bytes, why: str
) -> None:
    told = Told()
    reader = read(loop, [data], told)
    reader.feed_eof()
    assert told.taken == [], why
    assert told.gave_up == 1, why
    assert told.finished == [], why
    assert reader.watch is None


def test_a_message_not_taken_gives_the_rest_up_and_nothing_after_it_is_taken(
    loop: asyncio.AbstractEventLoop,
) -> None:
    told = Told(refuse_after=1)
    reader = read(loop, [sse_answer(message(1), message(2), ANSWER)], told)
    assert told.taken == [message(1)]
    assert told.gave_up == 1
    assert told.finished == []
    data = sse_answer(message(1), message(2), ANSWER)
    assert bytes(reader._buffer) == data  # type: ignore[attr-defined]  # all kept for the task


def test_an_answer_the_server_closes_the_connection_after_is_not_reused(
    loop: asyncio.AbstractEventLoop,
) -> None:
    told = Told()
    read(loop, [json_answer(headers=b"connection: close\r\n")], told)
    assert told.finished == [False]


def test_bytes_after_the_answer_leave_the_connection_out_of_step(loop: asyncio.AbstractEventLoop) -> None:
    told = Told()
    read(loop, [json_answer() + b"HTTP/1.1 200 OK\r\n"], told)
    assert told.taken == [ANSWER]
    assert told.finished == [False]


def test_an_answer_larger_than_the_reader_holds_is_given_up(loop: asyncio.AbstractEventLoop) -> None:
    told = Told()
    big = b'{"jsonrpc":"2.0","id":7,"result":{"pad":"' + b"x" * (3 * LIMIT) + b'"}}'
    read(loop, splits(json_answer(big), list(range(0, len(big), 16 * 1024))), told)
    assert told.gave_up == 1
    assert told.taken == []


def test_a_message_over_the_size_limit_is_given_up(loop: asyncio.AbstractEventLoop) -> None:
    told = Told()
    read(loop, [sse_answer(message(1), b'{"pad":"' + b"y" * 500 + b'"}', ANSWER)], told, max_bytes=200)
    assert told.taken == [message(1)]
    assert told.gave_up == 1


def test_the_connection_ending_mid_answer_gives_it_up(loop: asyncio.AbstractEventLoop) -> None:
    told = Told()
    reader = read(loop, [sse_answer(message(1), ANSWER)[:-40]], told)
    assert told.gave_up == 0
    reader.feed_eof()
    assert told.gave_up == 1
    assert told.finished == []


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (sse_answer(message(1), ANSWER), "read to its end"),
        (json_answer(), "a JSON answer read to its end"),
        (json_answer(status=b"500 Internal Server Error"), "given up"),
        (b"NOT HTTP AT ALL\r\n\r\n", "given up at a parser error"),
        (sse_answer(message(1), ANSWER)[:-40], "given up at the connection's end"),
    ],
)
def test_an_answer_that_ended_is_freed_without_the_garbage_collector(
    loop: asyncio.AbstractEventLoop, data: bytes, why: str
) -> None:
    """Its parser holds its callbacks: a reference cycle that, left in place, made every answer and
    the exchange it holds garbage only the collector could free."""
    told = Told()
    reader = WatchedReader(limit=LIMIT, loop=loop)
    answer = weakref.ref(EarlyAnswer(reader, _Hooks(told), LIMIT))
    gc.disable()
    try:
        reader.feed_data(data)
        reader.feed_eof()
        assert reader.watch is None, why
        assert answer() is None, why
    finally:
        gc.enable()
