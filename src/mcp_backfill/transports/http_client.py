"""A streamable-HTTP MCP server as the relay's upstream `MessageChannel`.

Each message the relay sends becomes a POST. A request's answer comes back on that POST, as one JSON
body or as an SSE stream carrying any number of server messages before the response; notifications
and responses are acknowledged with 202. In the handshake era the channel also keeps the session
(`Mcp-Session-Id`, the negotiated `MCP-Protocol-Version`, the standalone GET stream, DELETE at the end)
and resumes a dropped SSE stream with `Last-Event-ID`; in 2026-07-28 it stamps each POST with the
routing headers the server checks, and cancels a request by closing its stream.

Messages are handed on as the exact bytes of the body or SSE `data:` payload. Every delivered message
is attributed to the JSON-RPC id of the POST whose stream carried it (None: the GET stream), so a
front that serves several HTTP streams can route it. Whatever goes wrong on the way, a request gets
an answer: HTTP failures become JSON-RPC errors for the request ids that POST carried.

One `HttpUpstream` is one upstream session; several may share one `httpx2.AsyncClient`.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from anyio.abc import TaskGroup

from mcp_backfill import __version__, jsonrpc, protocol
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.http_headers import ToolHeaderMaps, modern_headers, modern_version
from mcp_backfill.transports.sse import SseDecoder

log = get_logger("http")

# How much of an error body is read, and how much of it ends up in an error message.
ERROR_BODY_LIMIT = 64 * 1024
PREVIEW_CHARS = 300
# Pages of a proxy-initiated tools/list before giving up on finding a tool's header map.
LIST_PAGE_CAP = 20
# Ids of the proxy's own requests; never delivered, so they cannot collide with the client's.
OWN_ID_PREFIX = "mcp-backfill-http:"

Item = tuple[bytes | MessageTooLarge, Any]


@dataclass(frozen=True)
class HttpUpstreamSettings:
    url: str
    # Sent on every request (e.g. the upstream's own auth), after the proxy's User-Agent.
    headers: tuple[tuple[str, str], ...] = ()
    max_message_bytes: int = 32 * 1024 * 1024
    connect_timeout: float = 30.0
    # Longest silence on an open response; SSE servers ping well within it.
    read_timeout: float = 300.0
    # Acknowledgements (202) of notifications and responses come at once; do not wait long for one.
    one_way_timeout: float = 30.0
    # Consecutive failed reconnections of a dropped SSE stream before giving up on it.
    reconnect_attempts: int = 3
    # Once a request's SSE stream has delivered its answer, how long to read on to the stream's end
    # (servers close it right after the response). A response read to its end hands its connection
    # back to the pool; one closed midway closes the connection, and the next POST pays a new one.
    finish_timeout: float = 1.0
    # Seconds between reconnections when the server's SSE `retry:` field says nothing.
    reconnect_delay: float = 1.0


def make_http_client(settings: HttpUpstreamSettings, tls: ssl.SSLContext | None = None) -> httpx2.AsyncClient:
    """A client for upstream sessions (connection pooling, cookies).

    `tls` is the certificate-checking context to use; without one the client builds its own, which
    costs about 25 ms of CPU and 0.8 MB of memory (the CA bundle): a process opening many clients
    (the sidecar, one per client session) should build one with `tls_context()` and share it.
    """
    timeout = httpx2.Timeout(settings.connect_timeout, read=settings.read_timeout)
    return httpx2.AsyncClient(
        timeout=timeout,
        headers={"user-agent": f"mcp-backfill/{__version__}"},
        follow_redirects=False,
        verify=tls if tls is not None else True,
    )


def tls_context() -> ssl.SSLContext:
    """The context `httpx2.AsyncClient` would build for itself (system CAs, `SSL_CERT_FILE`…)."""
    return httpx2.create_ssl_context()


def display_url(url: httpx2.URL | str) -> str:
    """The URL without credentials or query (either may hold a token), for messages and logs."""
    parsed = httpx2.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def describe_transport_error(exc: httpx2.TransportError) -> str:
    if isinstance(exc, httpx2.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, httpx2.ReadTimeout):
        return "timed out waiting for data"
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect ({reason})"
    return reason


def media_type(response: httpx2.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower()


@dataclass
class Cursor:
    """Where an SSE stream stands, for resuming it."""

    last_event_id: str | None = None
    retry: float | None = None  # seconds, from the server's `retry:` field


@dataclass
class Exchange:
    """A POST carrying one request (or a batch with requests), and what it still owes the relay."""

    origin: Any  # the id its stream's messages are attributed to: its (first) request's id
    methods: dict[jsonrpc.IdKey, str]
    ids: list[Any]
    modern: str | None
    params: Any
    expected: set[jsonrpc.IdKey] = field(default_factory=set)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cursor: Cursor = field(default_factory=Cursor)
    abandoned: bool = False  # the client cancelled it: nothing more is owed
    failure: str | None = None  # why it cannot be answered, once known
    dropped: str | None = None  # the stream broke off; it may still be resumed
    oversized: bool = False

    @property
    def method(self) -> str:
        return next(iter(self.methods.values()))


class HttpUpstream:
    """One upstream session over streamable HTTP, as a `MessageChannel` (plus `receive_with_origin`)."""

    def __init__(
        self, settings: HttpUpstreamSettings, http: httpx2.AsyncClient, task_group: TaskGroup
    ) -> None:
        self.settings = settings
        self.url = httpx2.URL(settings.url)  # parsed once, not on every POST
        self._http = http
        self._tg = task_group
        self._inbox_in, self._inbox = anyio.create_memory_object_stream[Item](16)
        self.session_id: str | None = None
        self.protocol_version: str | None = None  # negotiated by initialize
        self._handshake = False  # an initialize was sent: the handshake era rules this session
        self._modern_version: str | None = None  # the last 2026 version a request declared
        self._expired = False
        self.failed = False  # the upstream was unreachable or lost the session at some point
        self._exchanges: dict[jsonrpc.IdKey, Exchange] = {}
        self._active = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._standalone: anyio.CancelScope | None = None
        self._tools = ToolHeaderMaps()
        self._listing = anyio.Lock()
        self._own_ids = itertools.count(1)
        self._stop_started = False
        self._stopped = anyio.Event()

    @property
    def channel(self) -> HttpUpstream:
        return self

    @property
    def exit_status(self) -> int:
        return 1 if self.failed else 0

    # -- MessageChannel ------------------------------------------------------------------------

    async def receive(self) -> bytes:
        message, _ = await self.receive_with_origin()
        return message

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        """The next message and the id of the request whose POST stream carried it (None: GET stream)."""
        try:
            payload, origin = await self._inbox.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise anyio.EndOfStream from None
        if isinstance(payload, MessageTooLarge):
            raise payload
        return payload, origin

    async def send(self, message: bytes, related: Any = None) -> None:
        """POST one message. `related` (the server request a message answers) needs no routing here:
        every message is its own POST, and the server matches responses by their id."""
        if self._stopped.is_set():
            raise anyio.ClosedResourceError
        try:
            decoded = jsonrpc.decode(message)
        except ValueError:
            decoded = None
        items = decoded if isinstance(decoded, list) else [decoded]
        requests = [item for item in items if _is_request(item)]
        if requests:
            self._start_exchange(message, requests, batch=isinstance(decoded, list))
            return
        if len(items) == 1 and _is_cancel(items[0]) and self._consume_cancel(items[0]):
            return
        try:
            await self._post_one_way(message, items)
        except Exception:  # logged, like any message that cannot be delivered
            log.exception("posting a message upstream failed unexpectedly")

    # -- lifecycle -------------------------------------------------------------------------------

    async def stop(self, grace: float) -> int:
        """Let requests in flight finish (up to `grace` seconds), fail the rest, end the session.

        Afterwards `receive()` drains what is left and then raises `EndOfStream`. Idempotent; returns
        the exit status (1 when the upstream was unreachable or lost the session at some point).
        """
        if self._stop_started:
            await self._stopped.wait()
            return self.exit_status
        self._stop_started = True
        try:
            with anyio.move_on_after(grace):
                await self._settled()
            reason = "mcp-backfill is shutting down and the upstream had not answered"
            if grace > 0:
                reason += f" within --shutdown-grace ({grace:g}s)"
            for exchange in {id(e): e for e in self._exchanges.values()}.values():
                exchange.failure = exchange.failure or reason
                exchange.scope.cancel()
            with anyio.move_on_after(max(grace, 1.0)):
                await self._settled()
            if self._standalone is not None:
                self._standalone.cancel()
            await self._end_session(max(grace, 1.0))
        finally:
            await self._inbox_in.aclose()
            self._stopped.set()
        return self.exit_status

    async def _settled(self) -> None:
        while self._active:
            await self._idle.wait()

    async def _end_session(self, wait: float) -> None:
        if self.session_id is None or self._expired:
            return
        session, self.session_id = self.session_id, None
        headers = dict(self.settings.headers)
        headers.update(self._session_headers(session))
        try:
            response = await self._http.delete(self.url, headers=headers, timeout=wait)
        except httpx2.TransportError as exc:
            log.warning("could not end the upstream session", extra={"error": describe_transport_error(exc)})
            return
        if response.status_code == 405:
            log.debug("the upstream does not let clients end sessions (HTTP 405)")
        elif response.is_success:
            log.info("upstream session ended")
        else:
            log.warning("ending the upstream session failed", extra={"status": response.status_code})

    # -- requests --------------------------------------------------------------------------------

    def _start_exchange(self, body: bytes, requests: list[dict[str, Any]], *, batch: bool) -> None:
        first = requests[0]
        exchange = Exchange(
            origin=first["id"],
            methods={jsonrpc.id_key(r["id"]): r["method"] for r in requests},
            ids=[r["id"] for r in requests],
            modern=None if batch else modern_version(first),
            params=first.get("params"),
        )
        exchange.expected = set(exchange.methods)
        if exchange.modern is not None:
            self._modern_version = exchange.modern
        for key in exchange.expected:
            superseded = self._exchanges.get(key)
            if superseded is not None:
                # A reused id: the old POST can no longer be told apart from the new one.
                superseded.abandoned = True
                superseded.scope.cancel()
            self._exchanges[key] = exchange
        if self._active == 0:
            self._idle = anyio.Event()
        self._active += 1
        self._tg.start_soon(self._run_exchange, body, exchange)

    async def _run_exchange(self, body: bytes, exchange: Exchange) -> None:
        try:
            with exchange.scope:
                try:
                    await self._exchange(body, exchange)
                except Exception as exc:  # a bug here must cost one request, not the session
                    log.exception("HTTP exchange failed unexpectedly", extra={"method": exchange.method})
                    exchange.failure = f"Internal error in mcp-backfill's HTTP upstream: {type(exc).__name__}"
            if exchange.expected and not exchange.abandoned:
                await self._fail(exchange, self._failure_text(exchange))
        finally:
            for key in exchange.methods:
                if self._exchanges.get(key) is exchange:
                    del self._exchanges[key]
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    def _failure_text(self, exchange: Exchange) -> str:
        if exchange.failure is not None:
            return exchange.failure
        if exchange.oversized:
            return "The upstream's answer exceeded --max-message-bytes and was dropped"
        if exchange.dropped is not None:
            return f"Upstream connection lost before the response arrived: {exchange.dropped}"
        return "The upstream ended the response stream without answering the request"

    async def _exchange(self, body: bytes, exchange: Exchange) -> None:
        if exchange.method == protocol.INITIALIZE:
            await self._begin_handshake()
        elif self._expired:
            exchange.failure = self._expired_text()
            return
        headers = await self._request_headers(exchange)
        request = self._http.build_request("POST", self.url, content=body, headers=headers)
        try:
            response = await self._http.send(request, stream=True)
        except httpx2.TransportError as exc:
            exchange.failure = self._unreachable(exc, exchange.method)
            return
        try:
            await self._take_response(response, exchange)
        except httpx2.TransportError as exc:
            exchange.dropped = describe_transport_error(exc)
            log.info("upstream response stream broke off", extra={"error": exchange.dropped})
        finally:
            await response.aclose()
        if exchange.expected and exchange.failure is None and exchange.cursor.last_event_id is not None:
            await self._resume(exchange)

    async def _begin_handshake(self) -> None:
        """A (new) initialize: the session it opens replaces any earlier one of this channel."""
        if self._standalone is not None:
            self._standalone.cancel()
            self._standalone = None
        if self.session_id is not None and not self._expired:
            await self._end_session(self.settings.one_way_timeout)
        self.session_id = None
        self.protocol_version = None
        self._expired = False
        self._handshake = True

    async def _request_headers(self, exchange: Exchange) -> dict[str, str]:
        headers = self._base_headers(protocol.POST_ACCEPT)
        headers["content-type"] = protocol.JSON_TYPE
        if exchange.modern is None:
            headers.update(
                self._session_headers(self.session_id, initialize=exchange.method == protocol.INITIALIZE)
            )
            return headers
        params = exchange.params if isinstance(exchange.params, dict) else {}
        param_headers: dict[str, str] = {}
        if exchange.method == protocol.TOOLS_CALL and isinstance(params.get("name"), str):
            await self._learn_tool(params["name"], exchange)
            param_headers = self._tools.headers_for(params["name"], params.get("arguments"))
        headers.update(modern_headers(exchange.modern, exchange.method, params, param_headers))
        return headers

    def _base_headers(self, accept: str) -> dict[str, str]:
        headers = dict(self.settings.headers)
        headers["accept"] = accept
        return headers

    def _session_headers(self, session: str | None, *, initialize: bool = False) -> dict[str, str]:
        headers: dict[str, str] = {}
        if session is not None:
            headers[protocol.SESSION_HEADER] = session
        if self.protocol_version is not None and not initialize:
            headers[protocol.VERSION_HEADER] = self.protocol_version
        return headers

    async def _take_response(self, response: httpx2.Response, exchange: Exchange) -> None:
        status = response.status_code
        if exchange.method == protocol.INITIALIZE and response.is_success:
            session = response.headers.get(protocol.SESSION_HEADER)
            if session:
                self.session_id = session
                log.info("upstream session opened", extra={"url": display_url(self.url)})
        if not response.is_success:
            exchange.failure = await self._status_failure(response, exchange)
            return
        kind = media_type(response)
        if kind == protocol.SSE_TYPE:
            await self._read_events(
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

    async def _take_answer(self, exchange: Exchange, payload: bytes | MessageTooLarge) -> None:
        """A JSON body answering a request: deliver it (naming the request when the server did not)."""
        if isinstance(payload, MessageTooLarge):
            self._note_oversized(exchange, payload)
            await self._put(payload, exchange.origin)
            return
        try:
            message = jsonrpc.decode(payload)
        except ValueError as exc:
            exchange.failure = f"The upstream sent a response that is not JSON ({exc}): {_preview(payload)}"
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
        await self._put(payload, exchange.origin)

    async def _exchange_event(self, exchange: Exchange, data: bytes | MessageTooLarge) -> bool:
        """One message from a request's stream; True once the stream owes nothing more."""
        if isinstance(data, MessageTooLarge):
            self._note_oversized(exchange, data)
        else:
            try:
                message = jsonrpc.decode(data)
            except ValueError:
                pass  # handed on as it is: the relay reports what it cannot parse
            else:
                self._settle(exchange, message)
        await self._put(data, exchange.origin)
        return not exchange.expected

    def _settle(self, exchange: Exchange, message: Any) -> None:
        """Note the responses among `message` that the exchange was waiting for."""
        for item in message if isinstance(message, list) else [message]:
            if not isinstance(item, dict):
                continue
            method = item.get("method")
            if method == protocol.TOOLS_CHANGED:
                self._tools.stale()
            if method is not None or "id" not in item:
                continue
            key = jsonrpc.id_key(item["id"])
            if key in exchange.expected:
                exchange.expected.discard(key)
                self._observe_answer(exchange.methods[key], exchange, item)

    def _observe_answer(self, method: str, exchange: Exchange, response: dict[str, Any]) -> None:
        result = response.get("result")
        if not isinstance(result, dict):
            return
        if method == protocol.INITIALIZE and isinstance(result.get("protocolVersion"), str):
            self.protocol_version = result["protocolVersion"]
        elif method == protocol.TOOLS_LIST:
            self._tools.learn(result, last_page=not isinstance(result.get("nextCursor"), str))

    def _note_oversized(self, exchange: Exchange, exc: MessageTooLarge) -> None:
        found, request_id, is_request = jsonrpc.salvage_envelope(exc.head, exc.tail)
        key = jsonrpc.id_key(request_id)
        if found and not is_request and key in exchange.expected:
            exchange.expected.discard(key)  # the relay answers for it from the id it salvages too
        else:
            exchange.oversized = True

    async def _status_failure(self, response: httpx2.Response, exchange: Exchange) -> str | None:
        """Why a non-2xx answer leaves the request unanswered; None when its body was the answer."""
        status = response.status_code
        if status == 404 and self.session_id is not None and exchange.modern is None:
            self._session_expired()
            return self._expired_text()
        body = await read_limited(response, ERROR_BODY_LIMIT)
        text = _preview(body.head if isinstance(body, MessageTooLarge) else body)
        if 400 <= status < 500 and not isinstance(body, MessageTooLarge) and _is_jsonrpc_answer(body):
            await self._take_answer(exchange, body)
            return exchange.failure
        where = display_url(self.url)
        if 300 <= status < 400:
            location = response.headers.get("location", "")
            return (
                f"The upstream redirected the request (HTTP {status}) to {location or 'nowhere'}; "
                "give that URL as --upstream-url"
            )
        log.warning(
            "upstream answered with an HTTP error",
            extra={"status": status, "method": exchange.method, "body": text},
        )
        if status >= 500:
            return f"Upstream server error: HTTP {status} {response.reason_phrase} from {where}: {text}"
        hint = " (check --upstream-header)" if status in (401, 403) else ""
        return f"The upstream refused the request: HTTP {status} {response.reason_phrase}{hint}: {text}"

    def _unreachable(self, exc: httpx2.TransportError, method: str) -> str:
        reason = describe_transport_error(exc)
        self.failed = True
        log.error(
            "upstream unreachable",
            extra={"url": display_url(self.url), "error": reason, "method": method},
        )
        return f"Upstream unreachable: {reason} ({display_url(self.url)})"

    def _session_expired(self) -> None:
        if self._expired:
            return
        self._expired = True
        self.failed = True
        if self._standalone is not None:
            self._standalone.cancel()
        log.error(
            "upstream session expired (HTTP 404): the server no longer knows it; "
            "not starting a new one behind the client's back, every further request fails",
            extra={"url": display_url(self.url)},
        )

    def _expired_text(self) -> str:
        return (
            f"Upstream session expired: {display_url(self.url)} answered HTTP 404 for it (the server "
            "restarted or ended the session). Reconnect to start a new session."
        )

    async def _fail(self, exchange: Exchange, reason: str) -> None:
        for request_id in exchange.ids:
            if jsonrpc.id_key(request_id) in exchange.expected:
                error = jsonrpc.error_response(request_id, protocol.INTERNAL_ERROR, reason)
                await self._put(jsonrpc.encode(error), exchange.origin)
        exchange.expected.clear()

    # -- resuming a dropped stream --------------------------------------------------------------

    async def _resume(self, exchange: Exchange) -> None:
        """Reconnect a request's stream with `Last-Event-ID` until it answers or attempts run out."""
        if exchange.modern is not None:
            return  # 2026-07-28 has no GET: its streams cannot be resumed
        attempts = 0
        while exchange.expected and attempts < self.settings.reconnect_attempts:
            await anyio.sleep(exchange.cursor.retry or self.settings.reconnect_delay)
            progress = False

            async def on_event(data: bytes | MessageTooLarge) -> bool:
                nonlocal progress
                progress = True
                return await self._exchange_event(exchange, data)

            log.info(
                "resuming an upstream stream", extra={"request_id": exchange.origin, "attempt": attempts + 1}
            )
            outcome = await self._open_stream(exchange.cursor, on_event)
            if outcome == "expired":
                exchange.failure = self._expired_text()
                return
            if outcome == "unsupported":
                exchange.dropped = f"{exchange.dropped or 'stream closed'}; the upstream cannot resume it"
                return
            attempts = 0 if progress else attempts + 1

    async def _open_stream(
        self, cursor: Cursor, on_event: Callable[[bytes | MessageTooLarge], Awaitable[bool]]
    ) -> str:
        """GET the session's stream (resuming from the cursor) and read it; how that went:

        "ended" (it was open, then closed or broke off), "failed" or "refused" (it never opened),
        "unsupported" (405: the server has no GET stream), "expired" (404: the session is gone).
        """
        headers = self._base_headers(protocol.SSE_TYPE)
        headers.update(self._session_headers(self.session_id))
        if cursor.last_event_id is not None:
            headers[protocol.LAST_EVENT_ID_HEADER] = cursor.last_event_id
        opened = False
        try:
            async with self._http.stream("GET", self.url, headers=headers) as response:
                if response.status_code == 405:
                    return "unsupported"
                if response.status_code == 404 and self.session_id is not None:
                    self._session_expired()
                    return "expired"
                if not response.is_success or media_type(response) != protocol.SSE_TYPE:
                    log.debug("upstream refused a stream", extra={"status": response.status_code})
                    return "refused"
                opened = True
                await self._read_events(response, cursor, on_event)
                return "ended"
        except httpx2.TransportError as exc:
            log.debug(
                "upstream stream failed", extra={"error": describe_transport_error(exc), "opened": opened}
            )
            return "ended" if opened else "failed"

    async def _read_events(
        self,
        response: httpx2.Response,
        cursor: Cursor,
        on_event: Callable[[bytes | MessageTooLarge], Awaitable[bool]],
        *,
        finish: float = 0.0,
    ) -> None:
        """Hand each message event to `on_event` until it returns True; then read on for up to
        `finish` seconds to the end of the body (what comes then is dropped), so that the connection
        can be reused."""
        decoder = SseDecoder(self.settings.max_message_bytes)
        chunks = response.aiter_bytes()
        async for chunk in chunks:
            for event in decoder.feed(chunk):
                if event.id is not None:
                    cursor.last_event_id = event.id or None
                if event.retry is not None:
                    cursor.retry = event.retry / 1000
                if event.event != "message" or event.data == b"":
                    continue  # priming events carry only an id
                if await on_event(event.data):
                    if finish > 0:
                        with anyio.move_on_after(finish):
                            async for _ in chunks:
                                pass
                    return

    # -- the standalone GET stream ---------------------------------------------------------------

    def _open_standalone(self) -> None:
        if self._standalone is not None or self.session_id is None:
            return
        self._standalone = anyio.CancelScope()
        self._tg.start_soon(self._standalone_stream, self._standalone)

    async def _standalone_stream(self, scope: anyio.CancelScope) -> None:
        """Server messages outside any request, for the whole session; reconnects when it drops."""
        cursor = Cursor()
        attempts = 0

        async def on_event(data: bytes | MessageTooLarge) -> bool:
            if not isinstance(data, MessageTooLarge) and b"list_changed" in data:
                self._note_notification(data)
            await self._put(data, None)
            return False

        with scope:
            while attempts < self.settings.reconnect_attempts:
                try:
                    outcome = await self._open_stream(cursor, on_event)
                except Exception:
                    log.exception("the standalone stream failed unexpectedly")
                    outcome = "failed"
                if outcome in ("unsupported", "expired"):
                    if outcome == "unsupported":
                        log.debug("the upstream offers no standalone stream (GET answered 405)")
                    return
                attempts = 0 if outcome == "ended" else attempts + 1
                await anyio.sleep(cursor.retry or self.settings.reconnect_delay)
            log.warning(
                "lost the upstream's standalone stream; server messages outside requests will not arrive"
            )

    def _note_notification(self, data: bytes) -> None:
        try:
            message = jsonrpc.decode(data)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("method") == protocol.TOOLS_CHANGED:
            self._tools.stale()

    # -- notifications and responses -------------------------------------------------------------

    def _consume_cancel(self, message: dict[str, Any]) -> bool:
        """True when a `notifications/cancelled` must not be POSTed (2026: closing the stream cancels)."""
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        exchange = self._exchanges.get(jsonrpc.id_key(request_id))
        if exchange is not None:
            exchange.abandoned = True
            if exchange.modern is None:
                return False
            log.debug("cancelling a request by closing its stream", extra={"request_id": request_id})
            exchange.scope.cancel()
            return True
        return self._modern_version is not None and not self._handshake

    async def _post_one_way(self, body: bytes, items: list[Any]) -> None:
        """POST a notification or response; the server acknowledges it with 202 and no body."""
        what = _describe_one_way(items)
        if self._expired:
            log.warning("upstream session expired; message not delivered", extra={"message": what})
            return
        headers = self._base_headers(protocol.POST_ACCEPT)
        headers["content-type"] = protocol.JSON_TYPE
        if self._handshake or self._modern_version is None:
            headers.update(self._session_headers(self.session_id))
        else:
            headers[protocol.VERSION_HEADER] = self._modern_version
            if isinstance(items[0], dict) and isinstance(items[0].get("method"), str):
                headers["mcp-method"] = items[0]["method"]
        timeout = httpx2.Timeout(self.settings.connect_timeout, read=self.settings.one_way_timeout)
        try:
            response = await self._http.post(self.url, content=body, headers=headers, timeout=timeout)
        except httpx2.TransportError as exc:
            self.failed = True
            log.error(
                "upstream unreachable; message not delivered",
                extra={"message": what, "error": describe_transport_error(exc)},
            )
            return
        if response.status_code == 404 and self.session_id is not None:
            self._session_expired()
            log.warning("upstream session expired; message not delivered", extra={"message": what})
        elif not response.is_success:
            log.warning(
                "upstream refused a message",
                extra={"message": what, "status": response.status_code, "body": _preview(response.content)},
            )
        elif what == protocol.INITIALIZED:
            self._open_standalone()

    # -- the proxy's own tools/list ----------------------------------------------------------------

    async def _learn_tool(self, name: str, exchange: Exchange) -> None:
        """Make sure the tool's `x-mcp-header` map is known, listing the tools once if it is not.

        A stdio client may call a tool without listing first; the upstream still checks the
        `Mcp-Param-*` headers, so the proxy lists the tools itself (under its own ids, with the
        calling request's envelope) and keeps the answers to itself.
        """
        if self._tools.knows(name) or self._tools.complete:
            return
        async with self._listing:
            if self._tools.knows(name) or self._tools.complete:
                return
            meta = exchange.params.get("_meta") if isinstance(exchange.params, dict) else None
            envelope = {k: v for k, v in (meta or {}).items() if k.startswith("io.modelcontextprotocol/")}
            cursor: str | None = None
            for _ in range(LIST_PAGE_CAP):
                params: dict[str, Any] = {"_meta": envelope}
                if cursor is not None:
                    params["cursor"] = cursor
                result = await self._own_request(protocol.TOOLS_LIST, params, exchange.modern or "")
                if result is None:
                    return
                next_cursor = result.get("nextCursor")
                self._tools.learn(result, last_page=not isinstance(next_cursor, str))
                if self._tools.knows(name) or not isinstance(next_cursor, str):
                    return
                cursor = next_cursor
            self._tools.complete = True

    async def _own_request(self, method: str, params: dict[str, Any], version: str) -> dict[str, Any] | None:
        """A 2026 request of the proxy's own; its result, or None (logged) when it fails."""
        request_id = f"{OWN_ID_PREFIX}{next(self._own_ids)}"
        body = jsonrpc.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        headers = self._base_headers(protocol.POST_ACCEPT)
        headers["content-type"] = protocol.JSON_TYPE
        headers.update(modern_headers(version, method, params, {}))
        found: list[Any] = []

        async def on_event(data: bytes | MessageTooLarge) -> bool:
            if isinstance(data, MessageTooLarge):
                return False
            try:
                message = jsonrpc.decode(data)
            except ValueError:
                return False
            if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
                found.append(message)
                return True
            return False

        try:
            async with self._http.stream("POST", self.url, content=body, headers=headers) as response:
                kind = media_type(response)
                if response.is_success and kind == protocol.SSE_TYPE:
                    await self._read_events(response, Cursor(), on_event)
                elif response.is_success and kind == protocol.JSON_TYPE:
                    payload = await read_limited(response, self.settings.max_message_bytes)
                    if not isinstance(payload, MessageTooLarge):
                        await on_event(payload)
                else:
                    log.warning(f"the proxy's own {method} failed", extra={"status": response.status_code})
        except httpx2.TransportError as exc:
            log.warning(f"the proxy's own {method} failed", extra={"error": describe_transport_error(exc)})
        result = found[0].get("result") if found else None
        return result if isinstance(result, dict) else None

    # -- delivery --------------------------------------------------------------------------------

    async def _put(self, payload: bytes | MessageTooLarge, origin: Any) -> None:
        try:
            await self._inbox_in.send((payload, origin))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.debug("upstream message after the session ended; dropped")


async def read_limited(response: httpx2.Response, limit: int) -> bytes | MessageTooLarge:
    """The body, or (past `limit` bytes) a summary that keeps only its two ends."""
    body = bytearray()
    too_large: MessageTooLarge | None = None
    async for chunk in response.aiter_bytes():
        if too_large is not None:
            too_large.extend(chunk)
            continue
        body += chunk
        if len(body) > limit:
            too_large = MessageTooLarge.from_bytes(bytes(body), limit)
            body.clear()
    return too_large or bytes(body)


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


def _is_request(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("method"), str) and "id" in item


def _is_cancel(item: Any) -> bool:
    return isinstance(item, dict) and item.get("method") == protocol.CANCELLED and "id" not in item


def _is_jsonrpc_answer(body: bytes) -> bool:
    try:
        message = jsonrpc.decode(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict) and "method" not in message and ("error" in message or "result" in message)
    )


def _describe_one_way(items: list[Any]) -> str:
    first = items[0] if items else None
    if isinstance(first, dict):
        if isinstance(first.get("method"), str):
            return str(first["method"])
        if "id" in first:
            return f"response to {first['id']!r}"
    return "message"


def _preview(body: bytes) -> str:
    return jsonrpc.preview(body, PREVIEW_CHARS).strip() or "(empty body)"
