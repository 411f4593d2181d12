"""A lean HTTP/1.1 transport for plain-`http://` upstreams: keep-alive connections on asyncio streams.

It sits under `httpx2.AsyncClient`, which keeps doing everything above the wire (cookies, default
headers, timeouts per request, the error types the upstream code maps); the message POSTs reach it
through `settings.post_message`, which hands it an `Outgoing` rendered as the client would render
the request (a session's POSTs share one rendered head). What it replaces is
httpx2's own transport (httpcore2 over h11 and anyio streams, with a timeout scope around every
socket operation and a readability probe of each pooled connection): about 0.27 ms of CPU per POST
on the benchmark machine, against 0.04 ms here, and the client as a whole from 0.38 to 0.13 ms
(`benchmarks/README.md`, "the HTTP upstream leg"). `settings.make_http_client` uses it for `http://`
upstreams that no HTTP proxy stands in front of; TLS and proxies stay on httpx2's transport.

What it speaks: one request at a time per connection, the request's headers as httpx2 built them
(refused if a name or value holds CR, LF or NUL), and answers framed by `Content-Length`, the
chunked transfer coding alone (as h11 requires) or the connection's end; interim 1xx answers are
skipped, and a `101` (no upgrade is asked for) is refused. A connection goes back to the pool once
its answer has been read to the end, unless either side said `Connection: close`; one that sat idle
longer than `keepalive_expiry`, or holds bytes no request asked for (an answer longer than its
framing said, a `408` sent on an idle connection), is closed rather than reused: those bytes would
be read as the next request's answer. Idle connections past the expiry are also closed by a timer,
not only when a request looks at them: a session left idle after a burst would otherwise hold one
socket per request of the burst (in CLOSE_WAIT once the server dropped its end) for as long as it
stays open. Servers drop idle connections after a few seconds (uvicorn
after 5). A request that meets a reused connection reset before any byte of an answer arrived is
sent once more on a new connection: the reset says the server closed without reading it (the
keep-alive race, the server closing the idle connection as the request went out). A reused
connection that ends cleanly without answering is retried only for GET, HEAD, OPTIONS and DELETE: a
server that read a POST and then closed may have acted on it (RFC 9110 §9.2.2), and a `tools/call`
must not run twice.
A caller may also write a request at once, from its own task, when an idle connection and a free
slot are there (`write_now`), and have its answer read later, by `send`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

import httpx2

from mcp_backfill.transports.http_upstream.early import WatchedReader

# The longest status line plus header block accepted from the upstream.
HEAD_LIMIT = 64 * 1024
_LINE_END = re.compile(rb"\r?\n")
READ_SIZE = 64 * 1024
# Idle connections kept per upstream address, and how long one may sit idle before it is dropped
# (below uvicorn's 5 s keep-alive, so that the server rarely closes one as it is reused).
MAX_IDLE = 32
KEEPALIVE_EXPIRY = 4.0
# Connections open at once (as httpx2's default pool); more requests wait for one (the pool timeout).
MAX_CONNECTIONS = 100

_FORBIDDEN_IN_HEADERS = (b"\r", b"\n", b"\0")
# A chunk's size line (RFC 9112 §7.1): hex digits only (no sign, `0x` or `_`, which `int` would take),
# at most 16 of them, then an optional extension after optional blanks.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;.*)?")

T = TypeVar("T")


class _StaleConnection(Exception):
    """A reused connection was found closed before any byte of the answer arrived, in a way that says
    the server did not act on the request: safe to send it again on a new connection."""


# Requests sent again when a reused connection ends cleanly (FIN) without a byte of answer: those a
# server may have handled without harm (RFC 9110 §9.2.2), as Go's net/http retries.
REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


@dataclass
class _Head:
    version: bytes
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]


class _Connection:
    """One keep-alive connection to the upstream."""

    def __init__(self, reader: WatchedReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()
        self.reused = False

    def usable(self, now: float) -> bool:
        """Still open (the server has not closed it), holding no bytes no request asked for, and not
        idle past the expiry."""
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and not _buffered(self.reader)
            and now - self.idle_since < KEEPALIVE_EXPIRY
        )

    def close(self) -> None:
        self.writer.close()


async def _open_connection(host: str, port: int) -> tuple[WatchedReader, asyncio.StreamWriter]:
    """`asyncio.open_connection`, with a reader whose bytes an `EarlyAnswer` may look at first."""
    loop = asyncio.get_running_loop()
    reader = WatchedReader(limit=HEAD_LIMIT, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, host, port)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _buffered(reader: asyncio.StreamReader) -> bool:
    """Whether `reader` already holds bytes: then the next read completes without waiting and needs
    no timeout (arming and disarming one is about a quarter of this transport's own CPU), and an idle
    connection is out of step with its answers. Reads asyncio's own buffer; without it, False."""
    return bool(getattr(reader, "_buffer", None))


@dataclass(frozen=True)
class Outgoing:
    """A request as this transport sends it: where to, its rendered head and its body."""

    key: tuple[str, int]  # (host, port)
    method: str
    head: bytes  # the request line and header block, blank line included
    body: bytes
    timeouts: Mapping[str, float | None]  # httpx2's: connect, read, write, pool
    close: bool = False  # the request says `Connection: close`

    @classmethod
    def of(cls, request: httpx2.Request, body: bytes) -> Outgoing:
        """`request` (its body read whole into `body`) as it goes out."""
        if request.url.scheme != "http":
            raise httpx2.UnsupportedProtocol(f"this transport speaks http://, not {request.url.scheme}://")
        connection = request.headers.get_list("connection", split_commas=True)
        return cls(
            key=(request.url.host, request.url.port or 80),
            method=request.method,
            head=_render_head(request, len(body)),
            body=body,
            timeouts=request.extensions.get("timeout", {}),
            close="close" in [token.strip().lower() for token in connection],
        )

    def timeout(self, kind: str) -> float | None:
        value = self.timeouts.get(kind)
        return value if isinstance(value, int | float) else None


def _render_head(request: httpx2.Request, body_length: int) -> bytes:
    """The request line and headers of `request` as they go on the wire (refused if a header holds
    CR, LF or NUL), with `body_length` as its length."""
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), request.url.raw_path)]
    has_length = False
    for name, value in request.headers.raw:
        if any(bad in name or bad in value for bad in _FORBIDDEN_IN_HEADERS):
            raise httpx2.LocalProtocolError(f"header {name.decode('latin-1')!r} holds CR, LF or NUL")
        if name.lower() == b"transfer-encoding":
            continue  # a streamed body was read whole: it goes out with its length instead
        has_length = has_length or name.lower() == b"content-length"
        lines.append(b"%s: %s\r\n" % (name, value))
    if not has_length and (body_length or request.method not in ("GET", "HEAD", "DELETE")):
        lines.append(b"content-length: %d\r\n" % body_length)
    lines.append(b"\r\n")
    return b"".join(lines)


async def _head_bytes(reader: asyncio.StreamReader) -> bytes:
    """One head's bytes, every line ending in CRLF. A lone LF is taken for a line's end too (RFC 9112
    §2.2 allows it, and h11, which `https://` upstreams go through, does). When the status line ends
    in CRLF and what is already buffered shows the head ending in CRLF CRLF (as a head that arrived
    whole does), it is read in three reads (about 1 µs less than line by line); else line by line, at
    most `HEAD_LIMIT` bytes in all. (Taking any head whose status line ends in CRLF to end in CRLF
    CRLF awaited, for the read timeout, one whose other lines end in a lone LF, or took it up to a
    CRLF CRLF in its body.)"""
    status = await reader.readuntil(b"\n")
    try:
        if status.endswith(b"\r\n") and _crlf_head_buffered(reader):
            first = await reader.readexactly(2)  # a head with header lines ends in `\n\r\n` past these
            raw = status + first
            if first != b"\r\n":
                raw += await reader.readuntil(b"\n\r\n")
            return raw if raw.count(b"\n") == raw.count(b"\r\n") else _LINE_END.sub(b"\r\n", raw)
        lines = [status]
        size = len(status)
        while lines[-1] not in (b"\n", b"\r\n"):
            lines.append(await reader.readuntil(b"\n"))
            size += len(lines[-1])
            if size > HEAD_LIMIT:
                raise asyncio.LimitOverrunError("the head is too long", size)
        return _LINE_END.sub(b"\r\n", b"".join(lines))
    except asyncio.IncompleteReadError as exc:  # the status line came: an answer was begun
        raise asyncio.IncompleteReadError(status + exc.partial, None) from None


def _crlf_head_buffered(reader: asyncio.StreamReader) -> bool:
    """Does `reader` already hold the rest of a head (past its status line) that ends in CRLF CRLF,
    with no blank line (LF LF) before that end?"""
    buffer: bytearray | None = getattr(reader, "_buffer", None)
    if buffer is None:
        return False
    if buffer[:2] == b"\r\n":
        return True
    end = buffer.find(b"\n\r\n", 0, HEAD_LIMIT)
    return end >= 0 and buffer.find(b"\n\n", 0, end + 1) < 0


def _parse_head(raw: bytes) -> _Head:
    status_line, *header_lines = raw[:-4].split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise httpx2.RemoteProtocolError(f"malformed status line {status_line[:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in header_lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise httpx2.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return _Head(version, int(code), reason, headers)


def _values(head: _Head, name: bytes) -> list[bytes]:
    return [value for key, value in head.headers if key.lower() == name]


def _tokens(head: _Head, name: bytes) -> list[bytes]:
    return [token.strip().lower() for value in _values(head, name) for token in value.split(b",")]


class Dechunker:
    """The chunked transfer coding undone as the bytes arrive: `feed` takes whatever was read and
    gives back the body's bytes among it; `done` once the last chunk and the trailer are in, with
    `rest` holding anything that came after them.

    One read of the socket then yields one piece of the body, however many chunk-size lines, CRLFs
    and trailer lines it holds: an SSE answer (its event's chunk, then the last chunk) is one or two
    reads, where reading each line and each chunk from the stream was five reads through three
    nested generators (`benchmarks/README.md`, the fourteenth round).
    """

    def __init__(self) -> None:
        self._pending = b""  # an incomplete size line, CRLF or trailer line, for the next feed
        self._left = 0  # bytes of the current chunk's data still to come
        self._state = "size"  # "size", "data", "crlf", "trailer" or "done"
        self.rest = b""

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> bytes:
        buffer = self._pending + data if self._pending else data
        body: list[bytes] = []
        at, end = 0, len(buffer)
        while at < end and self._state != "done":
            if self._state == "data":
                take = min(self._left, end - at)
                body.append(buffer[at : at + take])
                at += take
                self._left -= take
                if not self._left:
                    self._state = "crlf"
            elif self._state == "crlf":
                if end - at < 2:
                    break
                if buffer[at : at + 2] != b"\r\n":
                    raise httpx2.RemoteProtocolError("chunk not followed by CRLF")
                at += 2
                self._state = "size"
            else:
                line_end = buffer.find(b"\r\n", at)
                if line_end < 0:
                    if end - at > HEAD_LIMIT:
                        raise httpx2.RemoteProtocolError("malformed chunked body: a line without an end")
                    break
                line, at = buffer[at:line_end], line_end + 2
                if self._state == "size":
                    self._take_size(line)
                elif not line:  # the blank line that ends the trailer
                    self._state = "done"
        if self._state == "done":
            self._pending, self.rest = b"", buffer[at:]
        else:
            self._pending = buffer[at:]
        return body[0] if len(body) == 1 else b"".join(body)

    def _take_size(self, line: bytes) -> None:
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise httpx2.RemoteProtocolError(f"malformed chunk size {line[:40]!r}")
        size = int(match[1], 16)
        self._left = size
        self._state = "data" if size else "trailer"


class _Body(httpx2.AsyncByteStream):
    """A response body as it arrives; hands the connection back to the pool once read to its end."""

    def __init__(
        self,
        transport: Http11Transport,
        key: tuple[str, int],
        connection: _Connection,
        framing: str,
        length: int,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._key = key
        self._connection: _Connection | None = connection
        self._framing = framing  # "length", "chunked" or "close"
        self._length = length
        self._keep_alive = keep_alive
        self._read_timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        reader = connection.reader
        try:
            if self._framing == "length":
                async for chunk in self._span(reader, self._length):
                    yield chunk
            elif self._framing == "chunked":
                dechunker = Dechunker()
                while not dechunker.done:
                    data = await self._read(reader.read(READ_SIZE), _buffered(reader))
                    if not data:
                        raise httpx2.RemoteProtocolError("the upstream closed the connection mid-chunk")
                    if body := dechunker.feed(data):
                        yield body
                if dechunker.rest:  # bytes after the body: the connection is out of step
                    self._keep_alive = False
            else:
                while chunk := await self._read(reader.read(READ_SIZE), _buffered(reader)):
                    yield chunk
                self._keep_alive = False
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise httpx2.ReadError(str(exc) or type(exc).__name__) from exc
        self._finish(reusable=self._keep_alive)

    async def _span(self, reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
        """The body's next `size` bytes as they arrive; an error if the connection ends before them."""
        while size:
            chunk = await self._read(reader.read(min(size, READ_SIZE)), _buffered(reader))
            if not chunk:
                raise httpx2.RemoteProtocolError("the upstream closed the connection mid-body")
            size -= len(chunk)
            yield chunk

    async def _read(self, operation: Awaitable[T], ready: bool) -> T:
        """`operation`, under the read timeout unless it is `ready` (completes from what is buffered)."""
        if ready:
            return await operation
        try:
            async with asyncio.timeout(self._read_timeout):
                return await operation
        except TimeoutError:
            raise httpx2.ReadTimeout("timed out waiting for the upstream's data") from None

    def _finish(self, *, reusable: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._transport.release(self._key, connection, reusable=reusable)

    async def aclose(self) -> None:
        self._finish(reusable=False)  # no-op once read to the end


class _Slots:
    """How many connections may be in use at once; a request waits (up to the pool timeout) for one.

    A semaphore that can also be taken without waiting (`take_now`), for `write_now`.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot as the wait ended: pass it on
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes straight to the longest waiting
                return
        self._free += 1


def body_chunks(response: httpx2.Response) -> AsyncIterator[bytes]:
    """`response`'s body as it arrives, as `aiter_bytes` gives it: straight from this transport's
    stream when there is nothing to decode (no `Content-Encoding`), which skips httpx2's decoding
    and bookkeeping layers (about 15 µs of CPU per answer); through them otherwise."""
    stream = response.stream
    if isinstance(stream, _Body) and "content-encoding" not in response.headers:
        return stream.__aiter__()
    return response.aiter_bytes()


class Http11Transport(httpx2.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio streams, for `http://` URLs (see the module docstring)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots = _Slots(MAX_CONNECTIONS)
        self._closed = False
        self._sweep: asyncio.TimerHandle | None = None  # armed while connections sit idle

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self.send(Outgoing.of(request, await request.aread()))

    def write_now(self, outgoing: Outgoing) -> _Connection | None:
        """Write `outgoing` at once on an idle connection, if one is there and a slot is free; the
        answer is then read by `send(outgoing, written=<the connection returned>)`. None (nothing
        sent) when the request would have to wait for either: `send` then does it all.

        The caller's task writes the request as soon as it has it, and the task that reads the
        answer can start while the upstream works on it.
        """
        if self._closed or not self._slots.take_now():
            return None
        connection = self._reusable(outgoing.key)
        if connection is not None:
            try:
                self._write(connection, outgoing)
                return connection
            except (_StaleConnection, httpx2.WriteError):
                connection.close()  # nothing was sent: `send` starts over
            except BaseException:
                connection.close()
                self._slots.release()
                raise
        self._slots.release()
        return None

    async def send(self, outgoing: Outgoing, written: _Connection | None = None) -> httpx2.Response:
        """Send `outgoing` (unless `write_now` did, on `written`) and read its answer's head; the
        body streams from the response."""
        if written is None:
            if self._closed:
                raise httpx2.ConnectError("the transport is closed")
            await self._acquire(outgoing)
        try:
            while True:
                connection = written or await self._connection(outgoing)
                try:
                    if written is None:
                        self._write(connection, outgoing)
                    written = None
                    response = await self._exchange(connection, outgoing)
                except _StaleConnection:
                    connection.close()
                    continue  # a reused connection only: the next one is new, or another idle one
                except BaseException:
                    connection.close()
                    raise
                return response
        except BaseException:
            self._slots.release()
            raise

    async def _acquire(self, outgoing: Outgoing) -> None:
        if self._slots.take_now():
            return
        try:
            async with asyncio.timeout(outgoing.timeout("pool")):
                await self._slots.take()
        except TimeoutError:
            raise httpx2.PoolTimeout("no connection to the upstream came free in time") from None

    def _reusable(self, key: tuple[str, int]) -> _Connection | None:
        """An idle connection to `key` that can be reused, if any (those past it are closed)."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                connection.reused = True
                return connection
            connection.close()
        return None

    async def _connection(self, outgoing: Outgoing) -> _Connection:
        key = outgoing.key
        connection = self._reusable(key)
        if connection is not None:
            return connection
        try:
            async with asyncio.timeout(outgoing.timeout("connect")):
                reader, writer = await _open_connection(key[0], key[1])
        except TimeoutError:
            raise httpx2.ConnectTimeout("timed out connecting") from None
        except OSError as exc:
            raise httpx2.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(reader, writer)

    def _write(self, connection: _Connection, outgoing: Outgoing) -> None:
        """Hand the request to the connection's transport (whatever the socket does not take at
        once is flushed by `_exchange`)."""
        writer = connection.writer
        try:
            if len(outgoing.body) < READ_SIZE:
                writer.write(outgoing.head + outgoing.body)
            else:
                writer.writelines([outgoing.head, outgoing.body])
        except ConnectionError as exc:
            if connection.reused:
                raise _StaleConnection from exc
            raise httpx2.WriteError(str(exc) or type(exc).__name__) from exc

    async def _exchange(self, connection: _Connection, outgoing: Outgoing) -> httpx2.Response:
        """The written request's answer: its head read, its body left to stream."""
        writer = connection.writer
        try:
            if writer.transport.get_write_buffer_size() > READ_SIZE:
                async with asyncio.timeout(outgoing.timeout("write")):
                    await writer.drain()
        except TimeoutError:
            raise httpx2.WriteTimeout("timed out sending the request") from None
        except ConnectionError as exc:
            if connection.reused:
                raise _StaleConnection from exc
            raise httpx2.WriteError(str(exc) or type(exc).__name__) from exc
        read_timeout = outgoing.timeout("read")
        head = await self._read_head(connection, read_timeout, outgoing.method in REPLAYABLE_METHODS)
        return self._response(connection, outgoing, head, read_timeout)

    async def _read_head(
        self, connection: _Connection, read_timeout: float | None, replayable: bool
    ) -> _Head:
        """The answer's head (interim 1xx answers skipped). `_StaleConnection` when a reused connection
        ended before any byte of an answer: reset (the server did not read the request), or closed
        cleanly and the request is `replayable`."""
        reader = connection.reader
        answered = False
        try:
            async with asyncio.timeout(read_timeout):
                while True:
                    raw = await _head_bytes(reader)
                    answered = True
                    head = _parse_head(raw)
                    if head.status == 101:  # no upgrade is ever asked for (h11 refuses it too)
                        raise httpx2.RemoteProtocolError("the upstream switched protocols (HTTP 101) unasked")
                    if not 100 <= head.status < 200:
                        return head
        except TimeoutError:
            raise httpx2.ReadTimeout("timed out waiting for the upstream's answer") from None
        except asyncio.IncompleteReadError as exc:
            if replayable and connection.reused and not answered and not exc.partial:
                raise _StaleConnection from exc
            raise httpx2.RemoteProtocolError("the upstream closed the connection without answering") from exc
        except asyncio.LimitOverrunError:
            raise httpx2.RemoteProtocolError(f"the answer's head exceeds {HEAD_LIMIT} bytes") from None
        except ConnectionError as exc:
            if connection.reused and not answered and not _buffered(reader) and reader.broken is None:
                raise _StaleConnection from exc  # (bytes came before the break: not a stale connection)
            raise httpx2.ReadError(str(exc) or type(exc).__name__) from exc

    def _response(
        self, connection: _Connection, outgoing: Outgoing, head: _Head, read_timeout: float | None
    ) -> httpx2.Response:
        said_close = outgoing.close or b"close" in _tokens(head, b"connection")
        keep_alive = head.version == b"HTTP/1.1" and not said_close
        framing, length = "length", 0
        if outgoing.method == "HEAD" or head.status in (204, 304):
            pass
        elif codings := _tokens(head, b"transfer-encoding"):
            if codings != [b"chunked"]:  # a coding under it would pass its coded bytes on as the body
                raise httpx2.RemoteProtocolError("unsupported transfer coding")
            framing = "chunked"
        elif lengths := {value.strip() for value in _values(head, b"content-length")}:
            (text,) = lengths if len(lengths) == 1 else (b"",)
            if not text.isdigit():
                raise httpx2.RemoteProtocolError("malformed or conflicting Content-Length")
            length = int(text)
        else:
            framing = "close"
        stream = _Body(self, outgoing.key, connection, framing, length, keep_alive, read_timeout)
        return httpx2.Response(
            head.status,
            headers=head.headers,
            stream=stream,
            extensions={"http_version": head.version, "reason_phrase": head.reason},
        )

    def release(self, key: tuple[str, int], connection: _Connection, *, reusable: bool) -> None:
        """A response is done with `connection`: back to the pool, or closed."""
        connection.reader.unwatch()
        self._slots.release()
        idle = self._idle.setdefault(key, [])
        if reusable and not _buffered(connection.reader) and not self._closed and len(idle) < MAX_IDLE:
            connection.idle_since = time.monotonic()
            idle.append(connection)
            if self._sweep is None:
                with suppress(RuntimeError):  # no event loop running (finalized late): none to arm
                    self._sweep = asyncio.get_running_loop().call_later(KEEPALIVE_EXPIRY, self._sweep_idle)
        else:
            connection.close()

    def _sweep_idle(self) -> None:
        """Close the idle connections that are no longer usable (past the expiry, or closed by the
        server); armed again for the next expiry while any are left."""
        self._sweep = None
        now = time.monotonic()
        oldest: float | None = None
        for key, idle in list(self._idle.items()):
            kept = []
            for connection in idle:
                if connection.usable(now):
                    kept.append(connection)
                    oldest = connection.idle_since if oldest is None else min(oldest, connection.idle_since)
                else:
                    connection.close()
            if kept:
                idle[:] = kept
            else:
                del self._idle[key]
        if oldest is not None and not self._closed:
            delay = oldest + KEEPALIVE_EXPIRY - now + 0.01  # just past it: not usable any more then
            self._sweep = asyncio.get_running_loop().call_later(delay, self._sweep_idle)

    async def aclose(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
