"""The HTTP connections the sidecar accepts: uvicorn's HTTP/1.1 protocol with the limits it lacks.

uvicorn closes a connection left idle after a response (`timeout_keep_alive`), but not one that
never finishes sending a request's headers — nor one that sends nothing at all — and it accepts any
number of connections. Each would hold a socket and memory forever. Here a connection must deliver
the headers of each request within `header_timeout` seconds (counted from connecting, or from the
previous response), and in at most `HEAD_LIMIT` bytes, or it is closed — a request pipelined behind
one in flight too, whose head llhttp would otherwise take without end; and a connection beyond
`max_connections` is closed as soon as it is accepted. Once a request's headers are in, the request
is the application's: long-lived SSE responses are not cut (nor one pipelined behind another, which
uvicorn starts as the first completes), and a slow body is the app's `--body-timeout` (408). When the
connection is lost every unfinished request on it hears of it, not only the last one uvicorn parsed
(a client that pipelined a request behind an SSE stream and left would otherwise leave the stream's
handler running). When the application answers before reading a body (a `413`), what is left
of it is read and dropped (uvicorn does that once the response is out), so that the client, still
sending, gets to read the answer; at most `DRAIN_LIMIT` bytes, and within `header_timeout` of the
response, as the next request's headers would be. A refused request that asked for
`Expect: 100-continue` and sent no body byte is not waited for: no `100 Continue` went out, so its
client sends no body, and the connection is closed instead. What all connections together read that way is
held to `DRAIN_RATE` bytes a second (`DrainBudget`): past it, a draining connection stops reading
until the budget has room again, so that a client sending refused bodies back to back cannot make
the sidecar spend its CPU reading them (`benchmarks/README.md`, scenario 6). Bytes that are no
request, after requests read whole (a body longer than its `Content-Length`), get their `400` once
those requests are answered: uvicorn wrote it at once and closed, in place of the answers of
requests the application had already taken (and relayed).

A read that is one whole request, on a connection with nothing in flight, is offered to the lane
(`lane.py`) before uvicorn's parser reads it; uvicorn reads it only if the lane leaves it, or later,
when the lane needs the request's cycle after all (`adopt`).

The protocol underneath is uvicorn's httptools one (llhttp, a C parser) when `httptools` is
installed, as it is with this package: about a third less CPU per request than its pure-Python h11
one, which is the fallback (`benchmarks/README.md`, "the HTTP front's parser").
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from mcp_backfill.logs import get_logger
from mcp_backfill.options import named
from mcp_backfill.sidecar.http_io import CUT_OFF

if TYPE_CHECKING:
    from mcp_backfill.sidecar.lane import Lane, LanePost, Verdict
    from mcp_backfill.sidecar.whole_request import KnownHead

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools missing (a platform without its wheel): h11
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

log = get_logger("sidecar")

# The most a request's line and headers may take (h11's own limit is 16 KiB; llhttp has none).
HEAD_LIMIT = 64 * 1024
# The most of a request's body read and dropped after its response went out (a body refused as too
# large, `413`): beyond it the connection is closed, and a client still sending may get a reset.
DRAIN_LIMIT = 4 * 1024 * 1024
# The most all connections together read and drop of refused bodies in a second (after a burst of
# `DRAIN_LIMIT`): a refused body under the limit still drains at once when nobody else is draining.
DRAIN_RATE = 8 * 1024 * 1024
# A body at least this large goes out after a held response head without being copied onto it.
BIG_WRITE = 64 * 1024


def _cut_off(cycle: weakref.ref[Any]) -> Callable[[], bool]:
    """The `CUT_OFF` extension of a request (weak: the cycle holds its scope, which holds this)."""

    def cut_off() -> bool:
        alive = cycle()
        return alive is not None and bool(alive.disconnected)

    return cut_off


class DrainBudget:
    """A token bucket for the bytes of refused bodies read and dropped: `rate` a second, `burst` at
    most in hand. Bytes already read are charged as they come (the budget may go into debt); the
    connection that read them then waits until the debt is paid."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._level = burst
        self._at = clock()

    def charge(self, size: int) -> float:
        """Charge `size` bytes read; returns the seconds to wait before reading more (0: none)."""
        now = self._clock()
        self._level = min(self._burst, self._level + (now - self._at) * self._rate) - size
        self._at = now
        return 0.0 if self._level >= 0 else -self._level / self._rate


class _Guard:
    """The limits, over either uvicorn protocol (which must come after it in the bases)."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    drain_budget: DrainBudget  # one per server: every connection's drains share it
    # Provided by the uvicorn protocol class this is mixed into.
    connections: set[Any]
    cycle: Any
    expect_100_continue: bool  # the request parsed last asked for it (httptools)
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    app: Any  # the application as uvicorn runs it
    server_state: Any  # uvicorn's: the count of requests answered, among others
    timeout_keep_alive: int  # how long uvicorn keeps a connection open that sends nothing after an answer
    _unset_keepalive_if_required: Callable[[], None]  # cancels that timer

    _head_timer: asyncio.TimerHandle | None = None
    _head_due = 0.0  # when a head begun after an answer must be complete (`_head_after_answer`)
    _head_bytes = 0
    _head_open = False  # a request's head is being parsed (httptools only)
    _head_begun = False  # ... and it began in the bytes being parsed now
    _body_seen = False  # a byte of the last request's body arrived (httptools only)
    _request_done = True  # the last request was read to its end, body included (httptools only)
    _draining = False  # its response went out first: the rest of its body is being dropped
    _drained = 0  # bytes of that rest so far
    _bad_request: str | None = None  # the 400 held until the requests before it are answered
    lane: Lane | None = None  # offered each request whose head and body came together (`lane.py`)
    lane_post: LanePost | None = None  # the request the lane is answering
    lane_verdict: Verdict | None = None  # `Lane._verdict`
    lane_head: KnownHead | None = None  # the last request's head the lane read whole (`Lane.take_whole`)
    requests_begun = 0  # requests read on it so far: whole by the lane, or by uvicorn's parser
    _lane_held: tuple[Any, Any] | None = None  # (cycle, app) of a request offered once its body is in
    _in_head = False  # uvicorn is starting a request whose head was just parsed
    _adopting = False  # uvicorn is reading a request the lane read whole itself (`adopt`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._cycles: weakref.WeakSet[Any] = weakref.WeakSet()  # every request's, while it lives
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.max_connections:
            log.warning(
                f"connection refused: too many open connections ({named('--max-connections')})",
                extra={"connections": len(self.connections) - 1},
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        lane = self.lane
        if lane is not None:
            if self.lane_post is not None:
                self.lane_post.adopt()  # uvicorn must know of a request the lane read itself first
            elif self._between_requests():
                self.requests_begun += 1  # (counted again by uvicorn's parser if the lane leaves it)
                if lane.take_whole(self, data):
                    self._unset_keepalive_if_required()  # as uvicorn does when a request's bytes come
                    self._disarm()
                    return
        waiting = self.cycle is None or self.cycle.response_complete
        draining = self._draining
        self._head_begun = False
        super().data_received(data)  # type: ignore[misc]
        if self._lane_held is not None:  # its body did not come with its head: the app's
            cycle, app = self._lane_held
            self._lane_held = None
            self._start_app(cycle, app)
        if self.cycle is not None and not self.cycle.response_complete:
            if self._head_timer is not None:
                self._disarm()  # a request's headers are in: the rest is the application's
            if self._head_open and not self._head_begun:  # a request pipelined behind it: its head
                self._head_bytes += len(data)
                if self._head_bytes > HEAD_LIMIT and not self.transport.is_closing():
                    log.info("connection closed: request headers over the size limit")
                    self.transport.close()
        elif self.transport.is_closing():
            pass
        elif draining:
            self._drained += len(data)
            if self._draining and self._drained > DRAIN_LIMIT:
                log.info("connection closed: the rest of a refused request's body is over the drain limit")
                self.transport.close()
            elif self._draining:
                wait = self.drain_budget.charge(len(data))
                if wait > 0:  # `--header-timeout`, armed at the response, still bounds the whole drain
                    self.transport.pause_reading()
                    self.loop.call_later(wait, self._drain_on)
        elif waiting:
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_LIMIT:
                log.info("connection closed: request headers over the size limit")
                self.transport.close()
            elif self._head_timer is None:  # a head begun after an answer: due as it was then
                self._head_timer = self.loop.call_at(self._head_due, self._timed_out)

    # httptools' parser callbacks (uvicorn's h11 protocol has none: there `_request_done` stays True)
    def on_message_begin(self) -> None:
        if not self._adopting:  # (one the lane read whole itself was counted then)
            self.requests_begun += 1
        self._request_done = False
        self._body_seen = False
        self._head_open = self._head_begun = True
        if self.cycle is not None and not self.cycle.response_complete:
            self._head_bytes = 0  # pipelined: counted from here (the bytes it began in, not)
        super().on_message_begin()  # type: ignore[misc]

    def on_body(self, body: bytes) -> None:
        self._body_seen = True
        super().on_body(body)  # type: ignore[misc]

    def on_message_complete(self) -> None:
        self._request_done = True
        self._draining = False
        super().on_message_complete()  # type: ignore[misc]
        held = self._lane_held
        if held is not None and held[0] is self.cycle:
            self._lane_held = None
            if self.lane is None or not self.lane.take(self, held[0]):
                self._start_app(*held)

    def answered_earlier(self, request: int) -> None:
        """The books of the answer to the connection's request number `request` (`requests_begun`),
        which the lane wrote before the relay routed it (`LanePost.answer_ahead`), kept once it has:
        as `on_response_complete`, unless a request began on the connection since. Its own answer
        keeps them then, and the keep-alive timer armed now would close the connection under it:
        the answer is only counted."""
        if request == self.requests_begun:
            self.on_response_complete()
        else:
            self.server_state.total_requests += 1

    def _between_requests(self) -> bool:
        """Is the connection idle, its last request answered and nothing of another read yet?"""
        cycle = self.cycle
        return (
            (cycle is None or cycle.response_complete)
            and self._request_done
            and not self._draining
            and self._bad_request is None
            and not self.transport.is_closing()
        )

    def adopt(self, data: bytes) -> Any:
        """uvicorn's cycle for a request the lane read whole itself (`Lane.take_whole`): `data` read
        by uvicorn's parser now, as every request is, but its application not started; the lane's
        post holds the cycle as it holds one it took from uvicorn (`LanePost.adopt`)."""
        self._adopting = True
        try:
            super().data_received(data)  # type: ignore[misc]
        finally:
            self._adopting = False
        return self.cycle

    def shutdown(self) -> None:
        """uvicorn's start of a graceful shutdown: a request in flight gets its answer, then the
        connection closes; one the lane read whole itself is in flight too (uvicorn's own check would
        close the connection under it)."""
        if self.lane_post is not None:
            self.lane_post.adopt()
        super().shutdown()  # type: ignore[misc]

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's start of a request's application; a request the lane may take waits for its
        body (within the bytes being parsed now) first."""
        if self._adopting:
            return  # the lane's already
        if self._in_head and self.lane is not None and self.lane.may_take(cycle.scope):
            self._lane_held = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def start_app(self, cycle: Any) -> None:
        """Start the application for a request the lane hands over."""
        self._start_app(cycle, self.app)

    def _start_app(self, cycle: Any, app: Any) -> None:
        """Start the application for a request held for the lane: made ready for it first, as
        `on_headers_complete` makes the others."""
        self._ready_for_app(cycle)
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._in_head = True
        try:
            super().on_headers_complete()  # type: ignore[misc]
        finally:
            self._in_head = False
        cycle = self.cycle
        held = self._lane_held
        if cycle is not None and not self._adopting and (held is None or held[0] is not cycle):
            self._ready_for_app(cycle)
        # (one held for the lane is made ready only if the app gets it: most never reach it)

    def _ready_for_app(self, cycle: Any) -> None:
        self._take(cycle)
        # Not for HEAD: uvicorn writes no body after its head, so a held head would never go out.
        if cycle.transport is self.transport and cycle.scope["method"] != "HEAD":
            cycle.transport = OneWriteResponse(self.transport, cycle)

    def on_response_complete(self) -> None:
        self._draining, self._drained = not self._request_done, 0
        if self._draining and self.expect_100_continue and not self._body_seen:
            log.info("connection closed: a refused request's body was never sent (Expect: 100-continue)")
            self.transport.close()
        super().on_response_complete()  # type: ignore[misc]
        if self._bad_request is not None and not self._answering():
            super().send_400_response(self._bad_request)  # type: ignore[misc]
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._head_after_answer()  # (a pipelined request uvicorn has just started is the application's)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are no request. After requests read whole and still being
        answered, it waits for their answers (nothing more is read meanwhile); within a request's
        body, which the application is reading, it goes at once, as uvicorn sends it."""
        between = self._request_done or self._head_open  # not within a body the application reads
        if between and self._answering() and not self.transport.is_closing():
            self._bad_request = msg
            self.transport.pause_reading()
            return
        super().send_400_response(msg)  # type: ignore[misc]

    def _take(self, cycle: Any) -> None:
        """A request's cycle, before its application runs: told when the connection is lost, and
        able to tell its handler that its response was cut off (`CUT_OFF`)."""
        self._cycles.add(cycle)
        cycle.scope.setdefault("extensions", {})[CUT_OFF] = _cut_off(weakref.ref(cycle))

    def _answering(self) -> bool:
        """Is a request read on this connection still waiting for (the end of) its answer?"""
        return (
            self.lane_post is not None
            or self._lane_held is not None
            or any(not cycle.response_complete for cycle in self._cycles)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lane_held = None
        if self.lane_post is not None:
            self.lane_post.lost()
        for cycle in list(self._cycles):
            if not cycle.response_complete:  # uvicorn tells only the one it parsed last
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)  # type: ignore[misc]

    def _drain_on(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def _arm(self) -> None:
        self._disarm()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout, self._timed_out)

    def _head_after_answer(self) -> None:
        """After an answer the next head is due within `header_timeout`. uvicorn's keep-alive timer,
        armed with the answer, closes a connection that sends nothing; when it would do so first,
        the head's own timer is armed only once bytes come (`data_received`), due as it would have
        been: most requests come whole in one read and need none (a timer armed and cancelled per
        call, `benchmarks/README.md`, the thirty-first round). A drain is timed from the answer."""
        if self._draining or self.header_timeout < self.timeout_keep_alive:
            self._arm()
            return
        self._disarm()
        self._head_bytes = 0
        self._head_due = self.loop.time() + self.header_timeout

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info(f"connection closed: no complete request headers within {named('--header-timeout')}")
            self.transport.close()


class OneWriteResponse:
    """The transport as one response's cycle writes to it: the head of a response of known length
    is held back until the body's first part, and both go out in one write.

    uvicorn writes a response's head and its body separately: two system calls, and two wake-ups
    of the client, which reads the head and then waits for the rest, for every JSON answer
    (`benchmarks/README.md`, 3b). A streamed response (no `Content-Length`: SSE) has its head
    written at once, so that the client sees the stream open before its first event.

    To an HTTP/1.0 request, a streamed response goes without uvicorn's chunked framing, which
    HTTP/1.0 does not know (RFC 9112 §6.1: the client read the chunk sizes as part of the stream):
    its body is the data as it is, ended by the connection's close (uvicorn closes every HTTP/1.0
    connection after its response, and says `connection: close`).
    """

    __slots__ = ("_cycle", "_head_seen", "_held", "_transport", "_unchunk")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        # Weak: the cycle holds this as its transport, and a reference cycle would keep each
        # request's cycle, its body included, until the garbage collector's next full pass.
        self._cycle = weakref.ref(cycle)
        self._held: bytes | None = None
        self._head_seen = False
        self._unchunk = False

    def write(self, data: bytes) -> None:
        if self._unchunk:
            if body := unchunked(data):
                self._transport.write(body)
            return
        held = self._held
        if held is not None:
            self._held = None
            if len(data) < BIG_WRITE:
                self._transport.write(held + data)
            else:
                self._transport.writelines((held, data))
            return
        cycle = None if self._head_seen else self._cycle()
        if cycle is not None and cycle.response_started:
            self._head_seen = True  # uvicorn's first write once the response has started: the head
            if cycle.chunked_encoding is False:
                self._held = data
                return
            if cycle.chunked_encoding and cycle.scope["http_version"] == "1.0" and not cycle.keep_alive:
                self._unchunk = True
                data = data.replace(b"\r\ntransfer-encoding: chunked\r\n", b"\r\n", 1)
        self._transport.write(data)

    def close(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._transport.write(held)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def unchunked(data: bytes) -> bytes:
    """The data of the chunks in `data`, as uvicorn's httptools protocol writes them: whole chunks
    (each `size CRLF data CRLF`) and, at the end, the last chunk (`0 CRLF CRLF`), which goes."""
    parts: list[bytes] = []
    at = 0
    while at < len(data):
        line_end = data.index(b"\r\n", at)
        size = int(data[at:line_end], 16)
        if size == 0:
            break
        start = line_end + 2
        parts.append(data[start : start + size])
        at = start + size + 2
    return b"".join(parts)


class GuardedH11Protocol(_Guard, H11Protocol):
    """The guard over uvicorn's h11 protocol (when httptools is not installed)."""

    def handle_events(self) -> None:
        # h11 has no parser callbacks: a request's cycle is new once uvicorn has parsed its head
        # here (its application's task created, not yet run). Without `CUT_OFF`, a POST's SSE
        # stream cut off on this protocol counted as read whole, and its resumption lost events.
        taken = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not taken:
            self._take(cycle)

    def send_400_response(self, msg: str) -> None:
        # h11 parses no request while one is answered (it pauses): a 400 then is within the body
        # the application reads, and goes at once, as uvicorn sends it.
        H11Protocol.send_400_response(self, msg)


def guarded_protocol(header_timeout: float, max_connections: int, lane: Lane | None = None) -> type[Any]:
    """The protocol class for uvicorn's `http=` setting, with these limits (httptools when installed),
    and the `lane` (httptools only: h11 parses no request while one is answered)."""
    base: type[Any] = GuardedH11Protocol
    if HttpToolsProtocol is not None:
        base = type("GuardedHttpToolsProtocol", (_Guard, HttpToolsProtocol), {})
    limits = {
        "header_timeout": header_timeout,
        "max_connections": max_connections,
        "drain_budget": DrainBudget(DRAIN_RATE, DRAIN_LIMIT),
        "lane": lane if HttpToolsProtocol is not None else None,
    }
    return type(base.__name__, (base,), limits)
