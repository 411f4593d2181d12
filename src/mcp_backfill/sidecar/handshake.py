"""`/mcp` for handshake-era clients (2024-11-05 … 2025-11-25): sessions, POST, GET, DELETE.

* POST without `Mcp-Session-Id` must be an `initialize` request: it opens a session (a new upstream
  and relay), whose id comes back in the `Mcp-Session-Id` response header. Other POSTs need the
  header (400 without it, 404 for an unknown or ended session).
* A POST that carries requests is answered with `application/json` when the single request's
  response comes within 15 s with nothing before it; otherwise (server messages first, a slow
  answer, or a batch) with an SSE stream carrying the messages for those requests and then the
  responses. SSE events have ids; the last 1024 of each stream are kept (within 8 MiB a stream and
  32 MiB a session, see `event_stream`), so a client can resume a dropped stream with GET and
  `Last-Event-ID`. A POST of notifications or responses only gets 202.
  A POST holding anything but JSON-RPC 2.0 messages gets 400 and nothing of it is relayed.
* GET opens the session's standalone SSE stream (one at a time: 409 for a second one), which carries
  the server messages that belong to no request in flight, including those buffered before it opened.
* DELETE ends the session and stops its upstream.
* `MCP-Protocol-Version`, when sent, must be the version negotiated in `initialize` (400 otherwise).
* A session belongs to the client identity that opened it (see `security`): a request naming it with
  another identity's credential — or, with `--forward-authorization`, another or no `Authorization`
  — gets 403 and never reaches its upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import DuplicateRequestId, SessionGone, TooManyPosts
from mcp_backfill.logs import get_logger
from mcp_backfill.options import named
from mcp_backfill.sidecar.http_io import (
    CLOSED_BEFORE_ANSWER,
    FrontSettings,
    HttpCall,
    UpstreamHeaders,
    accepts,
    pump_sse,
    quick_answer,
    respond_single,
    single_answer,
    sse_headers,
    wait_for_events,
)
from mcp_backfill.sidecar.sessions import HttpSession, OpeningRate, SessionTable
from mcp_backfill.transports.event_stream import EventStream, parse_event_id, sse_event
from mcp_backfill.transports.http_server import MAX_OPEN_POSTS

if TYPE_CHECKING:
    from mcp_backfill.sidecar.lane import HandedOver

log = get_logger("sidecar")

# The `Retry-After` (seconds) of a GET stream refused during the drain: the session ends with it,
# and a client that comes back at once only finds the sidecar still draining.
DRAIN_RETRY_AFTER = 5


class HandshakeFront:
    """The handshake era's requests of `serve`: a session's POSTs, its GET streams and its DELETE.

    Long because the three share one session's router and streams, and each decides in its own way
    how its response is written (JSON or SSE), what a client that leaves meanwhile keeps for its
    resumption, and what the drain still lets through; split, each part would take them all along.
    """

    def __init__(
        self, sessions: SessionTable, settings: FrontSettings, opening: OpeningRate | None = None
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.opening = opening or OpeningRate(0)

    async def handle(self, call: HttpCall, upstream_headers: UpstreamHeaders, identity: str) -> None:
        if call.method == "POST":
            await self._post(call, upstream_headers, identity)
        elif call.method == "GET":
            await self._get(call, identity)
        elif call.method == "DELETE":
            await self._delete(call, identity)
        else:
            await call.respond_error(
                405,
                protocol.INVALID_REQUEST,
                "Method Not Allowed",
                headers=[(b"allow", b"GET, POST, DELETE")],
            )

    # -- POST ------------------------------------------------------------------------------------

    async def _post(self, call: HttpCall, upstream_headers: UpstreamHeaders, identity: str) -> None:
        json_ok, sse_ok = accepts(call.headers)
        if not (json_ok and sse_ok):
            await call.respond_error(
                406,
                protocol.INVALID_REQUEST,
                "Not Acceptable: Client must accept both application/json and text/event-stream",
            )
            return
        with self._held_while_reading(call, identity):
            body = await call.read_json_body(self.settings.max_body, self.settings.body_timeout)
        if body is None:
            return
        try:
            decoded = jsonrpc.decode(body)
        except ValueError as exc:
            await call.respond_error(400, protocol.PARSE_ERROR, f"Parse error: {exc}")
            return
        if isinstance(decoded, list) and len(decoded) > self.settings.max_batch:
            count, limit = len(decoded), self.settings.max_batch
            log.warning("client batch over the limit; refused", extra={"messages": count, "limit": limit})
            await call.respond_error(400, protocol.INVALID_REQUEST, protocol.batch_too_large(count, limit))
            return
        messages = decoded if isinstance(decoded, list) else [decoded]
        if not messages or not all(_is_message(message) for message in messages):
            await call.respond_error(
                400,
                protocol.INVALID_REQUEST,
                'Invalid Request: expected a JSON-RPC 2.0 message ("jsonrpc": "2.0", a string method, '
                "object params and a string or integer id, or a result or error) or a batch of them",
            )
            return
        opening = isinstance(decoded, dict) and decoded.get("method") == "initialize" and "id" in decoded
        session = await self._post_session(call, opening, upstream_headers, identity)
        if session is None:
            return
        requests = [message for message in messages if "method" in message and "id" in message]
        with session.hold():
            for message in messages:
                if message.get("method") == protocol.CANCELLED and "id" not in message:
                    params = message.get("params")
                    if isinstance(params, dict) and "requestId" in params:
                        session.router.client_cancelled(params["requestId"], params.get("reason"))
            if not requests:
                await self._deliver(call, session, body)
                await call.respond(202, headers=_session_header(session))
                return
            if session.router.closed:
                await call.respond_error(404, protocol.INVALID_REQUEST, "Session not found")
                return
            try:
                stream = session.router.open_post(requests, batch=isinstance(decoded, list))
            except TooManyPosts:
                await _refuse_too_many_posts(call, session)
                return
            except DuplicateRequestId:
                await call.respond_error(
                    409,
                    protocol.INVALID_REQUEST,
                    "Conflict: a request with the same id is already in flight in this session",
                    headers=_session_header(session),
                )
                return
            await self._deliver(call, session, body)
            await self._answer(call, session, stream, single=isinstance(decoded, dict))

    async def take_over(self, call: HttpCall, handed: HandedOver) -> None:
        """Answer a request the lane took and could not answer at once (`lane.py`)."""
        try:
            await self._answer(call, handed.session, handed.stream, single=True)
        finally:
            handed.release()

    def _held_while_reading(self, call: HttpCall, identity: str) -> contextlib.AbstractContextManager[None]:
        """The session a POST names is busy while its body arrives: a session whose next request
        was still uploading when `--session-idle-timeout` came would be closed under it (404)."""
        session_id = call.headers.get(protocol.SESSION_HEADER)
        session = self.sessions.get(session_id) if session_id is not None else None
        if session is None or session.identity != identity or session.router.closed:
            return contextlib.nullcontext()
        return session.hold()

    async def _post_session(
        self, call: HttpCall, opening: bool, upstream_headers: UpstreamHeaders, identity: str
    ) -> HttpSession | None:
        session_id = call.headers.get(protocol.SESSION_HEADER)
        if session_id is None:
            if not opening:
                await call.respond_error(400, protocol.INVALID_REQUEST, "Bad Request: Missing session ID")
                return None
            if self.settings.draining:
                await call.respond_error(503, protocol.INTERNAL_ERROR, "Service Unavailable: shutting down")
                return None
            admission = self.opening.admit(identity)
            if admission.wait is not None:
                message, seconds = self.opening.refusal(identity, admission, "new sessions")
                log.warning("session refused: client opens sessions too fast", extra={"client": identity})
                await call.respond_error(
                    429, protocol.INTERNAL_ERROR, message, headers=[(b"retry-after", str(seconds).encode())]
                )
                return None
            room = await self.sessions.room()
            if self.settings.draining:  # it began while the opening waited for room
                self.opening.refused(identity, admission)
                await call.respond_error(503, protocol.INTERNAL_ERROR, "Service Unavailable: shutting down")
                return None
            if not room:
                self.opening.refused(identity, admission)
                log.warning("session refused: too many open sessions", extra={"sessions": len(self.sessions)})
                await call.respond_error(
                    503,
                    protocol.INTERNAL_ERROR,
                    f"Too many open sessions and 2026-07-28 clients ({named('--max-sessions')}); "
                    "try again later",
                )
                return None
            return self.sessions.open(upstream_headers(), identity)
        return await self._session(call, identity, check_version=not opening)

    async def _deliver(self, call: HttpCall, session: HttpSession, body: bytes) -> None:
        try:
            await session.deliver(body)
        except SessionGone:
            log.debug("message for an ended session dropped", extra={"session": session.label})

    async def _answer(self, call: HttpCall, session: HttpSession, stream: EventStream, single: bool) -> None:
        try:
            with stream.expecting_reader():
                await self._json_or_sse(call, session, stream, single)
        finally:
            if stream.answered_as_json or not call.started:  # no event id of it went out
                session.router.forget(stream)

    async def _json_or_sse(
        self, call: HttpCall, session: HttpSession, stream: EventStream, single: bool
    ) -> None:
        """JSON when a single request is answered at once, else SSE (see the module docstring).

        A quick answer (within `QUICK_ANSWER_SECONDS`) is written by the relay's task as it routes
        it (`EventStream.answer_now`), not after this handler's task has been woken and scheduled:
        about 3% of a call at one session (`benchmarks/README.md`, 3b). A session is one client's,
        so a client that stops reading its answers holds up only its own session's relay.
        """
        headers = _session_header(session)
        deadline = anyio.current_time() + self.settings.json_window
        answer = None
        if single:
            written: asyncio.Future[None] | None = None  # the relay's task is writing the answer

            async def answer_now() -> None:
                nonlocal written
                answer = single_answer(stream)
                if answer is None or written is not None:
                    return
                written = asyncio.get_running_loop().create_future()
                try:
                    await respond_single(call, stream, answer, headers=headers)
                finally:
                    if not written.done():  # else the handler was cancelled while it waited
                        written.set_result(None)

            stream.answer_now = answer_now  # the relay's task writes a quick answer itself
            try:
                answer = await quick_answer(stream, self.settings.json_window)
            finally:
                stream.answer_now = None
            if written is not None:
                await written  # done at once unless the client's connection is backed up
                return
        if answer is not None:
            await respond_single(call, stream, answer, headers=headers)
            return
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call.watch_disconnect, scope)
                await wait_for_events(stream, deadline - anyio.current_time())
                answer = single_answer(stream) if single else None
                if answer is not None:
                    await respond_single(call, stream, answer, headers=headers)
                else:
                    await call.start(200, protocol.SSE_TYPE, sse_headers(headers))
                    if _primes(session):
                        await call.body(sse_event(b"", stream.event_id(0)), more=True)
                    await pump_sse(call, stream, 0, with_ids=True, keepalive=self.settings.keepalive)
                    await call.body(b"")
                if not call.finished:  # else the watcher ends by itself (see watch_disconnect)
                    tg.cancel_scope.cancel()
        if scope.cancelled_caught and not call.started:
            log.debug(CLOSED_BEFORE_ANSWER, extra={"stream": stream.key})
        elif not stream.answered_as_json and (scope.cancelled_caught or call.cut_off):
            _cut_off(stream, 0)
            log.debug("client closed a POST stream; kept for resumption", extra={"stream": stream.key})

    # -- GET and DELETE --------------------------------------------------------------------------

    async def _get(self, call: HttpCall, identity: str) -> None:
        if not accepts(call.headers)[1]:
            await call.respond_error(
                406, protocol.INVALID_REQUEST, "Not Acceptable: Client must accept text/event-stream"
            )
            return
        session = await self._session(call, identity)
        if session is None:
            return
        last_event_id = call.headers.get(protocol.LAST_EVENT_ID_HEADER)
        if last_event_id:
            resumed = _resumable(session, last_event_id)
            if resumed is None:
                await call.respond_error(
                    400,
                    protocol.INVALID_REQUEST,
                    "Bad Request: unknown or expired Last-Event-ID",
                    headers=_session_header(session),
                )
                return
            stream, after = resumed
            if (
                self.settings.draining
                and stream is session.router.get_stream
                and stream.complete_after(after)
            ):
                # The drain ended the standalone stream: an empty 200 would have the client
                # reconnect at once, again and again while the drain lasts.
                await _refuse_get_while_draining(call)
                return
        else:
            stream = session.router.get_stream
            after = stream.delivered
            if self.settings.draining:
                await _refuse_get_while_draining(call)
                return
            if stream.attached:
                await call.respond_error(
                    409,
                    protocol.INVALID_REQUEST,
                    "Conflict: Only one SSE stream is allowed per session",
                    headers=_session_header(session),
                )
                return
        # Expecting its reader until the response has ended: its last events, written into the
        # connection, may still be lost with it (see `_cut_off`).
        with session.hold(), stream.expecting_reader(), anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call.watch_disconnect, scope)
                await call.start(200, protocol.SSE_TYPE, sse_headers(_session_header(session)))
                await pump_sse(call, stream, after, with_ids=True, keepalive=self.settings.keepalive)
                await call.body(b"")
                if not call.finished:  # else the watcher ends by itself (see watch_disconnect)
                    tg.cancel_scope.cancel()
        if stream is not session.router.get_stream and (scope.cancelled_caught or call.cut_off):
            _cut_off(stream, after)  # (a GET stream opened afresh goes on from what was written)

    async def _delete(self, call: HttpCall, identity: str) -> None:
        session = await self._session(call, identity)
        if session is None:
            return
        await self.sessions.close(session)
        log.info("session deleted by the client", extra={"session": session.label})
        await call.respond(200)

    async def _session(self, call: HttpCall, identity: str, check_version: bool = True) -> HttpSession | None:
        """The session the request names, if it belongs to `identity`; answers 400/403/404 itself
        when there is none."""
        session_id = call.headers.get(protocol.SESSION_HEADER)
        if session_id is None:
            await call.respond_error(400, protocol.INVALID_REQUEST, "Bad Request: Missing session ID")
            return None
        session = self.sessions.get(session_id)
        if session is None or session.router.closed:
            await call.respond_error(404, protocol.INVALID_REQUEST, "Session not found")
            return None
        if session.identity != identity:
            await _refuse_foreign(call, session, identity)
            return None
        header = call.headers.get(protocol.VERSION_HEADER)
        # As the SDK's server: any handshake revision is accepted (clients may send an older one
        # than they negotiated); so is the one the session negotiated, even if this proxy does not
        # know it (it passes through, as in the stdio wrapper); any other is refused.
        if (
            check_version
            and header is not None
            and header not in protocol.HANDSHAKE_VERSIONS
            and header != session.router.protocol_version
        ):
            await _refuse_version(call, session, header)
            return None
        return session


async def _refuse_foreign(call: HttpCall, session: HttpSession, identity: str) -> None:
    log.warning(
        "request refused: the session belongs to another client",
        extra={"session": session.label, "client": identity, "owner": session.identity},
    )
    await call.respond_error(
        403,
        protocol.INVALID_REQUEST,
        "Forbidden: this session was opened with another credential; open your own with initialize",
    )


async def _refuse_version(call: HttpCall, session: HttpSession, header: str) -> None:
    # The revision the session negotiated is accepted even when this proxy does not know it.
    negotiated = session.router.protocol_version
    supported = protocol.HANDSHAKE_VERSIONS | ({negotiated} if negotiated else set())
    await call.respond_error(
        400,
        protocol.INVALID_REQUEST,
        f"Bad Request: Unsupported protocol version: {header} (supported: {', '.join(sorted(supported))})",
        headers=_session_header(session),
    )


async def _refuse_too_many_posts(call: HttpCall, session: HttpSession) -> None:
    log.warning("POST refused: too many waiting for answers", extra={"posts": MAX_OPEN_POSTS})
    await call.respond_error(
        429,
        protocol.INVALID_REQUEST,
        f"Too many requests in flight: this session already has {MAX_OPEN_POSTS} POSTs waiting for "
        "their answers; wait for some to be answered (or cancel them)",
        headers=_session_header(session),
    )


def _is_message(message: Any) -> bool:
    """A JSON-RPC 2.0 request (its id a string or an integer, as MCP has it), notification or
    response, whose params, if any, are an object. Anything else the SDK's server refuses or, for a
    request with another id (null, a float, a boolean, an array...), takes for a notification; and a
    stdio upstream drops what it refuses unanswered: relayed, a request would leave its POST open
    for ever (and its session busy, never reaped)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False
    if "method" not in message:
        return "id" in message and ("result" in message or "error" in message)
    params = message.get("params")
    if not isinstance(message["method"], str) or not (params is None or isinstance(params, dict)):
        return False
    return "id" not in message or protocol.string_or_integer(message["id"])


async def _refuse_get_while_draining(call: HttpCall) -> None:
    """A GET stream asked for while the sidecar drains: 503, with `Retry-After` so that a client
    honouring it does not come straight back (the session ends with the drain)."""
    await call.respond_error(
        503,
        protocol.INTERNAL_ERROR,
        "Service Unavailable: shutting down",
        headers=[(b"retry-after", str(DRAIN_RETRY_AFTER).encode())],
    )


def _cut_off(stream: EventStream, after: int) -> None:
    """A response writing `stream` from after event `after` was cut off before its end: what it
    wrote may never have reached the client, which resumes from its last event. Unless another
    response writes the stream by now, nothing after `after` counts as delivered (the stream, read
    whole as far as the session could tell, was the first finished one it let go, and its client's
    resumption got 400)."""
    if not stream.attached:
        stream.rewind(after)


def _session_header(session: HttpSession) -> list[tuple[bytes, bytes]]:
    return [(protocol.SESSION_HEADER.encode(), session.id.encode())]


def _primes(session: HttpSession) -> bool:
    """Clients from 2025-11-25 on expect an empty event with an id first, to resume from."""
    from mcp_types.version import is_version_at_least  # the SDK loads on first use (see stateless.py)

    version = session.router.protocol_version
    return version is not None and is_version_at_least(version, protocol.PRIMING_EVENTS_SINCE)


def _resumable(session: HttpSession, last_event_id: str) -> tuple[EventStream, int] | None:
    parsed = parse_event_id(last_event_id)
    stream = session.router.stream(parsed[0]) if parsed is not None else None
    if stream is None or parsed is None:
        return None
    after = parsed[1]
    if after > stream.last_seq:  # never minted: taken, it would skip every event up to it
        return None
    if after < stream.last_seq and stream.complete_after(after):
        # Finished, and what came after the id was let go (its session's replay memory): an empty
        # stream would only have the client come back for what will never come.
        log.warning(
            "resumed stream lost the rest of its events, its answer with them; refused",
            extra={"session": session.label, "stream": stream.key, "after": after},
        )
        return None
    if stream.first_kept() > after + 1:
        log.warning(
            "resumed stream lost events beyond its replay buffer",
            extra={"session": session.label, "stream": stream.key, "after": after},
        )
    return stream, after
