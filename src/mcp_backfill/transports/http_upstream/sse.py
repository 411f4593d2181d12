"""Server-sent events decoding on bytes, with bounded memory.

Own decoder rather than httpx2's `EventSource`: that one decodes to `str` and fails the whole stream
on an oversized event, while the proxy must hand the payload on as the exact bytes it received and
skip an oversized message (keeping its ends, to answer for it) without losing the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_backfill.errors import MessageTooLarge

BOM = b"\xef\xbb\xbf"  # U+FEFF in UTF-8
# The longest `retry:` reported, in milliseconds (a day): a longer one, however many digits it has
# (Python reads no more than 4,300 as a number), counts as this.
RETRY_LIMIT = 86_400_000
# How one `message` event of one `data:` line starts and ends, with each line ending.
_LONE_MESSAGE = tuple((b"event: message%sdata: " % ending, ending * 2) for ending in (b"\r\n", b"\n"))


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: `data` is its `data:` lines joined by newlines, or the oversize summary."""

    data: bytes | MessageTooLarge
    event: str = "message"
    # The event's own `id:` field; None when it had none (the stream's last id is then unchanged).
    id: str | None = None


class SseDecoder:
    """Feed it the body's bytes as they arrive; it returns the events completed so far.

    Lines end with CRLF, LF or CR, and a byte order mark at the stream's start is dropped (spec:
    text/event-stream). A CR ends its line at once, even as the last byte read so far: an LF that
    follows it (in the next read) is the rest of that ending and is skipped, as browsers do. Held
    as perhaps half of a CRLF, the CR that ended an event kept it back until another byte came,
    and for ever when the stream ended there. A `data:` payload larger than `limit` is not
    buffered: the event still arrives, with a `MessageTooLarge` in place of its data.

    `retry` is the reconnection time the stream asked for last (milliseconds; None: none yet). As the
    spec has it, a `retry:` line sets it when it is read, whether or not an event is dispatched
    after it: given with its event, a `retry:` whose event never ended (the stream ended or broke
    off first) was lost.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._line = bytearray()
        self._scanned = 0  # bytes of `_line` known to hold no line ending
        self._long_line: bytes | None = None  # field name of a line too long to buffer, while it streams
        self._data: list[bytes] = []
        self._size = 0
        self._too_large: MessageTooLarge | None = None
        self._event = b""
        self._id: str | None = None
        self.retry: int | None = None
        self._pending = False
        self._started = False  # past a byte order mark, if the stream began with one
        self._after_cr = False  # a line ended in the last byte read, a CR: an LF next is its rest

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if not self._line and chunk.endswith(b"\n") and self._long_line is None:
            # Nothing held, and whole lines (an LF last ends its line, whatever came before it):
            # split at once, as most reads bring whole events (a third of the cost per event).
            if not self._started:
                self._started = True
                if chunk.startswith(BOM):
                    chunk = chunk[len(BOM) :]
            elif self._after_cr:
                self._after_cr = False
                if chunk[0] == 0x0A:
                    chunk = chunk[1:]
            events: list[SseEvent] = []
            for line in chunk.splitlines():  # at CRLF, LF and CR only, as for bytes
                event = self._take_line(line)
                if event is not None:
                    events.append(event)
            return events
        self._line += chunk
        if not self._started:
            if len(self._line) < len(BOM) and BOM.startswith(self._line):
                return []  # perhaps the first bytes of one
            self._started = True
            if self._line.startswith(BOM):
                del self._line[: len(BOM)]
        if self._after_cr and self._line:
            self._after_cr = False
            if self._line[0] == 0x0A:
                del self._line[0]
        events = []
        while True:
            end, after = self._line_end()
            if end < 0:
                self._absorb_partial()
                return events
            with memoryview(self._line) as view:
                line = bytes(view[:end])
            del self._line[:after]
            self._scanned = 0
            if self._long_line is not None:
                if self._long_line == b"data" and self._too_large is not None:
                    self._too_large.extend(line)
                self._long_line = None
                continue
            event = self._take_line(line)
            if event is not None:
                events.append(event)

    def lone_message(self, chunk: bytes) -> bytes | None:
        """The data of `chunk` when it is one whole `message` event of one `data:` line, read with
        nothing held before it: what `feed` would give, found with a few comparisons (an answer's
        event is on every call's path). None: nothing was done, `feed` it."""
        if self._line or self._pending or self._long_line is not None or self._after_cr:
            return None
        for start, end in _LONE_MESSAGE:
            if chunk.startswith(start) and chunk.endswith(end):
                data = chunk[len(start) : -len(end)]
                if not data or len(data) > self._limit or b"\n" in data or b"\r" in data:
                    return None
                self._started = True
                return data
        return None

    def _line_end(self) -> tuple[int, int]:
        """(index of the line ending, index just after it), or (-1, -1) if the line is incomplete."""
        buffer = self._line
        lf = buffer.find(b"\n", self._scanned)
        cr = buffer.find(b"\r", self._scanned, lf if lf >= 0 else len(buffer))
        if cr < 0:
            return (lf, lf + 1) if lf >= 0 else (-1, -1)
        if cr + 1 == len(buffer):
            self._after_cr = True  # perhaps the first half of a CRLF: the next read settles it
            return cr, cr + 1
        return (cr, cr + 2) if buffer[cr + 1] == 0x0A else (cr, cr + 1)

    def _absorb_partial(self) -> None:
        """An unterminated line longer than the limit is consumed as it arrives instead of buffered
        (it holds no CR: that would have ended it)."""
        if self._long_line is not None:
            if self._long_line == b"data" and self._too_large is not None:
                self._too_large.extend(self._line)
            self._line.clear()
        elif len(self._line) > self._limit + 16:
            name, _, value = bytes(self._line).partition(b":")
            self._long_line = name
            if name == b"data":
                self._add_data(value[1:] if value.startswith(b" ") else value)
            self._line.clear()
        self._scanned = len(self._line)

    def _take_line(self, line: bytes) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return None  # a comment (keep-alive pings)
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._add_data(value)
        elif name == b"event":
            self._event = value
            self._pending = True
        elif name == b"id":
            if b"\0" not in value:
                self._id = value.decode("utf-8", errors="replace")
                self._pending = True
        elif name == b"retry" and value.isdigit():  # ASCII digits only (bytes)
            self.retry = min(int(value), RETRY_LIMIT) if len(value) <= 9 else RETRY_LIMIT
        return None

    def _add_data(self, value: bytes) -> None:
        self._pending = True
        separator = b"\n" if self._data or self._too_large is not None else b""
        if self._too_large is not None:
            self._too_large.extend(separator + value)
            return
        self._data.append(value)
        self._size += len(separator) + len(value)
        if self._size > self._limit:
            self._too_large = MessageTooLarge.from_bytes(b"\n".join(self._data), self._limit)
            self._data = []

    def _dispatch(self) -> SseEvent | None:
        if not self._pending:
            return None
        data: bytes | MessageTooLarge = self._too_large or b"\n".join(self._data)
        event = SseEvent(
            data=data,
            event=self._event.decode("utf-8", errors="replace") or "message",
            id=self._id,
        )
        self._data = []
        self._size = 0
        self._too_large = None
        self._event = b""
        self._id = None
        self._pending = False
        return event
