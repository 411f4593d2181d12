"""One request's POST and its answer, as a JSON body or an SSE stream, whichever era carries it.

`ExchangeReader` is the part both era legs share: it reads each answer into the upstream's inbox as
the exact bytes received, notes which requests it answered, resumes a dropped stream with
`Last-Event-ID`, and turns HTTP failures into the text of the error a request gets instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import httpx2

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.credentials import hide_url_credentials
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.logs import Redactor, get_logger
from mcp_backfill.options import named
from mcp_backfill.transports.http_upstream.early import AtOnce
from mcp_backfill.transports.http_upstream.headers import ToolHeaderMaps
from mcp_backfill.transports.http_upstream.http11 import body_chunks
from mcp_backfill.transports.http_upstream.settings import (
    HttpUpstreamSettings,
    WrittenPost,
    describe_transport_error,
    display_url,
    post_message,
    write_message_now,
)
from mcp_backfill.transports.http_upstream.sse import SseDecoder
from mcp_backfill.transports.queue import MessageQueue

log = get_logger("http")

# How much of an error body is read, and how much of it ends up in an error message.
ERROR_BODY_LIMIT = 64 * 1024
PREVIEW_CHARS = 300
# The shortest wait before reopening a stream, whatever the server's `retry:` says (`retry: 1` had
# a stream that ends at once reopened every millisecond).
RETRY_FLOOR = 0.1
# Ids of the server's requests a stream brought that it remembers, to know one it replays.
SEEN_REQUESTS_KEPT = 1024

Payload = bytes | MessageTooLarge
Item = tuple[Payload, Any]  # a message for the relay and the id of the request whose stream carried it
OnEvent = Callable[[Payload], Awaitable[bool]]  # one SSE message; True once nothing more is wanted


@dataclass
class Cursor:
    """Where an SSE stream stands, for resuming it."""

    last_event_id: str | None = None
    retry: float | None = None  # seconds, from the server's `retry:` field
    refused: str | None = None  # why the last reopening of the stream failed, if it did
    refused_status: int | None = None  # the HTTP status of that refusal, when the server gave one

    def wait(self, default: float) -> float:
        """How long to wait before reconnecting: what the server's `retry:` asks, `default` when it
        said nothing (a `retry: 0`, reconnect at once, is something: it was taken for nothing and
        every poll of a server that asks for it waited a whole second)."""
        return default if self.retry is None else self.retry


class SeenRequests:
    """The ids of the server's requests one stream brought (the last `SEEN_REQUESTS_KEPT`), to know
    one it brings again once resumed: an SSE event without an `id:` keeps the stream's last id, so
    a server that ids only some events (its priming event) replays, after the id it is sent back,
    requests the proxy took already. Taken again, a sampling request was answered and billed twice,
    or refused under its id while the first answer was under way (the server took the refusal for
    its answer). MCP never lets a request id be used again in a session: it is the same request."""

    def __init__(self) -> None:
        self._ids: dict[jsonrpc.IdKey, None] = {}

    def again(self, message: Any) -> bool:
        """Is `message` a request of the server's this stream brought before, or a batch whose
        requests it all brought before (a replayed batch was taken again whole)? The requests not
        seen yet are remembered."""
        items = message if isinstance(message, list) else [message]
        requests = [
            jsonrpc.id_key(item["id"])
            for item in items
            if isinstance(item, dict) and isinstance(item.get("method"), str) and "id" in item
        ]
        seen = [key in self._ids for key in requests]
        for key, known in zip(requests, seen, strict=True):
            if not known:
                jsonrpc.remember(self._ids, key, None, SEEN_REQUESTS_KEPT)
        return bool(seen) and all(seen)


class EraLeg(Protocol):
    """How one protocol era talks to the upstream (`HandshakeLeg`, `StatelessLeg`)."""

    def write_now(self, body: bytes, exchange: PostExchange) -> None:
        """Write the request's POST at once if that needs no waiting (see `ExchangeReader.write_now`);
        `carry` then reads its answer."""

    async def carry(self, body: bytes, exchange: PostExchange) -> None:
        """POST a request and read its answer; leaves in `exchange` what it still owes and why."""

    def cancel(self, exchange: PostExchange | None) -> bool:
        """The client cancelled `exchange` (None: a request not in flight). True when that is done
        here and its `notifications/cancelled` must not be POSTed."""

    def answered(self, method: str, result: dict[str, Any]) -> None:
        """A request this leg carried got `result`."""

    async def post_one_way(self, body: bytes, items: list[Any]) -> None:
        """POST a notification or response (`items` is `body` decoded, as a list)."""


@dataclass
class PostExchange:
    """A POST carrying one request (or a batch with requests), and what it still owes the relay."""

    origin: Any  # the id its stream's messages are attributed to: its (first) request's id
    leg: EraLeg
    methods: dict[jsonrpc.IdKey, str]
    ids: list[Any]
    params: Any  # its (first) request's params
    stateless_version: str | None  # the version its envelope declares, if not a handshake one
    expected: set[jsonrpc.IdKey] = field(default_factory=set)
    cursor: Cursor = field(default_factory=Cursor)
    abandoned: bool = False  # the client cancelled it: nothing more is owed
    failure: str | None = None  # why it cannot be answered, once known
    failure_code: int = protocol.INTERNAL_ERROR  # the JSON-RPC error code that goes with it
    dropped: str | None = None  # the stream broke off; it may still be resumed
    oversized: bool = False
    batch: bool = False  # its POST was a batch: only then may an answer be one (JSON-RPC 2.0 §6)
    written: WrittenPost | None = None  # its POST went out before its task started (`write_now`)
    seen: SeenRequests | None = None  # the server's requests its stream brought, once there is one
    early: int = 0  # messages of its answer taken as they arrived, which its task skips (`early.py`)
    read_early: Any = None  # its answer's reader while no task reads it (`channel._ReadEarly`)

    _scope: anyio.CancelScope | None = None

    @property
    def scope(self) -> anyio.CancelScope:
        """The scope its task runs in: made when first asked for (by its task, or by a cancel before
        the task runs), not for each of the many exchanges answered early, which run no task."""
        if self._scope is None:
            self._scope = anyio.CancelScope()
        return self._scope

    @property
    def method(self) -> str:
        return next(iter(self.methods.values()))

    def unanswered_reason(self) -> str:
        """The error text for the requests it still owes."""
        if self.failure is not None:
            return self.failure
        if self.oversized:
            return f"The upstream's answer exceeded {named('--max-message-bytes')} and was dropped"
        if self.dropped is not None:
            return f"Upstream connection lost before the response arrived: {self.dropped}"
        return "The upstream ended the response stream without answering the request"


# Opens a GET stream from a cursor: "ended", "failed", "refused", "unsupported" or "expired".
StreamOpener = Callable[[Cursor, OnEvent], Awaitable[str]]
# Looks at a POST's status and headers before its body; False when that settled the exchange.
HeadCheck = Callable[[httpx2.Response, PostExchange], bool]


class ExchangeReader:
    """Reads the answers of one upstream's POSTs into its inbox; both era legs share one.

    Also where the upstream's failures are counted (`failed`: it was unreachable or lost the session
    at some point) and where `tools/list` answers teach the tools' header maps, whichever leg
    carried them.

    Long because every way an answer can come (JSON, SSE, a batch for a single request, too large,
    an HTTP error, a dropped stream to resume) ends in the same few places: the inbox, the
    exchange's owed ids, `failed` and the tools' maps. Split, each part would take them all along.
    """

    def __init__(
        self, settings: HttpUpstreamSettings, http: httpx2.AsyncClient, inbox: MessageQueue[Item]
    ) -> None:
        self.settings = settings
        self.url = httpx2.URL(settings.url)  # parsed once, not on every POST
        self.http = http
        self._inbox = inbox
        self.tools = ToolHeaderMaps()
        self.failed = False
        # The exchanges in flight by the id of each request they carry (kept by `HttpUpstream`): an
        # answer settles its request's exchange wherever it comes, the GET stream or another's.
        self.exchanges: dict[jsonrpc.IdKey, PostExchange] = {}
        # Called with an exchange an answer on another stream left owing nothing (see `settle`).
        self.answered_elsewhere: Callable[[PostExchange], None] = lambda exchange: None
        self._redact = Redactor(settings.secrets).redact
        # A request's POST written before its exchange began (`post_ahead`): its body, and it.
        self._ahead: tuple[bytes, WrittenPost] | None = None

    def post_headers(self) -> dict[str, str]:
        """Headers every POST starts from: the configured ones, then `accept` and `content-type`."""
        headers = self.base_headers(protocol.POST_ACCEPT)
        headers["content-type"] = protocol.JSON_TYPE
        return headers

    def base_headers(self, accept: str) -> dict[str, str]:
        headers = dict(self.settings.headers)
        headers["accept"] = accept
        return headers

    async def put(self, payload: Payload, origin: Any) -> None:
        try:
            await self._inbox.send((payload, origin))
        except anyio.ClosedResourceError:
            log.debug("upstream message after the session ended; dropped")

    async def put_last(self, payload: Payload, exchange: PostExchange) -> None:
        """`put` the last answer a POST owed, and let the relay's task take it first.

        What is left of this task's work (reading the body to its end, giving the connection back,
        ending the exchange) would otherwise run before the relay's, which the hand-over only
        wakes, whenever the body's end came with the answer: about 45 µs between the upstream's
        answer and the client's (`benchmarks/README.md`, the fourteenth round).
        """
        await self.put(payload, exchange.origin)
        await asyncio.sleep(0)

    # -- a request's POST --------------------------------------------------------------------------

    def write_now(self, body: bytes, headers: dict[str, str], exchange: PostExchange) -> None:
        """Write the POST of `body` at once when an idle connection is there for it, so that it goes
        out from the relay's task as soon as the relay hands it on, not once the exchange's own task
        runs; `post` then reads its answer (`discard_written` when it never does)."""
        exchange.written = self._written_now(body, headers)

    def post_ahead(self, body: bytes, headers: dict[str, str]) -> bool:
        """`write_now` before the exchange is begun (`HttpUpstream.post_ahead`): the exchange begun
        next, for the same body, before the callback returns, takes it (`claim_ahead`)."""
        if self._ahead is not None:
            return False
        written = self._written_now(body, headers)
        if written is None:
            return False
        self._ahead = (body, written)
        return True

    def _written_now(self, body: bytes, headers: dict[str, str]) -> WrittenPost | None:
        # Whatever stops it (a header holding CR, LF or NUL, a connection in a state it did not
        # expect) is left for `post`, in the exchange's own task, which fails the request with it;
        # the callback that writes it must go on.
        try:
            return write_message_now(self.http, self.url, body, headers)
        except Exception:
            return None

    def claim_ahead(self, body: bytes, exchange: PostExchange) -> bool:
        """Give `exchange` the POST `post_ahead` wrote for its body, if it did."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return False
        if ahead[0] == body:
            exchange.written = ahead[1]
            return True
        # (Cannot be: the relay posts ahead only what it then sends as it is, at once.)
        log.error("a POST written ahead was not the next one begun; its answer is not read")
        ahead[1].discard()
        return False

    def discard_written(self, exchange: PostExchange) -> None:
        written, exchange.written = exchange.written, None
        if written is not None:
            written.discard()

    async def post(
        self, body: bytes, headers: Mapping[str, str], exchange: PostExchange, head: HeadCheck | None = None
    ) -> None:
        """POST `body` and deliver its answer; `head` sees the response before its body is read. A
        POST `write_now` sent already is not sent again: its answer is read."""
        written, exchange.written = exchange.written, None
        try:
            response = await post_message(self.http, self.url, body, headers, written)
        except httpx2.TransportError as exc:
            exchange.failure = self._unreachable(exc, exchange.method)
            return
        try:
            if head is None or head(response, exchange):
                await self._take_response(response, exchange)
        except httpx2.RequestError as exc:  # a broken connection, or a body that does not decode
            exchange.dropped = describe_transport_error(exc)
            log.info("upstream response stream broke off", extra={"error": exchange.dropped})
        finally:
            await response.aclose()

    async def _take_response(self, response: httpx2.Response, exchange: PostExchange) -> None:
        status = response.status_code
        if not response.is_success:
            exchange.failure = await self._status_failure(response, exchange)
            return
        kind = media_type(response)
        if kind == protocol.SSE_TYPE:
            await self.read_events(
                response,
                exchange.cursor,
                lambda data: self._exchange_event(exchange, data),
                finish=self.settings.finish_timeout,
            )
        elif kind == protocol.JSON_TYPE:
            await self._take_answer(exchange, await read_limited(response, self.settings.max_message_bytes))
        elif status == 202:
            exchange.failure = "The upstream accepted the request without answering it (HTTP 202)"
        else:
            exchange.failure = f"The upstream answered with unexpected content type {kind!r} (HTTP {status})"

    async def read_events(
        self, response: httpx2.Response, cursor: Cursor, on_event: OnEvent, *, finish: float = 0.0
    ) -> None:
        """Hand each message event to `on_event` until it returns True; then read on for up to
        `finish` seconds to the end of the body (what comes then is dropped), so that the connection
        can be reused."""
        decoder = SseDecoder(self.settings.max_message_bytes)
        chunks = body_chunks(response)
        async for chunk in chunks:
            events = decoder.feed(chunk)
            if decoder.retry is not None:  # waited out up to the longest silence a stream may keep
                cursor.retry = min(decoder.retry / 1000, self.settings.read_timeout)
            for event in events:
                if event.id is not None:
                    cursor.last_event_id = event.id or None
                if event.event != "message" or event.data == b"":
                    continue  # priming events carry only an id
                if await on_event(event.data):
                    if finish > 0:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(finish):  # cheaper than anyio's cancel scope
                                async for _ in chunks:
                                    pass
                    return

    async def _take_answer(self, exchange: PostExchange, payload: Payload) -> None:
        """A JSON body answering a request: deliver it (naming the request when the server did not)."""
        if exchange.early:  # taken as it arrived (`take_early`)
            exchange.early = 0
            return
        if isinstance(payload, MessageTooLarge):
            self._note_oversized(exchange, payload)
            await self.put(payload, exchange.origin)
            return
        try:
            message = jsonrpc.decode(payload)
        except ValueError as exc:
            exchange.failure = f"The upstream sent a response that is not JSON ({exc}): {preview(payload)}"
            return
        if isinstance(message, list) and not exchange.batch:
            await self._take_unbatched(exchange, message)
            return
        if (
            len(exchange.ids) == 1
            and isinstance(message, dict)
            and "method" not in message
            and message.get("id") is None
        ):
            message = {**message, "id": exchange.ids[0]}
            payload = jsonrpc.encode(message)
        self._settle(exchange, message)
        await self.put_last(payload, exchange)

    async def _take_unbatched(
        self, exchange: PostExchange, messages: list[Any], *, resumed: bool = False
    ) -> None:
        """A batch answering a request that was not one: its messages go on one by one, as if each had
        come as an event of the request's stream. Passed on as it came, the client got an array for
        its single request (a 2025-06-18 client knows no batches at all) and never its answer."""
        if not messages:
            exchange.failure = "The upstream answered a single request with an empty JSON array"
            return
        for message in messages:
            await self._exchange_event(exchange, jsonrpc.encode(message), resumed=resumed)

    async def _exchange_event(self, exchange: PostExchange, data: Payload, *, resumed: bool = False) -> bool:
        """One message from a request's stream (`resumed`: on a reconnection of it); True once the
        stream owes nothing more."""
        if exchange.early:  # taken as it arrived (`take_early`)
            exchange.early -= 1
            return not exchange.expected
        if isinstance(data, bytes) and not exchange.batch and data[:64].lstrip()[:1] == b"[":
            try:
                messages = jsonrpc.decode(data)
            except ValueError:
                pass
            else:
                if isinstance(messages, list):
                    await self._take_unbatched(exchange, messages, resumed=resumed)
                    return not exchange.expected
        if isinstance(data, MessageTooLarge):
            self._note_oversized(exchange, data)
        else:
            try:
                message = jsonrpc.decode(data)
            except ValueError:
                # Handed on as it is: the relay answers for a response whose id it can read.
                found, request_id, is_request = jsonrpc.salvage_unparsed(data)
                if found and not is_request:
                    exchange.expected.discard(jsonrpc.id_key(request_id))
            else:
                if not self._passes(exchange, message, resumed):
                    return not exchange.expected
        if exchange.expected:
            await self.put(data, exchange.origin)
            return False
        await self.put_last(data, exchange)
        return True

    def _passes(self, exchange: PostExchange, message: Any, resumed: bool) -> bool:
        """Does a message of the exchange's stream go on (a second answer and a replayed request
        do not)? Settles what it answers when it does."""
        if _answered_before(exchange, message):
            log.warning(
                "a second answer from the upstream to a request already answered; dropped",
                extra={"request_id": message.get("id")},
            )
            return False
        if _replayed(exchange, message, resumed):
            log.warning(
                "a server request replayed on a resumed stream; taken once, dropped",
                extra={"request_id": message.get("id")},
            )
            return False
        self._settle(exchange, message)
        return True

    def take_early(self, exchange: PostExchange, data: bytes, taker: AtOnce) -> bool:
        """A message of the exchange's stream read ahead of its task (`early.py`): handed to
        `taker` as `_exchange_event` would hand it on, when `taker` can take it now; the task
        then skips it."""
        if exchange.abandoned or not taker.ready():
            return False
        try:
            message = jsonrpc.decode(data)
        except ValueError:
            return False
        if not isinstance(message, dict) or _answered_before(exchange, message):
            return False
        if "method" not in message and len(exchange.ids) == 1 and message.get("id") is None:
            return False  # named by the task
        self._passes(exchange, message, False)
        exchange.early += 1
        if not taker.answer_ahead(data, message, exchange.origin):
            taker.take(data, exchange.origin)
        return True

    def settle(self, message: Any) -> None:
        """A message that came on no request's stream (the GET stream): the requests it answers
        are settled by it, as on their own streams."""
        self._settle(None, message)

    def _settle(self, exchange: PostExchange | None, message: Any) -> None:
        """Note the responses among `message` that the exchange was waiting for, and those another
        exchange was: an answer may come on any stream, and the first to come is the only one (the
        request's own stream ending without it sent the client a second, an error)."""
        for item in message if isinstance(message, list) else [message]:
            if not isinstance(item, dict):
                continue
            method = item.get("method")
            if method == protocol.TOOLS_CHANGED:
                self.tools.stale()
            if method is not None or "id" not in item:
                continue
            key = jsonrpc.id_key(item["id"])
            owner = exchange if exchange is not None and key in exchange.expected else self.exchanges.get(key)
            if owner is not None and key in owner.expected:
                owner.expected.discard(key)
                if owner is not exchange and not owner.expected:
                    self.answered_elsewhere(owner)
                result = item.get("result")
                if not isinstance(result, dict):
                    continue
                answered = owner.methods[key]
                if answered == protocol.TOOLS_LIST:
                    self.tools.learn(result, last_page=not isinstance(result.get("nextCursor"), str))
                else:
                    owner.leg.answered(answered, result)

    def _note_oversized(self, exchange: PostExchange, exc: MessageTooLarge) -> None:
        found, request_id, is_request = jsonrpc.salvage_envelope(exc.head, exc.tail)
        key = jsonrpc.id_key(request_id)
        if found and not is_request and key in exchange.expected:
            exchange.expected.discard(key)  # the relay answers for it from the id it salvages too
        else:
            exchange.oversized = True

    # -- failures --------------------------------------------------------------------------------

    async def _status_failure(self, response: httpx2.Response, exchange: PostExchange) -> str | None:
        """Why a non-2xx answer leaves the request unanswered; None when its body was the answer."""
        status = response.status_code
        # Only its start, and only for so long: an error body that streams on for good held the
        # request (read to its end, which never came) until its client gave up.
        body, whole = await body_start(response, self.settings.one_way_timeout)
        text = self._redact(preview(body))
        if 400 <= status < 500 and whole and _is_jsonrpc_answer(body):
            await self._take_answer(exchange, _redacted(self._redact, body))
            return exchange.failure
        where = display_url(self.url)
        if 300 <= status < 400:
            location = self._redact(redirect_target(self.url, response.headers.get("location", "")))
            return (
                f"The upstream redirected the request (HTTP {status}) to {location}; "
                f"give that URL as {named('--upstream-url')}"
            )
        log.warning(
            "upstream answered with an HTTP error",
            extra={"status": status, "method": exchange.method, "body": text},
        )
        if status >= 500:
            return f"Upstream server error: HTTP {status} {response.reason_phrase} from {where}: {text}"
        hint = f" (check {named('--upstream-header')})" if status in (401, 403) else ""
        return f"The upstream refused the request: HTTP {status} {response.reason_phrase}{hint}: {text}"

    def _unreachable(self, exc: httpx2.TransportError, method: str) -> str:
        reason = describe_transport_error(exc)
        self.failed = True
        log.error(
            "upstream unreachable",
            extra={"url": display_url(self.url), "error": reason, "method": method},
        )
        return f"Upstream unreachable: {reason} ({display_url(self.url)})"

    async def fail(self, exchange: PostExchange, reason: str, code: int = protocol.INTERNAL_ERROR) -> None:
        """Answer each request the exchange still owes with an error saying `reason`."""
        for request_id in exchange.ids:
            if jsonrpc.id_key(request_id) in exchange.expected:
                error = jsonrpc.error_response(request_id, code, reason)
                await self.put(jsonrpc.encode(error), exchange.origin)
        exchange.expected.clear()

    # -- resuming a dropped stream --------------------------------------------------------------

    async def resume(self, exchange: PostExchange, open_stream: StreamOpener) -> bool:
        """Reconnect a request's stream with `Last-Event-ID` until it answers or attempts run out.

        `open_stream` GETs the stream from the exchange's cursor; False when it found the session gone.
        A reconnection that brought a message or a new event id worked: a server that has the client
        poll (2025-11-25) sends a priming event on each reconnection and closes the stream again
        until the answer is ready. Only reconnections in a row that brought neither count against
        `reconnect_attempts`. A request the client cancelled is owed nothing: it is not resumed.
        """
        attempts = 0
        while exchange.expected and not exchange.abandoned and attempts < self.settings.reconnect_attempts:
            await anyio.sleep(max(exchange.cursor.wait(self.settings.reconnect_delay), RETRY_FLOOR))
            progress = False

            async def on_event(data: Payload) -> bool:
                nonlocal progress
                progress = True
                return await self._exchange_event(exchange, data, resumed=True)

            log.info(
                "resuming an upstream stream", extra={"request_id": exchange.origin, "attempt": attempts + 1}
            )
            resumed_from = exchange.cursor.last_event_id
            outcome = await open_stream(exchange.cursor, on_event)
            progress = progress or exchange.cursor.last_event_id != resumed_from
            if outcome == "expired":
                return False
            if outcome == "unsupported":
                exchange.dropped = f"{exchange.dropped or 'stream closed'}; the upstream cannot resume it"
                return True
            attempts = 0 if progress else attempts + 1
        if exchange.expected and not exchange.abandoned:
            refused = exchange.cursor.refused
            tried = (
                f"failed {attempts} times in a row, the last: {refused}"
                if refused is not None
                else f"brought nothing {attempts} times in a row"
            )
            exchange.dropped = (
                f"{exchange.dropped or 'stream closed'}; resuming it (GET with Last-Event-ID) {tried}"
            )
        return True

    async def refusal(self, response: httpx2.Response) -> str:
        """What a refused GET stream says, for an error: its status and the start of its body (what
        of it comes within `finish_timeout`, up to `ERROR_BODY_LIMIT` bytes: a refusal whose body
        does not end must not hold the stream's reopening up)."""
        body = bytearray()
        with anyio.move_on_after(self.settings.finish_timeout):
            async for chunk in body_chunks(response):
                body += chunk
                if len(body) >= ERROR_BODY_LIMIT:
                    break
        text = self._redact(preview(bytes(body[:ERROR_BODY_LIMIT])))
        return f"HTTP {response.status_code} {response.reason_phrase}: {text}"

    # -- notifications and responses -------------------------------------------------------------

    async def post_one_way(self, body: bytes, headers: dict[str, str], what: str) -> Acknowledgement | None:
        """POST a notification or response (the server acknowledges it with 202 and no body); None
        (logged) when the upstream cannot be reached."""
        timeout = httpx2.Timeout(self.settings.connect_timeout, read=self.settings.one_way_timeout)
        try:
            async with self.http.stream(
                "POST", self.url, content=body, headers=headers, timeout=timeout
            ) as answer:
                return await acknowledgement(answer, self.settings.one_way_timeout)
        except httpx2.TransportError as exc:
            self.failed = True
            log.error(
                "upstream unreachable; message not delivered",
                extra={"sent": what, "error": describe_transport_error(exc)},
            )
            return None


@dataclass(frozen=True)
class Acknowledgement:
    """How the upstream answered a notification or response: its status, and the start of its body."""

    status_code: int
    body: bytes = b""

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


async def acknowledgement(response: httpx2.Response, wait: float) -> Acknowledgement:
    """The acknowledgement `response` makes, once its head is in: its body is read (for the error it
    may explain, or to reuse the connection) up to `ERROR_BODY_LIMIT` bytes and `wait` seconds, and
    an SSE stream, which nothing here is owed on, not at all. The message's sender waits for this:
    a body that does not end (a stream of pings) held every later message back for as long as it
    lasted."""
    if response.is_success and media_type(response) == protocol.SSE_TYPE:
        return Acknowledgement(response.status_code)
    body = b""
    try:
        body, _ = await body_start(response, wait)
    except (httpx2.DecodingError, httpx2.TransportError) as exc:
        # The head came, so the message was delivered: a body that breaks off or does not decode
        # costs only what it would have explained (it was logged as unreachable, and the upstream
        # marked failed, which ended the stdio wrapper with status 1).
        log.warning(
            "upstream acknowledgement garbled",
            extra={"status": response.status_code, "error": describe_transport_error(exc)},
        )
    return Acknowledgement(response.status_code, body)


async def body_start(response: httpx2.Response, wait: float) -> tuple[bytes, bool]:
    """Up to `ERROR_BODY_LIMIT` bytes of the body, what of them comes within `wait` seconds; and
    whether that is the whole body."""
    body = bytearray()
    whole = False
    with anyio.move_on_after(wait):
        async for chunk in body_chunks(response):
            body += chunk
            if len(body) > ERROR_BODY_LIMIT:
                break
        else:
            whole = True
    return bytes(body[:ERROR_BODY_LIMIT]), whole


async def read_limited(response: httpx2.Response, limit: int) -> Payload:
    """The body, or (past `limit` bytes) a summary that keeps only its two ends."""
    body = bytearray()
    too_large: MessageTooLarge | None = None
    async for chunk in body_chunks(response):
        if too_large is not None:
            too_large.extend(chunk)
            continue
        body += chunk
        if len(body) > limit:
            too_large = MessageTooLarge.from_bytes(bytes(body), limit)
            body.clear()
    return too_large or bytes(body)


def redirect_target(url: httpx2.URL, location: str) -> str:
    """Where a redirect from `url` points, for an error: resolved against it, with its credentials
    (a password, a token in the query, which a redirect keeps) hidden."""
    if not location:
        return "nowhere"
    try:
        return hide_url_credentials(str(url.join(location)))
    except httpx2.InvalidURL:
        return "an invalid location"


def media_type(response: httpx2.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower()


def describe_one_way(items: list[Any]) -> str:
    """What a notification or response is, for logs: its method, or the request it answers."""
    first = items[0] if items else None
    if isinstance(first, dict):
        if isinstance(first.get("method"), str):
            return str(first["method"])
        if "id" in first:
            return f"response to {first['id']!r}"
    return "message"


def log_refused(answer: Acknowledgement, what: str) -> None:
    log.warning(
        "upstream refused a message",
        extra={"sent": what, "status": answer.status_code, "body": preview(answer.body)},
    )


def preview(body: bytes) -> str:
    return jsonrpc.preview(body, PREVIEW_CHARS).strip() or "(empty body)"


def _answered_before(exchange: PostExchange, message: Any) -> bool:
    """Is `message` an answer to one of the exchange's requests that was answered already (on
    another stream: the first answer is the one the client gets)?"""
    if not isinstance(message, dict) or "method" in message or "id" not in message:
        return False
    key = jsonrpc.id_key(message["id"])
    return key in exchange.methods and key not in exchange.expected


def _replayed(exchange: PostExchange, message: Any, resumed: bool) -> bool:
    """Is `message` a server request the exchange's stream brought before, come again on a
    reconnection of it (see `SeenRequests`)? Every request it brings is remembered, in a batch too."""
    if isinstance(message, dict):
        if "method" not in message or "id" not in message:
            return False
    elif not isinstance(message, list):
        return False
    if exchange.seen is None:
        exchange.seen = SeenRequests()
    return exchange.seen.again(message) and resumed


def _is_jsonrpc_answer(body: bytes) -> bool:
    try:
        message = jsonrpc.decode(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict) and "method" not in message and ("error" in message or "result" in message)
    )


def _redacted(redact: Callable[[str], str], body: bytes) -> bytes:
    """A refusal's JSON-RPC answer with the proxy's secrets (an `--upstream-header` credential it
    may quote) masked; its bytes as sent when it holds none."""
    text = body.decode("utf-8", "replace")
    masked = redact(text)
    return body if masked == text else masked.encode()
