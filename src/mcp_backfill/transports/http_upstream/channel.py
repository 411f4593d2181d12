"""A streamable-HTTP MCP server as the relay's upstream `MessageChannel`.

Each message the relay sends becomes a POST. A request's answer comes back on that POST, as one JSON
body or as an SSE stream carrying any number of server messages before the response; notifications
and responses are acknowledged with 202. What else a POST carries depends on the protocol era, and
the first request that can tell picks it: an `initialize` the handshake era (`handshake.py`: a
session), a request declaring a 2026-07-28 version in `params._meta` the stateless one
(`stateless.py`: routing headers on every POST).

Messages are handed on as the exact bytes of the body or SSE `data:` payload. Every delivered message
is attributed to the JSON-RPC id of the POST whose stream carried it (None: the GET stream), so a
front that serves several HTTP streams can route it. Whatever goes wrong on the way, a request gets
an answer: HTTP failures become JSON-RPC errors for the request ids that POST carried.

One `HttpUpstream` is one upstream session; several may share one `httpx2.AsyncClient`. When the
server forgets the session (HTTP 404 to its `Mcp-Session-Id`), the channel ends as a child process's
does when it exits: the requests in flight are answered with an error saying so, and the relay, seeing
its upstream end, stops what it still does for the session (its Claude calls, whose answers nobody can
take any more). The spec has the client start a new session then; the proxy does not do that behind
its client's back: the sidecar's client gets 404 for its own session, a stdio client sees the wrapper
exit, and either starts anew.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import httpx2
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.logs import get_logger
from mcp_backfill.options import shutting_down
from mcp_backfill.transports.base import ELSEWHERE_POLL_SECONDS, nothing_elsewhere
from mcp_backfill.transports.deadlines import Deadlines
from mcp_backfill.transports.http_upstream import early
from mcp_backfill.transports.http_upstream.exchange import EraLeg, ExchangeReader, Item, PostExchange
from mcp_backfill.transports.http_upstream.handshake import HandshakeLeg
from mcp_backfill.transports.http_upstream.headers import stateless_version, unsendable_routing
from mcp_backfill.transports.http_upstream.settings import HttpUpstreamSettings, make_http_client
from mcp_backfill.transports.http_upstream.stateless import StatelessLeg
from mcp_backfill.transports.queue import MessageQueue

log = get_logger("http")

# Messages read from the upstream that may wait for the relay before the next reader waits.
INBOX_SIZE = 16
# A request's POST is written from the relay's task, as soon as the relay hands it on, while at most
# this many exchanges are in flight in the whole process: a lone session's call is answered sooner.
# Under more load the exchanges' own tasks write them, together, and a busy upstream is woken less
# often (`benchmarks/README.md`, 3b, "the immediate write under load").
EAGER_WRITES_UP_TO = 2


class HttpUpstream:
    """One upstream session over streamable HTTP, as a `MessageChannel` (plus `receive_with_origin`).

    It keeps what both eras share (the inbox, the exchanges in flight, shutdown) and hands each
    message to the leg of its era: a request to the leg its own body names (see `_leg_for`), a
    notification or response to the era's leg.

    Long because every way a message goes out (from the relay's task or at once, as a request's
    exchange or a one-way POST) and every way an exchange ends (its task, or its answer read from
    the callback) meet the counts `stop` waits on here; split, each part would take them all along.
    """

    exchanges_everywhere = 0
    """Exchanges in flight in this process, every upstream together."""

    def __init__(
        self, settings: HttpUpstreamSettings, http: httpx2.AsyncClient, task_group: TaskGroup
    ) -> None:
        self.settings = settings
        self._tg = task_group
        self._inbox = MessageQueue[Item](INBOX_SIZE)
        self._reader = ExchangeReader(settings, http, self._inbox)
        self.reader = self._reader
        self._handshake = HandshakeLeg(self._reader, task_group)
        self._handshake.on_expired = self._session_expired
        self._stateless = StatelessLeg(self._reader)
        self._era: EraLeg | None = None  # None until a request decides it
        self._exchanges = self._reader.exchanges
        self._reader.answered_elsewhere = self._answered_elsewhere
        self._active = 0
        self._idle: anyio.Event | None = None  # made by `_settled` when it must wait
        self._stop_started = False
        self._taker: early.AtOnce | None = None  # see `deliver_at_once`
        self.patience = Deadlines(early.PATIENCE)  # of the answers read early (`_ReadEarly`)
        self._one_way_done = anyio.Event()  # set when the last of them is acknowledged
        self._one_way = 0  # messages that are no request, sent by `send_now`, not acknowledged yet
        self._stopped = anyio.Event()
        self._ended = False  # `_stopped` is set (read on every message: a plain attribute is cheaper)
        self.stop_reason: str | None = None
        """Set by `stop`: what requests still unanswered when it ended the session are told."""

    @property
    def channel(self) -> HttpUpstream:
        return self

    @property
    def url(self) -> httpx2.URL:
        return self._reader.url

    @property
    def session_id(self) -> str | None:
        return self._handshake.session_id

    @property
    def protocol_version(self) -> str | None:
        """The version `initialize` negotiated (handshake era)."""
        return self._handshake.protocol_version

    @property
    def failed(self) -> bool:
        """The upstream was unreachable or lost the session at some point."""
        return self._reader.failed

    @property
    def exit_status(self) -> int:
        return 1 if self.failed else 0

    # -- MessageChannel ------------------------------------------------------------------------

    async def receive(self) -> bytes:
        message, _ = await self.receive_with_origin()
        return message

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        """The next message and the id of the request whose POST stream carried it (None: GET stream)."""
        payload, origin = await self._inbox.receive()
        if isinstance(payload, MessageTooLarge):
            raise payload
        return payload, origin

    def deliver_at_once(self, taker: early.AtOnce) -> None:
        """Hand the messages of a POST's answer to `taker` as they arrive, while it is ready and
        nothing read before them waits for the relay (`early.py`)."""
        if early.AVAILABLE:
            self._taker = _AfterTheInbox(self._inbox, taker)

    def can_send_now(self) -> bool:
        """`SendsAtOnce`: while no message that is no request is being POSTed (those wait for
        their acknowledgement, and what comes after them waits with them)."""
        return self._one_way == 0 and not self._ended

    def send_now(self, message: bytes, related: Any = None) -> None:
        """`send`, from outside a task: a request's POST is written at once; any other message
        is POSTed by a task of its own, and `can_send_now` says no until it is acknowledged."""
        decoded = self._start_or_decode(message)
        if decoded is _STARTED:
            return
        self._one_way += 1
        self._tg.start_soon(self._send_one_way, message, decoded)

    def post_ahead(self, message: bytes, request: dict[str, Any]) -> bool:
        """`PostsAhead`: a request of the handshake era's, other than `initialize`, is written at
        once, as `send_now` would write it; `send_now` of the same bytes then begins its exchange."""
        if (
            self._ended
            or self._one_way
            or request.get("method") == protocol.INITIALIZE
            or stateless_version(request) is not None
            or HttpUpstream.exchanges_everywhere >= EAGER_WRITES_UP_TO
        ):
            return False
        return self._handshake.post_ahead(message)

    async def _send_one_way(self, message: bytes, decoded: Any) -> None:
        try:
            await self._post_one_way(message, decoded)
        finally:
            self._one_way -= 1
            if not self._one_way:
                self._one_way_done.set()
                self._one_way_done = anyio.Event()

    async def send(self, message: bytes, related: Any = None) -> None:
        """POST one message. `related` (the server request a message answers) needs no routing here:
        every message is its own POST, and the server matches responses by their id. Waits first
        for what `send_now` is still POSTing: messages go out in order."""
        while self._one_way:
            await self._one_way_done.wait()
        decoded = self._start_or_decode(message)
        if decoded is not _STARTED:
            await self._post_one_way(message, decoded)

    def _start_or_decode(self, message: bytes) -> Any:
        """Start the exchange of a message carrying requests (`_STARTED`); else the message decoded
        (None: it does not decode), for `_post_one_way`."""
        if self._ended:
            raise anyio.ClosedResourceError
        try:
            decoded = jsonrpc.decode(message)
        except ValueError:
            decoded = None
        items = decoded if isinstance(decoded, list) else [decoded]
        era = self._era or self._handshake
        if isinstance(decoded, list):
            # A cancel in a batch (2025-03-26) lets go of its request as a lone one does; the batch
            # still goes to the server whole, which learns of it so.
            for item in items:
                if _is_cancel(item):
                    self._cancelled_here(item, era)
        requests = [item for item in items if _is_request(item)]
        if requests:
            self._start_exchange(message, requests, batch=isinstance(decoded, list))
            return _STARTED
        return decoded

    async def _post_one_way(self, message: bytes, decoded: Any) -> None:
        """POST a message that carries no request (a notification, a response, a batch of them)."""
        items = decoded if isinstance(decoded, list) else [decoded]
        era = self._era or self._handshake
        if not isinstance(decoded, list) and _is_cancel(decoded) and self._cancelled_here(decoded, era):
            return
        try:
            await era.post_one_way(message, items)
        except Exception:  # logged, like any message that cannot be delivered
            log.exception("posting a message upstream failed unexpectedly")

    # -- lifecycle -------------------------------------------------------------------------------

    async def stop(self, grace: float, *, in_flight_elsewhere: Callable[[], bool] = nothing_elsewhere) -> int:
        """Let requests in flight finish (up to `grace` seconds), fail the rest, end the session.

        In flight are the POSTs open and, while `in_flight_elsewhere()` says so, requests no POST
        carries now (the rounds of a request the proxy answers itself, between two POSTs): the same
        grace covers both.

        Afterwards `receive()` drains what is left and then raises `EndOfStream`. Idempotent; returns
        the exit status (1 when the upstream was unreachable or lost the session at some point).
        """
        if self._stop_started:
            await self._stopped.wait()
            return self.exit_status
        self._stop_started = True
        try:
            with anyio.move_on_after(grace):
                await self._settled(in_flight_elsewhere)
            reason = shutting_down("the upstream had not answered", "--shutdown-grace", grace)
            # A request whose round the proxy answers (no POST open) was not done either.
            self.stop_reason = self.stop_reason or shutting_down(
                "the request was not answered", "--shutdown-grace", grace
            )
            for exchange in {id(e): e for e in self._exchanges.values()}.values():
                exchange.failure = exchange.failure or reason
                self._cancel(exchange)
            with anyio.move_on_after(max(grace, 1.0)):
                await self._settled()
            # The notifications and responses `send_now` is still POSTing go before the session's
            # end, as they did when the relay's task POSTed them (it waited for each one's answer
            # before it read the client's end): the DELETE overtook them, and they were cancelled.
            with anyio.move_on_after(max(grace, self.settings.one_way_timeout)):
                while self._one_way:
                    await self._one_way_done.wait()
            await self._handshake.end(max(grace, 1.0))
        finally:
            self._inbox.close()
            self._ended = True
            self._stopped.set()
        return self.exit_status

    def _session_expired(self) -> None:
        """The server forgot the session: this channel ends (see the module's docstring)."""
        self.stop_reason = self._handshake.expired_text()
        self._tg.start_soon(self._end_expired, self.stop_reason)

    async def _end_expired(self, reason: str) -> None:
        """Fail the requests still in flight with `reason`, then end the messages: the relay reads
        what is left, those errors included, and then the end."""
        for exchange in {id(e): e for e in self._exchanges.values()}.values():
            exchange.failure = exchange.failure or reason
            self._cancel(exchange)
        with anyio.move_on_after(max(self.settings.finish_timeout, 1.0)):
            await self._settled()
        self._inbox.close()

    async def _settled(self, in_flight_elsewhere: Callable[[], bool] = nothing_elsewhere) -> None:
        """Until no POST is in flight, nor a request `in_flight_elsewhere`."""
        while self._active or in_flight_elsewhere():
            if not self._active:  # the proxy answers a round: its next POST may follow
                await anyio.sleep(ELSEWHERE_POLL_SECONDS)
                continue
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    # -- requests --------------------------------------------------------------------------------

    def _leg_for(self, method: str, version: str | None) -> EraLeg:
        """The leg that carries a request, deciding the era on the way.

        An `initialize` (re)opens the handshake era, also after a stdio client's `server/discover`
        that an old server did not know. A request declaring a stateless version goes stateless,
        and picks that era if nothing did before. Any other request is a handshake-era POST (a plain
        one while there is no session), and so is every request once the session expired: it fails
        (while the channel ends).
        """
        if method == protocol.INITIALIZE:
            self._era = self._handshake
            return self._handshake
        if version is None or self._handshake.expired:
            return self._handshake
        if unsendable_routing(version, method) is None:  # else the request is refused, and kept by none
            self._stateless.version = version
        if self._era is None:
            self._era = self._stateless
        return self._stateless

    def _start_exchange(self, body: bytes, requests: list[dict[str, Any]], *, batch: bool) -> None:
        first = requests[0]
        version = None if batch else stateless_version(first)
        exchange = PostExchange(
            origin=first["id"],
            leg=self._leg_for(first["method"], version),
            methods={jsonrpc.id_key(r["id"]): r["method"] for r in requests},
            ids=[r["id"] for r in requests],
            params=first.get("params"),
            stateless_version=version,
            batch=batch,
        )
        exchange.expected = set(exchange.methods)
        for key in exchange.expected:
            superseded = self._exchanges.get(key)
            if superseded is not None:
                # A reused id: the old POST can no longer be told apart from the new one.
                superseded.abandoned = True
                self._cancel(superseded)
            self._exchanges[key] = exchange
        self._active += 1
        HttpUpstream.exchanges_everywhere += 1
        ahead = self._reader.claim_ahead(body, exchange)  # written already (`post_ahead`)
        if ahead or HttpUpstream.exchanges_everywhere <= EAGER_WRITES_UP_TO:
            if not ahead:
                exchange.leg.write_now(body, exchange)
            written, taker = exchange.written, self._taker
            if (
                written is not None
                and taker is not None
                and exchange.leg is self._handshake
                and early.AVAILABLE
            ):
                written.read_early(_ReadEarly(self, exchange, body, taker), self.settings.max_message_bytes)
                return
        self.carry(body, exchange)

    def carry(self, body: bytes, exchange: PostExchange) -> None:
        """Start the exchange's task."""
        self._tg.start_soon(self._run_exchange, body, exchange)

    async def _run_exchange(self, body: bytes, exchange: PostExchange) -> None:
        try:
            with exchange.scope:
                try:
                    await exchange.leg.carry(body, exchange)
                except Exception as exc:  # a bug here must cost one request, not the session
                    log.exception("HTTP exchange failed unexpectedly", extra={"method": exchange.method})
                    exchange.failure = f"Internal error in mcp-backfill's HTTP upstream: {type(exc).__name__}"
            if exchange.expected and not exchange.abandoned:
                await self._reader.fail(exchange, exchange.unanswered_reason(), exchange.failure_code)
        finally:
            self._reader.discard_written(exchange)  # when it never got as far as reading the answer
            self.ended(exchange)

    def ended(self, exchange: PostExchange) -> None:
        """An exchange owes nothing more, or never will."""
        for key in exchange.methods:
            if self._exchanges.get(key) is exchange:
                del self._exchanges[key]
        self._active -= 1
        HttpUpstream.exchanges_everywhere -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    def _cancel(self, exchange: PostExchange) -> None:
        """Cancel an exchange's task (started now if its answer was being read early)."""
        if exchange.read_early is not None:
            exchange.read_early.gave_up()
        exchange.scope.cancel()

    def _cancelled_here(self, message: dict[str, Any], era: EraLeg) -> bool:
        """A `notifications/cancelled`: True when the leg cancels by itself and it must not be POSTed."""
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        exchange = self._exchanges.get(jsonrpc.id_key(request_id))
        if exchange is None:
            return era.cancel(None)
        exchange.abandoned = True
        if exchange.leg.cancel(exchange):
            return True
        self._tg.start_soon(self._let_go, exchange)
        return False

    def _answered_elsewhere(self, exchange: PostExchange) -> None:
        """Its last request was answered on another stream: its own is let go as a cancelled one is."""
        self._tg.start_soon(self._let_go, exchange)

    async def _let_go(self, exchange: PostExchange) -> None:
        """Close a cancelled request's stream if the server has not ended it within `finish_timeout`
        of the cancellation: nothing more is owed on it, and a server that ignores cancellations
        and keeps the stream alive with pings held a task and a connection for the whole session."""
        await anyio.sleep(self.settings.finish_timeout)
        if not exchange.scope.cancel_called:
            log.debug("closing a cancelled request's stream", extra={"request_id": exchange.origin})
            self._cancel(exchange)


@asynccontextmanager
async def open_http_upstream(
    settings: HttpUpstreamSettings, http: httpx2.AsyncClient | None = None, tls: ssl.SSLContext | None = None
) -> AsyncIterator[HttpUpstream]:
    """One upstream session; leaving the block ends it (DELETE) if `stop()` has not already.

    Without `http` the session gets a client of its own (its own connections and cookies), built
    with `tls` when given (see `make_http_client`)."""
    async with AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(make_http_client(settings, tls))
        async with anyio.create_task_group() as tg:
            upstream = HttpUpstream(settings, http, tg)
            try:
                yield upstream
            finally:
                with anyio.CancelScope(shield=True):
                    await upstream.stop(0)
                tg.cancel_scope.cancel()


_STARTED = object()


class _ReadEarly:
    """The hooks of an exchange whose answer its connection's callback reads (`early.py`): the
    exchange gets its task when that gives up, when `PATIENCE` runs out, or when it is cancelled."""

    def __init__(
        self, upstream: HttpUpstream, exchange: PostExchange, body: bytes, taker: early.AtOnce
    ) -> None:
        self._upstream = upstream
        self._exchange = exchange
        self._body = body
        self._taker = taker
        self._timer = upstream.patience.set(self.gave_up)
        exchange.read_early = self

    def take(self, data: bytes) -> bool:
        return self._upstream.reader.take_early(self._exchange, data, self._taker)

    def gave_up(self) -> None:
        if self._end():
            self._upstream.carry(self._body, self._exchange)

    def finished(self, reusable: bool) -> None:
        exchange = self._exchange
        if exchange.expected:  # the answer ended owing some: the task fails or resumes it
            self.gave_up()
            return
        if self._end() and exchange.written is not None:
            written, exchange.written = exchange.written, None
            written.done(reusable)
            self._upstream.ended(exchange)

    def _end(self) -> bool:
        """Stop reading early; False if that was over already."""
        exchange = self._exchange
        if exchange.read_early is not self:
            return False
        exchange.read_early = None
        self._timer.cancel()
        if exchange.written is not None:
            exchange.written.connection.reader.unwatch()
        return True


class _AfterTheInbox:
    """An `AtOnce` taker (`early.py`), ready only while the relay waits for the inbox with nothing in it: what
    was read before must reach the relay first."""

    def __init__(self, inbox: MessageQueue[Item], taker: early.AtOnce) -> None:
        self._inbox = inbox
        self._taker = taker

    def ready(self) -> bool:
        return self._inbox.waiting and self._taker.ready()

    def take(self, data: bytes, origin: Any) -> bool:
        if not self._taker.take(data, origin):  # (it said it was ready) the relay's task takes it
            self._inbox.send_nowait((data, origin))
        return True

    def answer_ahead(self, data: bytes, message: Any, origin: Any) -> bool:
        return self._taker.answer_ahead(data, message, origin)  # (asked right after `ready`)


def _is_request(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("method"), str) and "id" in item


def _is_cancel(item: Any) -> bool:
    return isinstance(item, dict) and item.get("method") == protocol.CANCELLED and "id" not in item
