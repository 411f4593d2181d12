"""The handshake-era leg: the upstream session an `initialize` opens, and every POST made in it.

Each POST carries the session (`Mcp-Session-Id`, the negotiated `MCP-Protocol-Version`); server
messages outside requests arrive on the standalone GET stream, reconnected when it drops; a dropped
response stream is resumed; a 404 means the server forgot the session; DELETE ends it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anyio
import httpx2
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.http_upstream.exchange import (
    RETRY_FLOOR,
    Cursor,
    ExchangeReader,
    OnEvent,
    Payload,
    PostExchange,
    SeenRequests,
    describe_one_way,
    log_refused,
    media_type,
)
from mcp_backfill.transports.http_upstream.settings import describe_transport_error, display_url

log = get_logger("http")

# What a session id may hold (visible ASCII, 0x21-0x7E): anything else cannot go back in a header
# (nor can a protocol version that holds it).
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")

# A standalone stream open this long (or that brought a message) worked: the backoff starts over.
STREAM_LIVED = 10.0
# The longest wait before reopening a standalone stream that keeps ending at once, in seconds.
QUICK_END_BACKOFF_LIMIT = 30.0
# Resumptions of the standalone stream in a row that end at once bringing nothing (no message, no
# new event id) before it is opened afresh, without `Last-Event-ID`.
EMPTY_RESUMPTIONS = 2
# Refusals of a GET that say nothing about its `Last-Event-ID` (credentials, a method the server does
# not offer, load): any other 4xx to a resumption refuses the id (the server no longer knows it).
NOT_ABOUT_THE_EVENT_ID = frozenset({401, 403, 404, 405, 407, 408, 429})


class HandshakeLeg:
    """Carries the handshake era's messages, and any request that declares no stateless version
    (before an `initialize` there is no session yet: those go as plain POSTs)."""

    def __init__(self, reader: ExchangeReader, task_group: TaskGroup) -> None:
        self._reader = reader
        self._tg = task_group
        self.session_id: str | None = None
        self.protocol_version: str | None = None  # negotiated by initialize
        self.expired = False  # the server forgot the session; requests fail until a new initialize
        self.on_expired: Callable[[], None] = lambda: None
        """Called once when the server is found to have forgotten the session."""
        self._standalone: anyio.CancelScope | None = None

    # -- EraLeg --------------------------------------------------------------------------------

    def write_now(self, body: bytes, exchange: PostExchange) -> None:
        if exchange.method != protocol.INITIALIZE and not self.expired:  # else `carry` has work first
            self._reader.write_now(body, self._post_headers(initialize=False), exchange)

    def post_ahead(self, body: bytes) -> bool:
        """`write_now` for a request (no `initialize`) before its exchange is begun."""
        return not self.expired and self._reader.post_ahead(body, self._post_headers(initialize=False))

    async def carry(self, body: bytes, exchange: PostExchange) -> None:
        initialize = exchange.method == protocol.INITIALIZE
        if initialize:
            await self._begin()
        elif self.expired:
            exchange.failure = self.expired_text()
            return
        written = exchange.written
        headers = written.headers if written is not None else self._post_headers(initialize=initialize)
        await self._reader.post(body, headers, exchange, self._check_head)
        if exchange.expected and exchange.failure is None and exchange.cursor.last_event_id is not None:
            await self._resume(exchange)

    def cancel(self, exchange: PostExchange | None) -> bool:
        return False  # the server learns of it from the `notifications/cancelled` POSTed as it is

    def answered(self, method: str, result: dict[str, Any]) -> None:
        """The version `initialize` negotiated goes back in a header on every later request: kept
        only when it can be one (else the client, which gets it too, is left to judge it)."""
        version = result.get("protocolVersion")
        if method == protocol.INITIALIZE and isinstance(version, str) and _VISIBLE_ASCII.fullmatch(version):
            self.protocol_version = version

    async def post_one_way(self, body: bytes, items: list[Any]) -> None:
        what = describe_one_way(items)
        if self.expired:
            log.warning("upstream session expired; message not delivered", extra={"sent": what})
            return
        response = await self._reader.post_one_way(body, self._post_headers(initialize=False), what)
        if response is None:
            return
        if response.status_code == 404 and self.session_id is not None:
            self._expire()
            log.warning("upstream session expired; message not delivered", extra={"sent": what})
        elif not response.is_success:
            log_refused(response, what)
        elif what == protocol.INITIALIZED:
            self._open_standalone()

    # -- the session -----------------------------------------------------------------------------

    async def _begin(self) -> None:
        """A (new) initialize: the session it opens replaces any earlier one of this channel."""
        if self._standalone is not None:
            self._standalone.cancel()
            self._standalone = None
        await self._end_session(self._reader.settings.one_way_timeout)
        self.session_id = None
        self.protocol_version = None
        self.expired = False

    def _post_headers(self, *, initialize: bool) -> dict[str, str]:
        headers = self._reader.post_headers()
        headers.update(self._session_headers(self.session_id, initialize=initialize))
        return headers

    def _session_headers(self, session: str | None, *, initialize: bool = False) -> dict[str, str]:
        headers: dict[str, str] = {}
        if session is not None:
            headers[protocol.SESSION_HEADER] = session
        if self.protocol_version is not None and not initialize:
            headers[protocol.VERSION_HEADER] = self.protocol_version
        return headers

    def _check_head(self, response: httpx2.Response, exchange: PostExchange) -> bool:
        """Before a POST's body is read: the session an initialize opened, or the server no longer
        knowing ours (404: the exchange fails, and its body is not read)."""
        if response.status_code == 404 and self.session_id is not None:
            self._expire()
            exchange.failure = self.expired_text()
            return False
        if exchange.method == protocol.INITIALIZE and response.is_success:
            session = response.headers.get(protocol.SESSION_HEADER)
            if session and not _VISIBLE_ASCII.fullmatch(session):
                exchange.failure = (
                    f"The upstream ({display_url(self._reader.url)}) opened a session whose "
                    "Mcp-Session-Id is not visible ASCII (0x21-0x7E, as MCP requires), "
                    "so it cannot be sent back"
                )
                log.error("upstream sent an invalid session id", extra={"url": display_url(self._reader.url)})
                return False
            if session:
                self.session_id = session
                log.info("upstream session opened", extra={"url": display_url(self._reader.url)})
        return True

    def _expire(self) -> None:
        if self.expired:
            return
        self.expired = True
        self._reader.failed = True
        if self._standalone is not None:
            self._standalone.cancel()
        log.error(
            "upstream session expired (HTTP 404): the server no longer knows it; "
            "not starting a new one behind the client's back: this session ends",
            extra={"url": display_url(self._reader.url)},
        )
        self.on_expired()

    def expired_text(self) -> str:
        return (
            f"Upstream session expired: {display_url(self._reader.url)} answered HTTP 404 for it (the "
            "server restarted or ended the session). Reconnect to start a new session."
        )

    async def end(self, wait: float) -> None:
        """Close the standalone stream and end the session (DELETE, waiting up to `wait` seconds)."""
        if self._standalone is not None:
            self._standalone.cancel()
        await self._end_session(wait)

    async def _end_session(self, wait: float) -> None:
        if self.session_id is None or self.expired:
            return
        session, self.session_id = self.session_id, None
        headers = dict(self._reader.settings.headers)
        headers.update(self._session_headers(session))
        response: httpx2.Response | None = None
        # The whole answer within `wait`: `timeout` bounds each read, and a body that trickles on
        # for good held the proxy's exit (or a new initialize) for good.
        with anyio.move_on_after(wait):
            try:
                response = await self._reader.http.delete(self._reader.url, headers=headers, timeout=wait)
            except httpx2.RequestError as exc:
                error = describe_transport_error(exc)
                log.warning("could not end the upstream session", extra={"error": error})
                return
        if response is None:
            error = f"no complete answer within {wait:g} s"
            log.warning("could not end the upstream session", extra={"error": error})
            return
        if response.status_code == 405:
            log.debug("the upstream does not let clients end sessions (HTTP 405)")
        elif response.is_success:
            log.info("upstream session ended")
        else:
            log.warning("ending the upstream session failed", extra={"status": response.status_code})

    # -- GET streams -----------------------------------------------------------------------------

    async def _open_stream(self, cursor: Cursor, on_event: OnEvent) -> str:
        """GET the session's stream (resuming from the cursor) and read it; how that went:

        "ended" (it was open, then closed or broke off), "failed" or "refused" (it never opened),
        "unsupported" (405: the server has no GET stream), "expired" (404: the session is gone).
        """
        fields = self._reader.base_headers(protocol.SSE_TYPE)
        fields.update(self._session_headers(self.session_id))
        headers = [(name.encode("ascii"), value.encode("ascii")) for name, value in fields.items()]
        if cursor.last_event_id is not None:
            # An event id is any text: it goes back as UTF-8, as browsers send it (a header given
            # as text must be ASCII, which failed the request for an id that is not).
            headers.append((protocol.LAST_EVENT_ID_HEADER.encode(), cursor.last_event_id.encode()))
        opened = False
        try:
            async with self._reader.http.stream("GET", self._reader.url, headers=headers) as response:
                if response.status_code == 405:
                    return "unsupported"
                if response.status_code == 404 and self.session_id is not None:
                    self._expire()
                    return "expired"
                if not response.is_success or media_type(response) != protocol.SSE_TYPE:
                    log.debug("upstream refused a stream", extra={"status": response.status_code})
                    cursor.refused = await self._reader.refusal(response)
                    cursor.refused_status = response.status_code
                    return "refused"
                opened = True
                cursor.refused = None
                cursor.refused_status = None
                await self._reader.read_events(response, cursor, on_event)
                return "ended"
        except httpx2.RequestError as exc:
            reason = describe_transport_error(exc)
            log.debug("upstream stream failed", extra={"error": reason, "opened": opened})
            if not opened:
                cursor.refused = reason
                cursor.refused_status = None
            return "ended" if opened else "failed"

    async def _resume(self, exchange: PostExchange) -> None:
        """A request's stream broke off before the answer: reconnect it from where it stood."""
        if not await self._reader.resume(exchange, self._open_stream):
            exchange.failure = self.expired_text()

    def _open_standalone(self) -> None:
        if self._standalone is not None or self.session_id is None:
            return
        self._standalone = anyio.CancelScope()
        self._tg.start_soon(self._standalone_stream, self._standalone)

    async def _standalone_stream(self, scope: anyio.CancelScope) -> None:
        """Server messages outside any request, for the whole session; reconnects when it drops."""
        settings = self._reader.settings
        cursor = Cursor()
        reopening = Reopening(settings.reconnect_attempts)
        delivered = False
        seen = SeenRequests()  # the server's requests it brought: one reopened from `cursor` may again

        async def on_event(data: Payload) -> bool:
            nonlocal delivered
            delivered = True
            if isinstance(data, bytes) and self._note_message(data, seen) and reopening.reopened:
                log.warning("a server request replayed on a reopened standalone stream; taken once, dropped")
                return False
            await self._reader.put(data, None)
            return False

        with scope:
            while not reopening.given_up:
                delivered = False
                opened_at = anyio.current_time()
                resumed_from = cursor.last_event_id
                try:
                    outcome = await self._open_stream(cursor, on_event)
                except Exception:
                    log.exception("the standalone stream failed unexpectedly")
                    outcome = "broken"  # a bug here: tried again, but not for ever (see `_passing`)
                if outcome in ("unsupported", "expired"):
                    if outcome == "unsupported":
                        log.debug("the upstream offers no standalone stream (GET answered 405)")
                    return
                if outcome == "refused" and _refused_the_id(cursor):
                    # The server no longer knows the id (restarted, another replica, its events
                    # expired): sent again at each reconnection, it was refused until the attempts ran
                    # out, and the stream was lost for the rest of the session.
                    log.warning(
                        "the upstream refused to resume its standalone stream from Last-Event-ID; "
                        "opening it afresh (messages sent meanwhile may be lost)",
                        extra={"status": cursor.refused_status, "url": display_url(self._reader.url)},
                    )
                    cursor.last_event_id = None
                empty = outcome == "ended" and resumed_from is not None and not delivered
                if reopening.resumed_empty(empty and cursor.last_event_id == resumed_from):
                    # What the MCP SDK's server answers an event id its event store does not know:
                    # the same id went back for ever, and no message outside a request came again.
                    log.warning(
                        "resuming the upstream's standalone stream from Last-Event-ID brought nothing "
                        "twice; opening it afresh (messages sent meanwhile may be lost)",
                        extra={"url": display_url(self._reader.url)},
                    )
                    cursor.last_event_id = None
                reopening.reopened = reopening.reopened or outcome == "ended"
                if _passing(outcome, cursor):
                    # A server restarting behind its load balancer (502, 503), or unreachable a
                    # moment: three in a row lost the stream for the rest of the session, and with it
                    # every server message outside a request (its sampling requests among them).
                    if reopening.failed_for_now():
                        log.warning(
                            "the upstream's standalone stream cannot be reopened; still trying, "
                            f"every {QUICK_END_BACKOFF_LIMIT:g} s at most",
                            extra={"error": cursor.refused, "url": display_url(self._reader.url)},
                        )
                elif reopening.settled(opened=outcome == "ended"):
                    log.info("the upstream's standalone stream is open again")
                lived = anyio.current_time() - opened_at >= STREAM_LIVED
                asked = cursor.wait(settings.reconnect_delay)
                await anyio.sleep(reopening.delay(asked, quiet=not (delivered or lived)))
            log.warning(
                "lost the upstream's standalone stream; server messages outside requests will not arrive"
            )

    def _note_message(self, data: bytes, seen: SeenRequests) -> bool:
        """A standalone stream's message: `tools/list_changed`, or an answer that settles the request
        it answers (the server may send it here rather than on the request's own stream); True when
        it is a request of the server's that the stream brought before (see `SeenRequests`)."""
        if b"list_changed" not in data and b'"id"' not in data:
            return False
        try:
            message = jsonrpc.decode(data)
        except ValueError:
            return False
        if seen.again(message):
            return True
        self._reader.settle(message)
        return False


class Reopening:
    """How the reopenings of the standalone stream have gone, in a row, to decide on the next one.

    * `attempts`: reopenings that failed for a reason that does not pass (a refusal such as 400 or
      401, a bug of the proxy's): at `limit` (`--reconnect-attempts`) the stream is given up for the
      session. Reset by a stream that opened (whatever it brought); an outage neither counts nor
      resets it.
    * `outage`: reopenings that failed for a reason that passes (unreachable, 5xx, 408, 429): they
      never give the stream up; at `limit` the log says it cannot be reopened, and once it opens
      again that it is. Reset by any other outcome.
    * `empty_resumptions`: streams resumed from a `Last-Event-ID` that ended bringing nothing (no
      message, no new event id): at `EMPTY_RESUMPTIONS` the id is dropped and the stream opened
      afresh. Reset by any other outcome, and when the id is dropped.
    * `quick_ends`: streams that ended (or failed) within `STREAM_LIVED` without a message: each
      doubles the wait before the next reopening (`standalone_delay`). Reset by a stream that
      brought a message or lived that long.
    * `reopened`: a stream was open once (it only goes from False to True): what a later one
      brings may be a replay (`SeenRequests`).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.attempts = 0
        self.outage = 0
        self.empty_resumptions = 0
        self.quick_ends = 0
        self.reopened = False

    @property
    def given_up(self) -> bool:
        return self.attempts >= self.limit

    def resumed_empty(self, empty: bool) -> bool:
        """One more resumption that brought nothing (`empty`), or a reset; True when that makes
        `EMPTY_RESUMPTIONS` in a row (the count starts over): the id is to be dropped."""
        self.empty_resumptions = self.empty_resumptions + 1 if empty else 0
        if self.empty_resumptions < EMPTY_RESUMPTIONS:
            return False
        self.empty_resumptions = 0
        return True

    def failed_for_now(self) -> bool:
        """A reopening failed for a reason that passes; True when that makes `limit` in a row (to say
        so once)."""
        self.outage += 1
        return self.outage == self.limit

    def settled(self, *, opened: bool) -> bool:
        """A reopening that did not fail for a reason that passes (`opened`: the stream was open);
        True when it opened after an outage the log named."""
        back = opened and self.outage >= self.limit
        self.outage = 0
        self.attempts = 0 if opened else self.attempts + 1
        return back

    def delay(self, asked: float, *, quiet: bool) -> float:
        """The wait before the next reopening, `asked` by the server's `retry:` (or the default),
        after a stream that ended at once without a message (`quiet`) or not."""
        self.quick_ends = min(self.quick_ends + 1, 16) if quiet else 0
        return standalone_delay(asked, self.quick_ends)


def _passing(outcome: str, cursor: Cursor) -> bool:
    """Did a reopening fail for a reason that passes (the server unreachable, 5xx, 408, 429)?"""
    status = cursor.refused_status
    return outcome == "failed" or (
        outcome == "refused" and (status is None or status >= 500 or status in (408, 429))
    )


def _refused_as_unknown(status: int | None) -> bool:
    return status is not None and 400 <= status < 500 and status not in NOT_ABOUT_THE_EVENT_ID


def _refused_the_id(cursor: Cursor) -> bool:
    """Did the server refuse to resume the stream from its `Last-Event-ID` (see `NOT_ABOUT_THE_EVENT_ID`)?"""
    return cursor.last_event_id is not None and _refused_as_unknown(cursor.refused_status)


def standalone_delay(asked: float, quick_ends: int) -> float:
    """The wait before reopening the standalone stream: what the server's `retry:` (or the default
    `reconnect_delay`) asks, but at least `RETRY_FLOOR`, doubled for each stream in a row
    that ended at once without a message, up to `QUICK_END_BACKOFF_LIMIT`. A server that opens and
    closes its GET stream with `retry: 1` had it reopened every millisecond, for the whole session."""
    delay = max(asked, RETRY_FLOOR)
    if quick_ends <= 1:
        return delay
    return max(delay, min(delay * float(2 ** (quick_ends - 1)), QUICK_END_BACKOFF_LIMIT))
