"""One server-sent-event stream of an HTTP client session, kept so that a client can resume it.

Streamable HTTP delivers server messages on SSE streams: one per POST that carried requests, plus
the session's standalone GET stream. Messages are appended to an `EventStream` whether or not an
HTTP response is writing it at the moment; each gets an event id (`<stream key>.<sequence>`), and the
last of them are kept, so a client whose connection dropped can reconnect with `Last-Event-ID` and
get what it missed. What is kept is bounded twice: at most `limit` events and at most `byte_limit`
bytes (`REPLAY_BYTES`), oldest dropped first — so a client that never opens its GET stream, or never
reads, cannot make the proxy hold its messages without bound. All the streams of a session together
keep at most `SESSION_REPLAY_BYTES` (`ReplayBudget`): past it the oldest events of any of them go
first, whichever stream they are on, so a session's many POST streams cannot each hold the
per-stream maximum. The newest event is always kept, however large, so that a live reader gets it.

A live reader is not made to lose messages, though, however slow: while a response writes the
stream (or a handler is about to: `expecting_reader`), what it has yet to write is never dropped,
neither for the stream's limits nor for its session's. Instead the sender waits: while more than
half the stream's limits (in events or in bytes) waits to be written (`catch_up`), and while its
session keeps more than it may because of what live readers have yet to write (`ReplayBudget.
holding_up`), for as long as those responses keep writing: the upstream is held up rather than
messages dropped, and memory stays bounded. A reader that writes nothing for `STALL_SECONDS` while a
sender waits for it is taken to have stopped, and its oldest messages are dropped again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import anyio

from mcp_backfill.logs import get_logger

log = get_logger("http")

SSE_PING = b": ping\n\n"
REPLAY_BYTES = 8 * 1024 * 1024
"""Bytes of messages one stream keeps for replay, at most (the newest message is always kept)."""
SESSION_REPLAY_BYTES = 32 * 1024 * 1024
"""Bytes of messages all the streams of one session keep for replay, at most (`ReplayBudget`)."""
STALL_SECONDS = 10.0
"""How long a sender waits for a live reader that is far behind and writes nothing (`catch_up`)."""


class LaneWatch(Protocol):
    """Told of each change of a stream it writes (`EventStream.lane`), as it happens."""

    def changed(self) -> None: ...

    def answer(self) -> None: ...

    def answer_first(self, message: bytes) -> bool:
        """Write `message`, the stream's one and last, as the answer now, before the stream keeps
        it; False: not now (`changed` and `answer` then follow as for any message)."""
        ...

    def answered(self) -> None:
        """The stream has kept the message `answer_first` wrote: the lane's work after it."""
        ...

    def answer_ahead(self, message: bytes) -> Callable[[], None] | None:
        """`answer_first` before the message is routed at all: `answer_first` then finds it written.
        The hook returned does `answered`'s work, if routing the message did not (the session
        ended first); None: not now."""
        ...


def sse_event(data: bytes, event_id: str | None = None) -> bytes:
    """One `message` event. Raw newlines in a JSON text are whitespace, so they may split `data:` lines."""
    head = f"id: {event_id}\n".encode() if event_id is not None else b""
    lines = data.splitlines() or [b""]
    return head + b"event: message\n" + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def parse_event_id(event_id: str) -> tuple[str, int] | None:
    """`"s3.17"` -> `("s3", 17)`; None for an id this proxy did not mint."""
    key, dot, seq = event_id.strip().rpartition(".")
    # ASCII digits, and not too many: `isdigit` also takes "²", which `int` refuses, as it does
    # more than 4,300 digits.
    if not dot or not key or not (seq.isascii() and seq.isdigit()) or len(seq) > 18:
        return None
    return key, int(seq)


class ReplayBudget:
    """What the streams of one session keep for replay, together: at most `limit` bytes. Past it the
    oldest events of any of its streams go first (each event is stamped in the order it came), but
    never the newest event of those it counts. A stream counts from `add` until `remove` (which gives
    its bytes back, and is all the budget holds of it)."""

    def __init__(self, limit: int = SESSION_REPLAY_BYTES) -> None:
        self.limit = limit
        self.total = 0
        self._clock = 0
        self._streams: set[EventStream] = set()

    def stamp(self) -> int:
        self._clock += 1
        return self._clock

    def add(self, stream: EventStream) -> None:
        self._streams.add(stream)
        self.total += stream.buffered_bytes

    def remove(self, stream: EventStream) -> None:
        """`stream` counts no more: what it holds is given back, and what it gets later is its own."""
        if stream in self._streams:
            self._streams.remove(stream)
            self.total -= stream.buffered_bytes
            stream.leave_budget()

    def trim(self, newest: EventStream | None = None) -> None:
        """Drop the oldest events of the session's streams until the total is within the limit;
        `newest` (by default the stream whose last event is the newest it counts) holds the newest
        event, which stays; so does what a live reader has yet to write (see `oldest_stamp`).

        The newest is looked for, not remembered: the stream of the last event appended may have
        been let go since (a POST answered as JSON), and then no stream's newest event was kept (a
        GET stream whose reader had just dropped lost the one it had yet to write), and the stream
        let go stayed in memory."""
        if newest is None:
            newest = max(self._streams, key=lambda stream: stream.last_stamp, default=None)
        while self.total > self.limit:
            oldest: EventStream | None = None
            first = 0
            for stream in self._streams:
                stamp = stream.oldest_stamp(keep_last=stream is newest)
                if stamp is not None and (oldest is None or stamp < first):
                    oldest, first = stream, stamp
            if oldest is None:
                return
            oldest.drop_oldest(session_limit=self.limit)

    def holding_up(self) -> EventStream | None:
        """A stream whose live reader has yet to write events the session would otherwise let go
        (it keeps more than its limit), if any: the sender waits for it (`EventStream.progress`)."""
        if self.total <= self.limit:
            return None
        self.trim()
        if self.total <= self.limit:
            return None
        return next((stream for stream in self._streams if stream.holds_undelivered), None)


class EventStream:
    """The messages of one SSE stream, numbered, with the last `limit` kept for replay (and, with a
    `budget`, within what its session keeps in all). A stream without `replay` (2026-07-28, whose
    events have no ids) keeps only what is still to be written."""

    def __init__(
        self,
        key: str,
        limit: int,
        byte_limit: int = REPLAY_BYTES,
        budget: ReplayBudget | None = None,
        *,
        replay: bool = True,
    ) -> None:
        self.key = key
        self._replay = replay  # False: never resumed, so an event written is let go at once
        self._limit = limit
        self._byte_limit = byte_limit
        self._budget = budget
        self._events: deque[tuple[int, bytes]] = deque()
        self._stamps: deque[int] = deque()  # with a budget: each kept event's stamp, in step
        self.buffered_bytes = 0
        self._undelivered_bytes = 0  # of the kept events not yet handed to a response
        self._next = 1
        self._waiting: list[asyncio.Future[None]] = []  # those waiting in `changed()`
        self._writer = 0  # generation of the HTTP response writing this stream, 0: none
        self._expected = 0  # HTTP handlers about to write it (choosing between JSON and SSE)
        self._generations = 0
        self.finished = False
        self.delivered = 0  # highest sequence number handed to an HTTP response
        self.answered_as_json = False  # its one message went out as a JSON response: no event id
        self.resumable = True  # False: its client left before any event (any id) of it was sent
        self._progress: asyncio.Future[None] | None = None  # a sender waits in `catch_up`
        self._stalled = False  # its reader wrote nothing for STALL_SECONDS while far behind
        self._warned = False
        self.answer_now: Callable[[], Awaitable[None]] | None = None
        self.lane: LaneWatch | None = None
        """The connection writing this stream's answer from its callbacks (`sidecar/lane.py`)."""
        """Set by an HTTP handler waiting for this POST stream's answer: the task that completes the
        stream calls it, and the answer goes to the client from there, without waiting for the
        handler's task to be woken and scheduled (see `handshake.py`)."""

    def event_id(self, seq: int) -> str:
        return f"{self.key}.{seq}"

    @property
    def last_seq(self) -> int:
        return self._next - 1

    @property
    def attached(self) -> bool:
        return self._writer != 0

    @property
    def responding(self) -> bool:
        """Is a response writing this stream, or a handler about to or still ending its response?
        What it wrote is not known to have arrived before the response has ended."""
        return self._writer != 0 or self._expected != 0

    @property
    def live(self) -> bool:
        """Is a response writing this stream (or about to), one not taken to have stopped reading?
        What it has yet to write is then kept, whatever the limits."""
        return self.responding and not self._stalled

    @property
    def behind(self) -> bool:
        """Is a response writing this stream (or about to), and more than half the limit (in events
        or in bytes) waiting to be written?"""
        return self.live and (
            self._next - 1 - self.delivered > self._limit // 2
            or self._undelivered_bytes > self._byte_limit // 2
        )

    @property
    def holds_undelivered(self) -> bool:
        """Does a live reader have kept events yet to write?"""
        return self._undelivered_bytes > 0 and self.live

    @contextmanager
    def expecting_reader(self) -> Iterator[None]:
        """An HTTP handler will write this stream: while it waits for a quick answer and then starts
        its response, a burst is held up for it (`catch_up`) as for a response already writing, not
        dropped before its first write (a burst routed in those milliseconds, on a loaded machine,
        used to lose its oldest messages)."""
        self.expect_reader()
        try:
            yield
        finally:
            self.reader_gone()

    def expect_reader(self) -> None:
        """`expecting_reader`'s start, for a holder that is no block (the lane's request, about six
        calls less than a generator's context manager on every call); `reader_gone` ends it."""
        self._expected += 1

    def reader_gone(self) -> None:
        self._expected -= 1
        self._wake_sender()  # it may be no live reader any more

    async def catch_up(self) -> None:
        """While `behind`, wait for the response writing this stream to write; give up on it once it
        has written nothing for `STALL_SECONDS` (then the stream drops its oldest messages again)."""
        while self.behind:
            await self.progress()

    async def progress(self) -> None:
        """Wait until the response writing this stream writes an event, or stops writing it; after
        `STALL_SECONDS` without either, the reader is taken to have stopped (no longer `live`)."""
        progress = self._progress
        if progress is None or progress.done():  # several senders may wait: one future for all
            progress = self._progress = asyncio.get_running_loop().create_future()
        with anyio.move_on_after(STALL_SECONDS) as stall:
            await asyncio.shield(progress)
        if stall.cancelled_caught and not self._stalled:
            self._stalled = True
            log.warning(
                "SSE reader far behind and not reading; no longer waited for", extra={"stream": self.key}
            )

    def leave_budget(self) -> None:
        """Count no more in the budget given at construction (its `remove` calls this)."""
        self._budget = None
        self._stamps.clear()

    def handed_out(self, seq: int) -> None:
        """Event `seq` went to the HTTP response writing this stream."""
        if seq > self.delivered:
            if self._events:
                first = self._events[0][0]
                for kept in range(max(self.delivered + 1, first), min(seq, self._events[-1][0]) + 1):
                    self._undelivered_bytes -= len(self._events[kept - first][1])
            self.delivered = seq
            self._stalled = False
            self._wake_sender()
        if not self._replay:
            while self._events and self._events[0][0] <= seq:
                self.drop_oldest()

    def rewind(self, seq: int) -> None:
        """The client has events up to `seq` only, whatever went to a response before: it resumed
        from there, or the response writing the rest was cut off before its end (what went into a
        connection that was then lost may never have arrived). Later events count as yet to be
        delivered again: a live reader's are kept, and a finished stream is not taken to have been
        read whole (see `SessionRouter._finish_post`)."""
        if seq >= self.delivered:
            return
        if self._events:
            first = self._events[0][0]
            for kept in range(max(seq + 1, first), min(self.delivered, self._events[-1][0]) + 1):
                self._undelivered_bytes += len(self._events[kept - first][1])
        self.delivered = seq

    def _wake_sender(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None and not progress.done():
            progress.set_result(None)

    def append(self, message: bytes) -> None:
        if self.finished:
            log.debug("message for a finished stream dropped", extra={"stream": self.key})
            return
        self._events.append((self._next, message))
        self.buffered_bytes += len(message)
        self._undelivered_bytes += len(message)
        self._next += 1
        budget = self._budget
        if budget is not None:
            self._stamps.append(budget.stamp())
            budget.total += len(message)
        while len(self._events) > 1 and (
            len(self._events) > self._limit or self.buffered_bytes > self._byte_limit
        ):
            if self._events[0][0] > self.delivered and self.live:
                break  # its live reader has yet to write it: the sender waits instead (`catch_up`)
            self.drop_oldest()
        if budget is not None and budget.total > budget.limit:
            budget.trim(self)
        self._wake()

    def drop_oldest(self, session_limit: int | None = None) -> None:
        """Drop the oldest kept event: for this stream's limits, or for its session's
        (`session_limit`, the bytes all its streams may keep)."""
        seq, dropped = self._events.popleft()
        self.buffered_bytes -= len(dropped)
        if seq > self.delivered:
            self._undelivered_bytes -= len(dropped)
        if self._budget is not None:
            self._stamps.popleft()
            self._budget.total -= len(dropped)
        if seq > self.delivered and not self._warned:
            self._warned = True
            if session_limit is not None:
                log.warning(
                    "SSE replay memory of the session full; the oldest undelivered messages are dropped",
                    extra={"stream": self.key, "session_byte_limit": session_limit},
                )
            else:
                log.warning(
                    "SSE replay buffer full; the oldest undelivered messages are dropped",
                    extra={"stream": self.key, "limit": self._limit, "byte_limit": self._byte_limit},
                )

    @property
    def last_stamp(self) -> int:
        """The stamp of the newest kept event (0: none kept, or counted in no budget)."""
        return self._stamps[-1] if self._stamps else 0

    def oldest_stamp(self, *, keep_last: bool = False) -> int | None:
        """The stamp of the oldest kept event (None: none, only the last one if `keep_last`, or one
        its live reader has yet to write)."""
        if not self._stamps or (keep_last and len(self._stamps) == 1):
            return None
        if self._events[0][0] > self.delivered and self.live:
            return None
        return self._stamps[0]

    def finish(self) -> None:
        """No more messages will come (a POST's requests are all answered, or the session ended)."""
        if not self.finished:
            self.finished = True
            self._wake()

    def after(self, seq: int) -> list[tuple[int, bytes]]:
        """The kept events numbered above `seq`, oldest first."""
        return [event for event in self._events if event[0] > seq]

    def first_kept(self) -> int:
        return self._events[0][0] if self._events else self._next

    @property
    def empty(self) -> bool:
        """Has no message come yet?"""
        return self._next == 1

    def complete_after(self, seq: int) -> bool:
        """Is there nothing more to hand out after `seq`: the stream finished, and no event kept
        after it? (Its last events may have been let go for its session's replay memory: a writer
        waiting for them waited, and held its session, for ever.)"""
        return self.finished and (not self._events or self._events[-1][0] <= seq)

    async def changed(self) -> None:
        """Wait until a message is appended or the stream finishes (or its writer is replaced)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiting:  # cancelled (which cancels the future too): nothing woke it
                self._waiting.remove(waiter)

    def attach(self) -> int:
        """A response starts writing this stream; a previous writer, if any, must stop."""
        self._generations += 1
        self._writer = self._generations
        self._wake()
        return self._writer

    def is_writer(self, generation: int) -> bool:
        return self._writer == generation

    def detach(self, generation: int) -> None:
        if self._writer == generation:
            self._writer = 0
            self._wake_sender()

    def _wake(self) -> None:
        """Wake whoever waits in `changed()` (a future each, made only when someone waits: a stream
        changes two or three times per request, mostly with nobody waiting), and the lane writing it."""
        if self.lane is not None:
            self.lane.changed()
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)
