"""Newline-delimited JSON-RPC over byte streams: the proxy's own stdin/stdout and the upstream child.

Lines are read and written directly (no SDK session, no per-message validation) because every
relayed message passes through here and the relay only needs the bytes.

A `LineChannel` over a pipe can also hand a message to its owner from the read callback itself
(`deliver_at_once`) and take one to write without waiting (`can_send_now`, `send_now`): the stdio
relay's hot path, one message in and one out with no task switch between (see `relay.Relay`).
"""

from __future__ import annotations

import array
import asyncio
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, cast

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from mcp_backfill import jsonrpc
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.base import ELSEWHERE_POLL_SECONDS, nothing_elsewhere
from mcp_backfill.transports.child import PIPE_SIZE, StartedChild, enlarge_pipe, start_child
from mcp_backfill.transports.guard import GUARD
from mcp_backfill.transports.pipe_writer import CLOSE_SECONDS, PipeWriter

log = get_logger("stdio")

READ_CHUNK = 256 * 1024
# A pipe whose writes take this long lately wakes its reader at a cost the event loop should not
# wait out while other messages wait (see `pipe_writer`); a write to an awake reader takes ~1 µs.
SLOW_WRITE_NS = 20_000


def _iov_max() -> int:
    """The most buffers one `writev` takes (Linux: 1024): past it the call fails (EINVAL), writing
    nothing. POSIX promises at least 16."""
    try:
        value = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        value = -1
    return value if value > 0 else 16


IOV_MAX = _iov_max()

Chunk = bytes | memoryview


class LineSplitter:
    """Splits a byte stream into lines with bounded memory.

    A line longer than the limit is skipped as it streams in; only its first and last bytes are
    kept, so the relay can still tell which request it answered.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already known to hold no newline
        self._skipping: MessageTooLarge | None = None

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def holding(self) -> bool:
        """Is part of a line waiting for the rest?"""
        return bool(self._buffer) or self._skipping is not None

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_line(self) -> bytes | MessageTooLarge | None:
        """The next complete non-empty line, an oversized line's summary, or None (feed more)."""
        if not self._buffer:  # all taken (the common case after each line): nothing to scan
            return None
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._absorb_partial()
                return None
            with memoryview(self._buffer) as view:
                line = bytes(view[:newline])
            del self._buffer[: newline + 1]
            self._scanned = 0
            if self._skipping is not None:
                skipped, self._skipping = self._skipping, None
                skipped.extend(line)
                return skipped
            line = trimmed(line)  # the whitespace around a message (a CR before the newline) is framing
            if len(line) > self._limit:
                return MessageTooLarge.from_bytes(line, self._limit)
            if line:
                return line

    def finish(self) -> bytes | MessageTooLarge | None:
        """At end of stream: the unterminated last line, if any."""
        self._buffer += b"\n"
        return self.next_line()

    def _absorb_partial(self) -> None:
        if self._skipping is not None:
            self._skipping.extend(self._buffer)
            self._buffer.clear()
        elif len(self._buffer) > self._limit + 1:  # one more: a CR before the newline is framing
            self._skipping = MessageTooLarge.from_bytes(bytes(self._buffer), self._limit)
            self._buffer.clear()
        self._scanned = len(self._buffer)


def trimmed(line: bytes) -> bytes:
    """`line` without the whitespace around it (a blank line becomes empty: nothing to relay)."""
    return line.strip() if line[:1].isspace() or line[-1:].isspace() else line


def one_line(message: bytes) -> bytes:
    """`message` as one line. A message from an HTTP peer may be JSON over several lines (indented,
    an SSE event's `data:` lines, a body ending in CRLF); raw CR and LF in JSON text can only be
    whitespace between its tokens (in a string they are escaped), so they become spaces, the rest
    kept byte for byte. Written as it came, each of its lines would reach the peer as a message."""
    if b"\n" in message or b"\r" in message:
        return message.replace(b"\r", b" ").replace(b"\n", b" ")
    return message


class LineChannel:
    """A `MessageChannel` over a pair of byte streams carrying newline-delimited messages; a message
    sent over several lines goes out on one (`one_line`).

    A last line the stream ends without a newline is a message all the same (a client may leave it
    off), unless `whole_at_end` and it is not JSON: an upstream that died writing a message left only
    its first part, which must not reach the client as an answer.
    """

    def __init__(
        self,
        reader: ByteReceiveStream,
        writer: ByteSendStream,
        max_message_bytes: int,
        *,
        whole_at_end: bool = False,
    ) -> None:
        self._whole_at_end = whole_at_end
        self._reader = reader
        self._writer = writer
        self._lines = LineSplitter(max_message_bytes)
        self._eof = False
        self._send_lock = anyio.Lock(fast_acquire=True)
        self._crowded: Callable[[], bool] | None = None
        self._offload: PipeWriter | None = None
        self._at_once: Callable[[bytes], bool] | None = None
        self._ends_with_writer = False

    def end_reading_when_writes_fail(self) -> None:
        """Once a write fails for good (nobody reads the other end any more), end the reading side
        as `stop_reading` does: for the proxy's own stdio, a client that no longer takes its answers
        has left, even while something still holds its end of our stdin open."""
        self._ends_with_writer = True

    def _write_failed(self) -> None:
        if self._ends_with_writer:
            self._ends_with_writer = False
            log.info("client stopped reading the proxy's output; ending the session as at its EOF")
            self.stop_reading()

    async def receive(self) -> bytes:
        while True:
            line = self._lines.next_line()
            if line is None and self._eof:
                line = self._lines.finish()
                if line is None:
                    raise anyio.EndOfStream
                if self._whole_at_end and isinstance(line, bytes) and not _is_json(line):
                    log.warning(
                        "the upstream's output ended in the middle of a message; its first part is dropped",
                        extra={"bytes": len(line)},
                    )
                    raise anyio.EndOfStream
            if isinstance(line, MessageTooLarge):
                raise line
            if line is not None:
                return line
            try:
                self._lines.feed(await self._reader.receive(READ_CHUNK))
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._eof = True

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        return await self.receive(), None  # one pipe: no request streams to tell apart

    async def send(self, message: bytes, related: Any = None) -> None:
        try:
            await self._send(one_line(message))
        except anyio.BrokenResourceError:
            self._write_failed()
            raise

    async def _send(self, message: bytes) -> None:
        if not isinstance(self._writer, FdSendStream):
            async with self._send_lock:
                await self._writer.send(message + b"\n")
            return
        # The line and its newline go out in one writev, without copying a large message. While
        # no earlier send is still waiting on a full pipe, a message that fits is written at once
        # (nothing can interleave: there is no await); a remainder waits its turn under the lock.
        # Or the writer thread takes it (`offload_writes`), and every message after it until the
        # thread has written them all.
        parts: Sequence[Chunk] = (message, b"\n")
        offloading = self._offloading(self._writer)
        if not offloading:
            parts = self._writer.write_now(parts)
            if not parts:
                return
        if self._offload is None:
            self._offload = PipeWriter(self._writer, PIPE_SIZE)
        if offloading:
            await self._offload.write(parts)
            return
        # The writer thread takes the rest of a line once part of it is out: a task waiting for room
        # in the pipe could be cancelled (its session ending), leaving half a line for the next
        # message to be glued to. Handed over before any wait, the line goes out whole; the task
        # waits for it all the same (the next message is not read meanwhile: one in memory at a time).
        await self._offload.write_all(parts)

    def deliver_at_once(self, handler: Callable[[bytes], bool]) -> None:
        """While `receive()` waits for data, hand a message that arrives whole in one read to
        `handler` from the read callback itself, without waking the receiving task; `handler`
        returns False to leave it to `receive()` after all. An exception it raises is raised by
        `receive()`. Only over a pipe or socket (else nothing changes).

        A part of a line, several lines in one read, an oversized line, or a read while the
        receiving task is busy all take the usual way, so messages keep their order.
        """
        if isinstance(self._reader, PipeReceiveStream):
            self._at_once = handler
            self._reader.at_once = self._line_at_once

    def _line_at_once(self, data: bytes) -> bool:
        lines, handler = self._lines, self._at_once
        if (
            handler is None
            or lines.holding
            or len(data) - 1 > lines.limit
            or data.find(b"\n") != len(data) - 1
        ):
            return False
        line = trimmed(data[:-1])
        return handler(line) if line else True

    def can_send_now(self) -> bool:
        """Can `send_now` write a message in its turn? (The writer thread is neither holding messages
        nor due to take this one.)"""
        writer = self._writer
        return isinstance(writer, FdSendStream) and not self._offloading(writer)

    def send_now(self, message: bytes, related: Any = None) -> None:
        """Send `message` without waiting; only right after `can_send_now()` said yes. What the pipe
        does not take at once goes to the writer thread, and later messages follow it there."""
        writer = cast(FdSendStream, self._writer)
        parts: Sequence[Chunk] = (one_line(message), b"\n")
        try:
            if self._offload is None or not self._offload.holding:
                parts = writer.write_now(parts)
                if not parts:
                    return
            if self._offload is None:
                self._offload = PipeWriter(writer, PIPE_SIZE)
            self._offload.hand(parts)
        except anyio.BrokenResourceError:
            self._write_failed()
            raise

    def offload_writes(self, crowded: Callable[[], bool]) -> None:
        """Hand writes to a thread while they are slow and `crowded()` says several requests are in
        flight (see `pipe_writer`); a descriptor writer only, else nothing changes."""
        if isinstance(self._writer, FdSendStream):
            self._crowded = crowded

    def _offloading(self, writer: FdSendStream) -> bool:
        if self._offload is not None and self._offload.holding:
            return True  # after what the thread holds
        return self._crowded is not None and writer.write_ns > SLOW_WRITE_NS and self._crowded()

    async def close_writer(self, flush_timeout: float = CLOSE_SECONDS) -> None:
        """Close the writing side, once the writer thread (if any) has written what it holds, or
        after `flush_timeout` seconds of a reader that does not read."""
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            if self._offload is not None and not await self._offload.aclose(flush_timeout):
                return  # abandoned to a reader that stopped reading: it closes the descriptor itself
            await self._writer.aclose()

    async def close_reader(self) -> None:
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await self._reader.aclose()

    def stop_reading(self) -> None:
        """End the reading side now, over a pipe: `receive()` takes what was read, then ends."""
        if isinstance(self._reader, PipeReceiveStream):
            self._reader.close_now()

    def unread(self) -> int:
        """Bytes waiting in the pipe that were not read yet (0 once it ended, or not a pipe)."""
        return self._reader.unread() if isinstance(self._reader, PipeReceiveStream) else 0


class _PipeProtocol(asyncio.Protocol):
    """The chunks a read pipe delivers, held for one reader; reading pauses while more than
    `READ_CHUNK` wait (the pipe then fills, and the writer waits)."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.ReadTransport | None = None
        self.at_once: Callable[[bytes], bool] | None = None
        """Offered each chunk while the reader waits; True when it took it (`deliver_at_once`)."""
        self.failure: Exception | None = None
        """What `at_once` raised, for the reader to raise."""
        self._buffered = 0
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if self.at_once is not None and waiter is not None and not waiter.done():
            try:
                if self.at_once(data):
                    return
            except Exception as exc:
                self.failure = exc
                self._wake()
                return
        self.chunks.append(data)
        self._buffered += len(data)
        if self._buffered > READ_CHUNK and not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> None:
        self.ended = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._wake()

    def take(self, max_bytes: int) -> bytes:
        """The oldest chunk, at most `max_bytes` of it (there must be one)."""
        data = self.chunks.popleft()
        if len(data) > max_bytes:
            data, rest = data[:max_bytes], data[max_bytes:]
            self.chunks.appendleft(rest)
        self._buffered -= len(data)
        if self._paused and self._buffered <= READ_CHUNK and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():  # a read cancelled while waiting left it done
            waiter.set_result(None)


class PipeReceiveStream(ByteReceiveStream):
    """Reads a pipe or socket through an asyncio read transport and `_PipeProtocol`.

    The descriptor stays registered with the event loop for the whole session and data arrives by
    callback, which saves a registration round trip per read on the hot path (every relayed line);
    the protocol hands each chunk over as it came, without `asyncio.StreamReader`'s buffering.
    """

    def __init__(self, protocol: _PipeProtocol, fd: int = -1) -> None:
        self._protocol = protocol
        self._fd = fd

    @property
    def at_once(self) -> Callable[[bytes], bool] | None:
        """Offered each chunk that arrives while `receive` waits; True when it took it."""
        return self._protocol.at_once

    @at_once.setter
    def at_once(self, take: Callable[[bytes], bool] | None) -> None:
        self._protocol.at_once = take

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        protocol = self._protocol
        while not protocol.chunks:
            if protocol.failure is not None:
                failure, protocol.failure = protocol.failure, None
                raise failure
            if protocol.ended:
                raise anyio.EndOfStream
            protocol.waiter = asyncio.get_running_loop().create_future()
            await protocol.waiter
        return protocol.take(max_bytes)

    async def aclose(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()

    def unread(self) -> int:
        """Bytes the pipe holds that were not read yet (FIONREAD); 0 once it ended (its descriptor
        may be closed then, and the number reused) or where that cannot be told."""
        if self._protocol.ended or self._fd < 0:
            return 0
        try:
            import fcntl
            import termios

            count = array.array("i", [0])
            fcntl.ioctl(self._fd, termios.FIONREAD, count)
        except (ImportError, AttributeError, OSError):
            return 0
        return count[0]


async def open_fd_receive_stream(fd: int, *, owned: bool = False) -> ByteReceiveStream:
    """The fastest way to read `fd` that works for what it is (pipe, tty, file, /dev/null).

    `owned`: closing the stream closes `fd` (otherwise the caller closes it).
    """
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(fd, "rb", buffering=0, closefd=owned)
        try:
            _, protocol = await loop.connect_read_pipe(_PipeProtocol, pipe)
        except BaseException:
            # Interrupted (a cancelled upstream start) or failed: the loop has closed `fd` (uvloop)
            # or will (asyncio). Left to the collector, `pipe` would close the number again much
            # later, by then another session's pipe: close it now, while the number is still free
            # (uvloop's close came first: EBADF, and `pipe` counts as closed all the same).
            with suppress(OSError):
                pipe.close()
            raise
        return PipeReceiveStream(protocol, fd)
    return FdReceiveStream(fd)


class FdReceiveStream(ByteReceiveStream):
    """Non-blocking reads from a descriptor that is not a pipe, without a thread per read.

    Ttys are polled through the event loop; files and /dev/null cannot be polled, so they are
    read in a worker thread instead.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pollable = True
        with suppress(OSError):
            os.set_blocking(fd, False)

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        while True:
            if not self._pollable:
                data = await anyio.to_thread.run_sync(os.read, self._fd, max_bytes, abandon_on_cancel=True)
                break
            try:
                data = os.read(self._fd, max_bytes)
                break
            except BlockingIOError:
                try:
                    await anyio.wait_readable(self._fd)
                except OSError:
                    self._pollable = False
                    with suppress(OSError):
                        os.set_blocking(self._fd, True)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        with suppress(OSError):
            os.close(self._fd)


class FdSendStream(ByteSendStream):
    """Non-blocking writes to a file descriptor, waiting on the event loop when the pipe is full.

    Closing is idempotent (the descriptor number could be reused by then) and a send after it
    fails with `ClosedResourceError`.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.write_ns = 0
        """How long a write took lately, in ns (a moving average, each write weighing 1/16)."""
        with suppress(OSError):
            os.set_blocking(fd, False)

    def fileno(self) -> int:
        return self._fd

    def write_now(self, parts: Sequence[Chunk]) -> list[memoryview]:
        """Write as much of `parts` as the pipe takes without waiting (one syscall); return the rest."""
        if self._fd < 0:
            raise anyio.ClosedResourceError
        try:
            started = perf_counter_ns()
            # Past IOV_MAX buffers (the writer thread's batch) the rest is left over, as from any
            # partial write.
            written = os.writev(self._fd, parts if len(parts) <= IOV_MAX else parts[:IOV_MAX])
            self.write_ns += (perf_counter_ns() - started - self.write_ns) >> 4
        except BlockingIOError:
            written = 0
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise anyio.BrokenResourceError from exc
        if written == sum(map(len, parts)):  # all of it (the common case)
            return []
        return unwritten(parts, written)

    async def send_parts(self, parts: Sequence[Chunk]) -> None:
        """Write all of `parts`, in order, as one stream of bytes."""
        remaining = self.write_now(parts)
        while remaining:
            await anyio.wait_writable(self._fd)
            remaining = self.write_now(remaining)

    async def send(self, item: bytes) -> None:
        await self.send_parts((item,))

    async def aclose(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with suppress(OSError):
                os.set_blocking(fd, True)  # its description may be shared (our stdout): as it was
            with suppress(OSError):
                os.close(fd)


def _is_json(line: bytes) -> bool:
    try:
        jsonrpc.decode(line)
    except ValueError:
        return False
    return True


def unwritten(parts: Sequence[Chunk], written: int) -> list[memoryview]:
    """What is left of `parts` once their first `written` bytes are out."""
    rest: list[memoryview] = []
    for part in parts:
        view = memoryview(part).cast("B")
        if written >= len(view):
            written -= len(view)
            continue
        rest.append(view[written:])
        written = 0
    return rest


@asynccontextmanager
async def own_stdio(max_message_bytes: int) -> AsyncIterator[LineChannel]:
    """The client side of a stdio proxy: this process's stdin and stdout.

    The protocol gets private duplicates of fd 0 and 1, and fd 1 is pointed at stderr (fd 0 at
    /dev/null), so a stray print from any library lands on stderr and can never corrupt the wire.
    """
    sys.stdout.flush()
    protocol_in = os.dup(0)
    protocol_out = os.dup(1)
    # Results are the large messages: a roomier pipe to the client passes them in fewer wake-ups.
    enlarge_pipe(protocol_out)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    channel = LineChannel(
        await open_fd_receive_stream(protocol_in), FdSendStream(protocol_out), max_message_bytes
    )
    channel.end_reading_when_writes_fail()
    try:
        yield channel
    finally:
        # What the writer thread holds goes out first (the last answers, the errors for requests the
        # upstream left unanswered), up to `CLOSE_SECONDS` of a client that does not read.
        with anyio.CancelScope(shield=True):
            await channel.close_writer()
        # The description is shared with our parent (a terminal, say): leave it blocking.
        with suppress(OSError):
            os.set_blocking(protocol_in, True)
        with suppress(OSError):
            os.close(protocol_in)


class ChildProcess:
    """A started child as the event loop sees it. A thread awaits its exit from the start (not a pidfd
    in the event loop, whose closing uvloop does not finish at once: a new descriptor with its number
    could abort the loop), and then stops what is left of its process group (`end_group`): helpers
    it started, which may hold its stdout open and would otherwise outlive it, and the session with
    them. `on_group_ended` runs on the event loop after that."""

    def __init__(
        self, popen: subprocess.Popen[bytes], grace: float, on_group_ended: Callable[[], None] | None = None
    ) -> None:
        self._popen = popen
        self._exited = anyio.Event()
        self._group_ended = anyio.Event()
        loop = asyncio.get_running_loop()
        args = (loop, grace, on_group_ended)
        threading.Thread(target=self._watch, args=args, name="mcp-backfill-child", daemon=True).start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)  # nothing once it has exited

    async def wait(self) -> int:
        if (code := self._popen.poll()) is not None:
            return code
        await self._exited.wait()
        return self._popen.wait()

    async def wait_group(self) -> None:
        """Until the child has exited and what was left of its group is gone (or SIGKILLed)."""
        await self._group_ended.wait()

    def _watch(
        self, loop: asyncio.AbstractEventLoop, grace: float, on_group_ended: Callable[[], None] | None
    ) -> None:
        pid = self._popen.pid
        try:  # until it exits, but not reaped yet: its number, its group's too, cannot be reused
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except (AttributeError, OSError):  # no waitid here, or reaped already (`returncode`)
            self._popen.wait()
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)  # what is left of its group
        self._popen.wait()
        with suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(self._exited.set)
        end_group(pid, grace)
        GUARD.forget(pid)
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(self._group_ended.set)
            if on_group_ended is not None:
                loop.call_soon_threadsafe(on_group_ended)


def end_group(pgid: int, grace: float) -> None:
    """SIGKILL what is still left, `grace` seconds on, of the process group `pgid`, which was sent
    SIGTERM as its leader exited. (Its members keep the number from being reused meanwhile.)"""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return  # nothing left (the usual case)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class UpstreamProcess:
    """The upstream server as a child process, with its stdio as a `LineChannel`."""

    process: ChildProcess
    channel: LineChannel
    command: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.process.pid

    async def close_stdin(self, flush_timeout: float = CLOSE_SECONDS) -> None:
        await self.channel.close_writer(flush_timeout)

    @property
    def stop_reason(self) -> str | None:
        """None: the requests the child left unanswered are told it exited, with its status (its
        stop cuts none short itself: closing its stdin leaves their ending to the child)."""
        return None

    async def stop(self, grace: float, *, in_flight_elsewhere: Callable[[], bool] = nothing_elsewhere) -> int:
        """Close stdin, then SIGTERM, then SIGKILL, each after `grace` seconds; return the exit status.

        First, up to `grace` seconds, until nothing is `in_flight_elsewhere` (the rounds of a request
        the proxy answers itself: its request is still to be sent again here). Closing stdin waits
        up to `grace` too, for messages the writer thread still holds."""
        with anyio.move_on_after(grace):
            while True:  # polled: the relay has no event for it (`HttpUpstream._settled` polls too)
                if not in_flight_elsewhere():
                    break
                await anyio.sleep(ELSEWHERE_POLL_SECONDS)
        await self.close_stdin(grace)
        with anyio.move_on_after(grace):
            return exit_status(await self.process.wait())
        log.warning("upstream did not exit after stdin closed; sending SIGTERM", extra={"pid": self.pid})
        self._signal_group(signal.SIGTERM)
        with anyio.move_on_after(grace):
            return exit_status(await self.process.wait())
        log.warning("upstream ignored SIGTERM; sending SIGKILL", extra={"pid": self.pid})
        self._signal_group(signal.SIGKILL)
        return exit_status(await self.process.wait())

    def _signal_group(self, sig: signal.Signals) -> None:
        # The child leads its own process group, so this reaches its children too: no orphans.
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            with suppress(ProcessLookupError):
                self.process.send_signal(sig)


def exit_status(returncode: int) -> int:
    """A shell-style exit status: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@asynccontextmanager
async def spawn_upstream(
    command: Sequence[str],
    env: Mapping[str, str],
    max_message_bytes: int,
    grace: float,
    started: StartedChild | None = None,
) -> AsyncIterator[UpstreamProcess]:
    """The upstream as a child process (`child.start_child`, or `started` if it was started already),
    with its stdio as a `LineChannel`; leaving stops it. Its stderr is inherited, so its logs pass
    straight through to ours."""
    child = started or start_child(command, env, grace)
    try:
        channel = LineChannel(
            await open_fd_receive_stream(child.from_child, owned=True),
            FdSendStream(child.to_child),
            max_message_bytes,
            whole_at_end=True,
        )
    except BaseException:
        if child.let_go():  # in a thread, the wait: the event loop serves others meanwhile (`serve`)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(child.reap, grace)
        raise
    child.adopt()
    loop = asyncio.get_running_loop()
    late: list[asyncio.TimerHandle] = []
    left = False

    def group_ended() -> None:
        # What still holds the child's stdout now is no process of its group (a helper that left it
        # with a session of its own): the output's end is not waited for beyond `grace` seconds more,
        # nor for longer than there is output to read (a slow client holds up its reading).
        if not left:
            late.append(loop.call_later(grace, stop_reading_once_read))

    def stop_reading_once_read() -> None:
        if left:
            return
        if channel.unread():
            late.append(loop.call_later(max(grace, 0.1), stop_reading_once_read))
        else:
            channel.stop_reading()

    process = ChildProcess(child.popen, grace, group_ended)
    upstream = UpstreamProcess(process, channel, child.command)
    try:
        yield upstream
    finally:
        left = True
        for handle in late:
            handle.cancel()
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                await upstream.stop(grace)
            with anyio.move_on_after(grace + 1):  # its group's stop ends with SIGKILL after `grace`
                await process.wait_group()
            await channel.close_writer()
            await channel.close_reader()
