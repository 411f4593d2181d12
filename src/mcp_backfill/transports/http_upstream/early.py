"""A POST's answer read in the connection's read callback, with no task, when it is a plain one.

An exchange's task (`exchange.ExchangeReader`) reads its answer only once the event loop has woken
it, and then hands each message to the relay's task, which must be woken too: two task switches and
their machinery on every call's way back, and a task made and ended for every POST (`benchmarks/
README.md`, the twenty-eighth round). So a POST written at once (`write_now`) starts no task. Its
answer is read as it arrives, from the socket's read callback (`WatchedReader`), and while it is a
plain `200` with JSON or event-stream content each message it brings is handed on at once to whoever
takes messages at once (the relay, `HttpUpstream.deliver_at_once`), in order. An answer read to its
end that way owes nothing more, and its connection goes back to the pool from the callback.

Anything else, and the exchange gets its task after all (`Hooks.gave_up`), which reads the same bytes
(the reader keeps them all) from the start as it always has, skipping the messages taken here
(`PostExchange.early`): an HTTP error, a session the server forgot, cookies, a batch, a message not
taken at once, a stream that ends owing an answer, an answer larger than the reader holds, the
connection's end or error, and an answer still unfinished after `PATIENCE` seconds (the task's read
timeout then applies). So every way an answer can go but the plain one is the task's, unchanged.
Without `httptools` (a platform without its wheel) no answer is read early.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol, SupportsIndex

try:
    import httptools
except ImportError:  # a platform without its wheel: every answer is read by its exchange's task
    httptools = None  # type: ignore[assignment]

from mcp_backfill import protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.http_upstream.sse import SseDecoder

log = get_logger("http")

AVAILABLE = httptools is not None
"""Answers are read early only with httptools' parser (installed with this package)."""
# How long an answer is read from the callback alone before its exchange's task takes over.
PATIENCE = 0.5
_SSE = protocol.SSE_TYPE.encode()
_JSON = protocol.JSON_TYPE.encode()


class AtOnce(Protocol):
    """Who takes an upstream's messages at once: `take` is called only right after `ready()`."""

    def ready(self) -> bool: ...

    def take(self, data: bytes, origin: Any) -> bool:
        """True when taken (False: it was not ready after all; the message goes its usual way)."""

    def answer_ahead(self, data: bytes, message: Any, origin: Any) -> bool:
        """`take`, when the message (`message`, decoded) is the answer its client is waiting for:
        written to the client now, taken later (`Relay.answer_ahead`); False: nothing was done."""


class Hooks(Protocol):
    """What an `EarlyAnswer` tells its exchange."""

    def take(self, data: bytes) -> bool:
        """Hand on one message now; False (nothing done) when it cannot be."""

    def gave_up(self) -> None:
        """The rest is the exchange's task's to read (called once, at most)."""

    def finished(self, reusable: bool) -> None:
        """The answer was read to its end and every message in it taken."""


class WatchedReader(asyncio.StreamReader):
    """A connection's `StreamReader` whose bytes an `EarlyAnswer` reads as they arrive."""

    watch: EarlyAnswer | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        super().feed_data(data)  # kept, for the task that may read them yet
        watch = self.watch
        if watch is not None:
            watch.feed(bytes(data), len(self._buffer) > self._limit)  # type: ignore[attr-defined]

    def unwatch(self) -> None:
        """No `EarlyAnswer` reads these bytes any more; the one that did lets go of its parser."""
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.release()

    def feed_eof(self) -> None:
        super().feed_eof()
        if self.watch is not None:
            self.watch.stop()

    broken: Exception | None = None
    """The connection's error, when it came with bytes still unread: raised once they are read."""

    def set_exception(self, exc: Exception) -> None:
        # What came before the break is the answer's all the same: read first, then the error.
        # (asyncio's reader raises it at once, and an answer read early, which no task had read
        # yet, was lost whole: its request failed as if the upstream were unreachable, instead
        # of being resumed from the last event id the stream brought.)
        if self._buffer:  # type: ignore[attr-defined]
            self.broken = exc
            super().feed_eof()
        else:
            super().set_exception(exc)
        if self.watch is not None:
            self.watch.stop()

    async def read(self, n: int = -1) -> bytes:
        data = await super().read(n)
        if not data and n and self.broken is not None:
            raise self.broken
        return data

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        try:
            return await super().readuntil(separator)
        except asyncio.IncompleteReadError:
            if self.broken is not None:
                raise self.broken from None
            raise

    async def readexactly(self, n: int) -> bytes:
        try:
            return await super().readexactly(n)
        except asyncio.IncompleteReadError:
            if self.broken is not None:
                raise self.broken from None
            raise

    def forget(self) -> None:
        """Drop what is buffered: an answer read whole by its `EarlyAnswer`."""
        self._buffer.clear()  # type: ignore[attr-defined]
        # Reading again if those bytes had paused it (past twice its limit, in one read): paused,
        # the connection's next answer was not read from its callback at all, only by its task
        # `PATIENCE` later.
        self._maybe_resume_transport()  # type: ignore[attr-defined]


class EarlyAnswer:
    """Parses one answer as it arrives (see the module docstring)."""

    def __init__(self, reader: WatchedReader, hooks: Hooks, max_bytes: int) -> None:
        self._reader = reader
        self._hooks = hooks
        self._max_bytes = max_bytes
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._content_type = b""
        self._not_plain = False
        self._events: SseDecoder | None = None
        self._body: list[bytes] | None = None  # a JSON answer's body so far
        self._size = 0
        self._done = False
        self._extra = False
        self._keep_alive = False
        reader.watch = self

    def feed(self, data: bytes, crowded: bool) -> None:
        parser = self._parser
        if parser is None:
            return  # released: it reads no more
        try:
            parser.feed_data(data)
        except Exception as exc:  # a parser error, or one of its callbacks' (`_NotPlain`): the task's
            if _a_bug(exc):
                log.exception("reading an upstream answer as it arrived failed; its task reads it")
            if not self._done:
                self.stop()
                return
            self._extra = True  # bytes after the answer: the connection is out of step
        if self._done:
            self._reader.unwatch()
            self._hooks.finished(self._keep_alive and not self._extra)
        elif crowded:  # the reader stops reading past its limit until someone reads
            self.stop()

    def stop(self) -> None:
        if self._reader.watch is self:
            self._reader.unwatch()
            self._hooks.gave_up()

    def release(self) -> None:
        """Drop the parser, which holds this object's callbacks: a reference cycle per answer,
        which would leave the answer's exchange and all it holds (about twenty objects a call) to
        the garbage collector, whose collections then came every fifty calls or so, about 300 µs
        each (`benchmarks/README.md`, the thirtieth round)."""
        self._parser = None

    # httptools' callbacks
    def on_message_begin(self) -> None:
        if self._done:
            raise _NotPlain  # a second answer to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self._content_type = value
        elif name in (b"set-cookie", b"content-encoding"):
            self._not_plain = True  # the client's jar takes cookies; a coded body is not plain: the task's

    def on_headers_complete(self) -> None:
        kind = self._content_type.partition(b";")[0].strip().lower()
        if self._parser is None or self._parser.get_status_code() != 200 or self._not_plain:
            raise _NotPlain
        if kind == _SSE:
            self._events = SseDecoder(self._max_bytes)
        elif kind == _JSON:
            self._body = []
        else:
            raise _NotPlain

    def on_body(self, body: bytes) -> None:
        if self._events is not None:
            data = self._events.lone_message(body)
            if data is not None:
                if not self._offer(data):
                    raise _NotPlain
                return
            for event in self._events.feed(body):
                if event.event != "message" or event.data == b"":
                    continue  # as the task skips them
                if not (isinstance(event.data, bytes) and self._offer(event.data)):
                    raise _NotPlain
        elif self._body is not None:
            self._size += len(body)
            if self._size > self._max_bytes:
                raise _NotPlain
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._body is not None and not self._offer(b"".join(self._body)):
            raise _NotPlain
        self._keep_alive = self._parser is not None and self._parser.should_keep_alive()
        self._done = True

    def _offer(self, data: bytes) -> bool:
        return data[:64].lstrip()[:1] == b"{" and self._hooks.take(data)  # a batch is the task's to split


class _NotPlain(Exception):
    """Raised from a parser callback: the answer is the task's."""


def _a_bug(exc: Exception) -> bool:
    """Did one of the parser's callbacks fail (other than by `_NotPlain`)? (Kept out of `feed`: a
    local there naming the callback's exception would be a reference cycle through its traceback.)"""
    bug = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
    return bug is not None and not isinstance(bug, _NotPlain)
