"""`PipeWriter`: a thread that writes a pipe for the event loop while the pipe is slow to write.

A write to a pipe wakes the process reading it, and Linux treats a pipe's wake-up as a hand-over:
the writer is expected to wait next, so the reader may be run on the writer's core, ahead of it,
and on a VM waking a reader on the other core costs the writer an interrupt between cores. Either
way the event loop stands still inside `writev` for that long, and every other message it holds
waits with it. With an mcp SDK server upstream (its stdin read by a worker thread) and 16 calls in
flight on the benchmark's two cores, a write to the server took 29 µs at the median and 100-450 µs
at the 99th percentile, 39% of the proxy's wall time went to them, and the server sat idle a
fifth of the time although 16 requests were waiting (`benchmarks/README.md`, 1b). A thread
blocked in those writes holds up only itself.

A thread costs a hand-over per message, and the write is one the loop pays nothing more for when the
reader is already awake (about 1 µs) or when nothing else waits (one call in flight: the reader
answers next anyway). So `LineChannel` hands its writes over only while both hold: writes have
been slow lately (`FdSendStream.write_ns`) and its owner says several requests are in flight.

The thread writes whole messages in the order they were handed over, everything it holds in one
`writev`; once something is handed over, later messages follow it through the thread until the
thread has written it all, so no message overtakes another. The loop waits only while more than
`limit` bytes are held.
"""

from __future__ import annotations

import asyncio
import queue
import select
import threading
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from mcp_backfill.transports.stdio import Chunk, FdSendStream

# How often a writer blocked on a full pipe looks whether it was abandoned.
POLL_SECONDS = 0.1
# How long closing waits, by default, for the thread to write what it holds before abandoning it.
CLOSE_SECONDS = 5.0


class PipeWriter:
    """Writes handed-over messages to `stream` from a thread (see the module docstring)."""

    def __init__(self, stream: FdSendStream, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._loop = asyncio.get_running_loop()
        self._items: queue.SimpleQueue[Sequence[Chunk] | None] = queue.SimpleQueue()
        # Each counter is written by one thread only: bytes handed over (the loop's thread), and
        # bytes written or dropped (the writer's).
        self._handed = 0
        self._written = 0
        self._error: BaseException | None = None
        self._closing = False
        self._abandoned = False
        # Resolved by the thread after each write, then replaced by the next writer that waits.
        self._progress: asyncio.Future[None] | None = None
        self._finished: asyncio.Future[None] = self._loop.create_future()
        threading.Thread(target=self._run, name="mcp-backfill-pipe-writer", daemon=True).start()

    @property
    def holding(self) -> bool:
        """Is anything handed over still unwritten? Then later messages must follow it here."""
        return self._handed != self._written

    def hand(self, parts: Sequence[Chunk]) -> None:
        """Hand `parts` over without waiting, whatever is held (the caller bounds it).

        Raises `anyio.BrokenResourceError` once a write failed, `anyio.ClosedResourceError` once closed.
        """
        if self._closing:
            raise anyio.ClosedResourceError
        if self._error is not None:
            raise anyio.BrokenResourceError from self._error
        self._handed += sum(map(len, parts))
        self._items.put(parts)

    async def write(self, parts: Sequence[Chunk]) -> None:
        """Hand `parts` over; waits while more than `limit` bytes are held (errors as `hand`)."""
        self.hand(parts)
        await self._until_held(self._limit)

    async def write_all(self, parts: Sequence[Chunk]) -> None:
        """Hand `parts` over and wait until the thread has written them (errors as `hand`): the
        caller holds nothing more, and reads nothing more meanwhile, than if it wrote them itself."""
        self.hand(parts)
        await self._until_held(0)

    async def _until_held(self, limit: int) -> None:
        """Wait while more than `limit` bytes are held (and no write failed)."""
        while self._held_over(limit):
            progress = self._progress
            if progress is None or progress.done():
                progress = self._progress = self._loop.create_future()
                if not self._held_over(limit):  # the thread moved on before it could see this one
                    break
            await asyncio.shield(progress)  # shared by every waiting writer: a cancel ends only ours

    def _held_over(self, limit: int) -> bool:
        return self._handed - self._written > limit and self._error is None

    async def aclose(self, flush_timeout: float = CLOSE_SECONDS) -> bool:
        """Let the thread write what it holds and end; True when it did within `flush_timeout` s.

        Otherwise (a reader that stopped reading) the thread is abandoned, and it closes the
        descriptor itself as it leaves, so that the number is not reused while it may still write.
        """
        if not self._closing:
            self._closing = True
            self._items.put(None)
        with anyio.move_on_after(flush_timeout):
            await asyncio.shield(self._finished)
            return True
        self._abandoned = True
        return False

    # -- the writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        done = False
        while not done:
            parts: list[Chunk] = []
            item = self._items.get()
            while True:
                if item is None:
                    done = True
                    break
                parts.extend(item)
                try:
                    item = self._items.get_nowait()
                except queue.Empty:
                    break
            item = None  # held no longer than `parts`: a large message goes once written, not when
            # the next one comes (a 10 MB answer was kept alive beside the next, doubling peak memory)
            if parts and self._error is None:
                try:
                    self._write_all(parts)
                except Exception as exc:  # a broken pipe, or abandoned while the pipe stayed full
                    self._error = exc
            self._written += sum(map(len, parts))
            self._wake(self._progress)
        if self._abandoned:
            self._stream.close_now()
        self._wake(self._finished)

    def _write_all(self, parts: Sequence[Chunk]) -> None:
        remaining = self._stream.write_now(parts)
        while remaining:
            if self._abandoned:
                raise anyio.ClosedResourceError
            select.select([], [self._stream.fileno()], [], POLL_SECONDS)
            remaining = self._stream.write_now(remaining)

    def _wake(self, future: asyncio.Future[None] | None) -> None:
        if future is not None:
            with suppress(RuntimeError):  # the event loop is already closed: nobody waits
                self._loop.call_soon_threadsafe(_set_done, future)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
