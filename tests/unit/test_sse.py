"""The SSE decoder: exact payload bytes, every line ending, any chunking, bounded memory."""

from __future__ import annotations

import pytest

from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.transports.http_upstream.sse import RETRY_LIMIT, SseDecoder, SseEvent

STREAM = (
    b": ping\r\n\r\n"
    b"id: e1\r\nretry: 100\r\ndata:\r\n\r\n"
    b'event: message\r\nid: e2\r\ndata: {"jsonrpc":"2.0","method":"n","params":{"t":"\xc3\xa9"}}\r\n\r\n'
    b'data: {"a":\ndata: 1}\n\n'
    b'id: e3\rdata: {"jsonrpc":"2.0","id":7,"result":{}}\r\r'
)
EXPECTED = [
    SseEvent(data=b"", id="e1", retry=100),
    SseEvent(data=b'{"jsonrpc":"2.0","method":"n","params":{"t":"\xc3\xa9"}}', id="e2"),
    SseEvent(data=b'{"a":\n1}'),
    SseEvent(data=b'{"jsonrpc":"2.0","id":7,"result":{}}', id="e3"),
]


def decode_all(decoder: SseDecoder, chunks: list[bytes]) -> list[SseEvent]:
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events


def test_events_with_every_line_ending_keep_their_bytes() -> None:
    assert decode_all(SseDecoder(1024), [STREAM]) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_any_chunking_gives_the_same_events(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert decode_all(SseDecoder(1024), chunks) == EXPECTED


@pytest.mark.parametrize("ending", [b"\r", b"\r\n"])
def test_an_event_ended_by_a_cr_is_dispatched_before_the_next_byte(ending: bytes) -> None:
    """A CR that ends the bytes read so far ends its line at once (an LF right after it, in the next
    read, is the rest of that ending): held as perhaps half of a CRLF, the event waited for the next
    byte, which never came when the stream ended there (the request went unanswered)."""
    decoder = SseDecoder(100)
    assert decoder.feed(b"data: a" + ending[:1]) == []
    [event] = decoder.feed(ending[:1])
    assert event.data == b"a"
    rest = decode_all(decoder, [ending[1:], ending[1:], b"data: b", ending, ending])
    assert [event.data for event in rest] == [b"b"]


def test_other_event_types_are_reported_with_their_type() -> None:
    [event] = SseDecoder(100).feed(b"event: endpoint\ndata: /messages\n\n")
    assert (event.event, event.data) == ("endpoint", b"/messages")


def test_an_oversized_event_is_summarised_and_the_stream_goes_on() -> None:
    big = b'{"jsonrpc":"2.0","id":"big-1","result":{"pad":"' + b"x" * 5000 + b'"}}'
    decoder = SseDecoder(1024)
    chunks = [b"id: e9\ndata: ", *(big[i : i + 100] for i in range(0, len(big), 100)), b"\n\n"]
    chunks.append(b'data: {"jsonrpc":"2.0","id":2,"result":{}}\n\n')
    first, second = decode_all(decoder, chunks)
    assert isinstance(first.data, MessageTooLarge)
    assert first.id == "e9"
    assert first.data.size == len(big)
    assert first.data.head.startswith(b'{"jsonrpc":"2.0","id":"big-1"')
    assert first.data.tail.endswith(b'"}}')
    assert second.data == b'{"jsonrpc":"2.0","id":2,"result":{}}'
    assert len(decoder._line) == 0  # nothing of the big line stayed buffered


def test_many_small_data_lines_count_towards_the_limit() -> None:
    lines = b"".join(b"data: " + b"y" * 50 + b"\n" for _ in range(40))
    [event] = SseDecoder(1024).feed(lines + b"\n")
    assert isinstance(event.data, MessageTooLarge)
    assert event.data.size == 40 * 50 + 39  # the joining newlines count too


def test_an_incomplete_event_at_the_end_is_not_dispatched() -> None:
    assert SseDecoder(100).feed(b'data: {"partial": true}\n') == []


@pytest.mark.parametrize("size", [1, 2, 3, 64])
def test_a_byte_order_mark_at_the_start_is_dropped(size: int) -> None:
    """The spec's one leading U+FEFF; it used to turn the first line into `\\ufeffdata`, and the
    first event (often the whole answer) was lost. Only at the start: later it is data."""
    stream = b'\xef\xbb\xbfdata: {"a":1}\n\ndata: \xef\xbb\xbf\n\n'
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert [event.data for event in decode_all(SseDecoder(1000), chunks)] == [b'{"a":1}', b"\xef\xbb\xbf"]


def test_an_oversized_line_ended_by_a_lone_cr_at_a_read_boundary_still_ends() -> None:
    """The CR that ends the bytes read so far may be the whole line ending; while an oversized line
    streamed it used to be dropped with the line's bytes, so the line never ended and swallowed the
    next event."""
    events = decode_all(SseDecoder(10), [b"data: " + b"x" * 40, b"yy\r", b"\r", b"data: small\r\r", b":\n"])
    assert [type(event.data) for event in events] == [MessageTooLarge, bytes]
    assert events[1].data == b"small"


@pytest.mark.parametrize("digits", [b"86400001", b"9" * 400, b"9" * 5000])
def test_a_retry_past_a_day_counts_as_a_day(digits: bytes) -> None:
    [event] = SseDecoder(100).feed(b"retry: " + digits + b"\ndata: x\n\n")
    assert (event.data, event.retry) == (b"x", RETRY_LIMIT)
