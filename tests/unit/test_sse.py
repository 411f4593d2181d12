"""The SSE decoder: exact payload bytes, every line ending, any chunking, bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

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
    SseEvent(data=b"", id="e1"),
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
    decoder = SseDecoder(1024)
    assert decode_all(decoder, [STREAM]) == EXPECTED
    assert decoder.retry == 100


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
    decoder = SseDecoder(100)
    [event] = decoder.feed(b"retry: " + digits + b"\ndata: x\n\n")
    assert (event.data, decoder.retry) == (b"x", RETRY_LIMIT)


@pytest.mark.parametrize(
    ("stream", "retry"),
    [
        (b"retry: 2500\n", 2500),  # no event follows (the stream ended, or broke off, there)
        (b'retry: 2500\ndata: {"partial"', 2500),  # its event never completes
        (b"retry: 2500\n\n", 2500),  # an event with no data: none is dispatched
        (b"retry:2500\r", 2500),
        (b"retry: 0\n", 0),
        (b"retry: 2500\nretry: 10\n", 10),
        (b"retry: 2500\nretry: 1x\n", 2500),  # not only digits: ignored
        (b"retry: 2500\nretry:\n", 2500),
        (b"retry: 2500\nretry: 12 \n", 2500),
        (b"retry: 2500\nretry:  7\n", 2500),  # only one space goes after the colon
        (b"retry: 2500\nretry: -1\n", 2500),
        (b"retry: 2500\nretry: \xc2\xb2\n", 2500),  # a superscript two is no ASCII digit
        (b"retry: 2500", None),  # an unended line is not a line yet
        (b": retry: 2500\n", None),
        (b"data: retry: 2500\n\n", None),
    ],
)
def test_a_retry_field_sets_the_reconnection_time_when_it_is_read(stream: bytes, retry: int | None) -> None:
    """The spec sets the reconnection time as the `retry:` line is processed, whether or not an event
    is dispatched after it: it took effect only with its event, so a `retry:` whose event never
    ended (the stream ended or broke off first) was lost, and the stream reopened at the default
    pace instead of the server's."""
    decoder = SseDecoder(100)
    decoder.feed(stream)
    assert decoder.retry == retry


@given(
    st.lists(st.sampled_from([b"retry: 70\n", b"retry: 7x\n", b"data: a\n", b"\n", b": c\n", b"id: 9\n"])),
    st.lists(st.integers(min_value=1, max_value=7), max_size=20),
)
def test_the_reconnection_time_is_the_last_valid_retry_read_whatever_the_chunking(
    lines: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(lines)
    decoder = SseDecoder(100)
    start = 0
    for size in [*cuts, len(stream)]:
        chunk, start = stream[start : start + size], start + size
        decoder.feed(chunk)
        read = stream[:start]
        complete = read[: read.rfind(b"\n") + 1]
        assert decoder.retry == (70 if b"retry: 70\n" in complete else None)


def _seen(event: SseEvent) -> tuple[object, ...]:
    data = event.data
    if isinstance(data, MessageTooLarge):  # its size and tail (its head is what was held when it overflowed)
        return ("too large", data.size, data.tail, event.event, event.id)
    return (data, event.event, event.id)


_FIELDS = st.sampled_from(
    [
        b"data: a",
        b"data:b",
        b"data: " + b"x" * 40,
        b"event: message",
        b"event: other",
        b"id: 7",
        b"id:",
        b": c",
        b"retry: 90",
        b"",
    ]
)
_ENDINGS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(
    st.booleans(),
    st.lists(st.tuples(_FIELDS, _ENDINGS), max_size=14),
    st.lists(st.integers(min_value=1, max_value=24), max_size=12),
)
def test_whole_lines_in_one_read_give_what_they_give_byte_by_byte(
    bom: bool, lines: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    """Reads that bring whole lines are split at once (the common case: a whole event per read);
    whatever the reads, with every line ending, a byte order mark and lines over the limit, the
    events and the reconnection time are those of the same bytes read one at a time."""
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(field + ending for field, ending in lines)
    chunks, start = [], 0
    for size in [*cuts, len(stream)]:
        chunks.append(stream[start : start + size])
        start += size
    one_by_one, chunked = SseDecoder(24), SseDecoder(24)
    expected = decode_all(one_by_one, [stream[i : i + 1] for i in range(len(stream))])
    assert [_seen(e) for e in decode_all(chunked, [c for c in chunks if c])] == [_seen(e) for e in expected]
    assert chunked.retry == one_by_one.retry


def read_as_early(decoder: SseDecoder, chunks: list[bytes]) -> list[SseEvent]:
    """As an answer read early reads them: `lone_message` first, `feed` when it says no."""
    events: list[SseEvent] = []
    for chunk in chunks:
        data = decoder.lone_message(chunk)
        events.extend([SseEvent(data=data)] if data is not None else decoder.feed(chunk))
    return events


_EVENTS = st.sampled_from(
    [
        b"event: message\r\ndata: {}\r\n\r\n",
        b"event: message\ndata: [1]\n\n",
        b"event: message\rdata: {}\r\r",
        b"event: message\r\ndata: " + b"x" * 30 + b"\r\n\r\n",  # over the limit
        b"event: message\r\ndata: \r\n\r\n",
        b"event: message\r\ndata: a\r\nb\r\n\r\n",
        b"event: message\r\ndata: a\r\n\r\n\r\n",
        b"event: message\r\ndata:  a\n\n",
        b"event: message\r\ndata: a\n\r\n",
        b"id: 4\r\nevent: message\r\ndata: {}\r\n\r\n",
        b"event: message\r\n",
        b"data: a\r\n\r\n",
        b"\xef\xbb\xbf",
        b"retry: 5\n",
        b": ping\n\n",
        b"\r",
        b"\n",
    ]
)


@given(
    st.lists(st.tuples(_EVENTS, st.booleans()), max_size=10),
    st.lists(st.integers(min_value=1, max_value=24), max_size=6),
)
@example([(b"event: message\r\n", False), (b"event: message\r\ndata: {}\r\n\r\n", False), (b"\n", False)], [])
@example([(b"data: a\r\n", False), (b"event: message\r\ndata: {}\r\n\r\n", False), (b"\n", False)], [])
def test_a_lone_message_read_first_gives_what_feed_gives(
    events: list[tuple[bytes, bool]], cuts: list[int]
) -> None:
    # Each event a read of its own, or cut anywhere (`split`): whatever `lone_message` takes, the
    # events, the reconnection time and what follows are those of `feed` alone.
    chunks: list[bytes] = []
    for event, split in events:
        at = cuts[len(chunks) % len(cuts)] if split and cuts else len(event)
        chunks.extend(part for part in (event[:at], event[at:]) if part)
    early, fed = SseDecoder(24), SseDecoder(24)
    assert [_seen(e) for e in read_as_early(early, chunks)] == [_seen(e) for e in decode_all(fed, chunks)]
    assert early.retry == fed.retry


def test_a_lone_message_is_read_in_one_step_with_either_line_ending() -> None:
    for chunk in (b"event: message\r\ndata: {}\r\n\r\n", b"event: message\ndata: {}\n\n"):
        assert SseDecoder(24).lone_message(chunk) == b"{}"
    decoder = SseDecoder(24)
    decoder.feed(b"data: held")  # a line not yet ended: the next read is its rest
    assert decoder.lone_message(b"event: message\r\ndata: {}\r\n\r\n") is None
