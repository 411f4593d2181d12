"""A session's lone request answered from the connection's callbacks, below ASGI: the fast lane.

At one session a call waits for all the sidecar does on its way, and uvicorn's ASGI cycle, the
handler's task and its waits were most of that: a bare ASGI forwarder alone ran at 0.87x the direct
rate where a front that ends HTTP from the connection's callbacks ran at 1.00x (`benchmarks/
README.md`, 3b, the twenty-fourth and twenty-eighth rounds). So the connection's protocol offers
each request whose head and body arrived together to the lane first (`connections._Guard`): a read
that is one whole request, on a connection with nothing in flight, before uvicorn reads it at all
(`take_whole`, `whole_request.py`; uvicorn's cycle for it is made only if one is needed,
`LanePost.adopt`), and any other as uvicorn has read it (`take`). The lane takes a POST that names
a live session of the handshake era, carries one JSON-RPC request other than `initialize`, and
passes every check the ASGI app would make (Host, no Origin, the bearer token, Accept,
Content-Type, the size, the protocol version, the session's owner); it then has its POST written
upstream at once, when the relay forwards it as it came (`Relay.post_ahead`), and only then opens
the request's stream in the session's router and hands the body to the relay
(`Relay.from_client_now`), which writes the POST itself if it was not written yet. When the stream's
answer is complete, the lane writes it to the connection as JSON, from whichever callback completed
it (most often the upstream connection's: `transports/http_upstream/early.py`); an answer that is
the stream's one message is written as the router is handed it, before the router and the lane
keep their books (`answer_first`), or, when the relay hands it on as it came, before the relay has
routed it at all (`answer_ahead`: the relay routes it after the next request's POST,
`relay/ahead.py`, and the connection's books of a request read whole wait for that too,
`connections._Guard.answered_earlier`).

Whatever is not that simple goes to the ASGI app as before, which does all the rest: a request the
lane does not take (it is started as if the lane were not there), and a request it took whose answer
is not complete within `QUICK_ANSWER_SECONDS`, or that brings another message first (a progress
notification, a server request): the app's POST handler is then started with the stream, and
answers from it (JSON or SSE) as it answers any POST (`HandshakeFront.take_over`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import DuplicateRequestId, TooManyPosts
from mcp_backfill.logs import get_logger
from mcp_backfill.sidecar.http_io import (
    CLOSED_BEFORE_ANSWER,
    QUICK_ANSWER_SECONDS,
    accepts,
    header_map,
    is_json_body,
    single_answer,
)
from mcp_backfill.sidecar.security import host_allowed
from mcp_backfill.sidecar.whole_request import KnownHead, read_whole
from mcp_backfill.transports.deadlines import Deadlines
from mcp_backfill.transports.event_stream import EventStream

if TYPE_CHECKING:
    from mcp_backfill.sidecar.app import SidecarApp
    from mcp_backfill.sidecar.sessions import HttpSession

log = get_logger("sidecar")

HANDED_OVER = "mcp_backfill.handed_over"
"""The scope extension of a request the lane took and hands to the app: a `HandedOver`."""
Verdict = tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], tuple[str, str] | None]
"""A connection's last `Lane._verdict`: the headers it was for, the same without their length, and it."""
_JSON_HEADERS = [(b"content-type", protocol.JSON_TYPE.encode())]
_SESSION_HEADER = protocol.SESSION_HEADER.encode()


class Lane:
    """Decides which requests the lane takes (see the module docstring)."""

    def __init__(self, app: SidecarApp, paths: tuple[str, ...]) -> None:
        self.app = app
        self._paths = paths
        # How a request line to one of them starts: no other read is parsed twice (here, then by uvicorn).
        self._starts = tuple(b"POST %s " % path.encode() for path in paths)
        # When a request the lane took goes to the app if its answer is not complete by then.
        self.hand_over = Deadlines(min(QUICK_ANSWER_SECONDS, app.handshake.settings.json_window))
        self._head: tuple[object, bytes] = (None, b"")  # `response_head`'s start, and what it was for

    def may_take(self, scope: Any) -> bool:
        """Is this request's head one the lane may take once its body is in?"""
        return scope["method"] == "POST" and scope["path"] in self._paths and not self.app.draining

    def take(self, connection: Any, cycle: Any) -> bool:
        """Answer `cycle` (its head and body in) from the callbacks; False: it is the app's, untouched."""
        if not cycle.keep_alive or cycle.more_body:
            return False
        return self._take(connection, cycle.scope["headers"], bytes(cycle.body), cycle)

    def take_whole(self, connection: Any, data: bytes) -> bool:
        """`take` for a read that may be one whole request, on a connection with nothing in flight:
        read without uvicorn (`whole_request.py`); False: nothing was done, the bytes are uvicorn's."""
        if self.app.draining or not data.startswith(self._starts):
            return False
        known: KnownHead | None = connection.lane_head
        body = None if known is None else known.body_of(data)
        if known is None or body is None:
            request = read_whole(data)
            if request is None:
                return False
            connection.lane_head = known = KnownHead.of(data, request)
            if known is None:
                return self._take(connection, request.headers, request.body, data)
            body = request.body
        return self._take(connection, known.headers, body, data)

    def _take(self, connection: Any, headers: list[tuple[bytes, bytes]], body: bytes, request: Any) -> bool:
        """`request`: its uvicorn cycle, or the bytes it came in (see `LanePost`)."""
        if connection.flow.write_paused:
            # The client has answers yet to read: the app's handler waits for it to read them
            # before writing (and no request behind it is read meanwhile), where the lane would
            # write one more into the connection's buffer with each request, without end.
            return False
        try:
            found = self._session_request(connection, headers, body)
        except Exception:  # a bug here must cost the lane, not the request
            log.exception("the lane failed to look at a request; the app answers it")
            return False
        if found is None:
            return False
        session, message = found
        relay = session.relay
        if relay is None or not (session.channel.idle and relay.takes_client_now()):
            return False  # messages before it are still on their way, in order
        router = session.router
        # The POST upstream first, when the relay forwards the request as it is: the relay's books
        # of the last answer, still owed (`Relay.answer_ahead`), the stream's and this request's come
        # after it, while the upstream works (`benchmarks/README.md`, the thirty-fifth round).
        try:
            ahead = router.may_open(message) and relay.post_ahead(body, message)
        except Exception:  # a bug here must cost the POST written first, not the request
            log.exception("posting a request ahead failed; the relay posts it")
            ahead = False  # (had it gone out, the relay's send of it finds it: `claim_ahead`)
        relay.settle()
        if ahead:
            stream = router.open_post([message])  # (`may_open` said it would, and settling only closes)
        else:
            try:
                stream = router.open_post([message])
            except (TooManyPosts, DuplicateRequestId):
                return False  # the app refuses it
        # What follows is bookkeeping no answer needs before this callback returns, and the upstream
        # works meanwhile (`LanePost.ready` looks for an answer the relay gave at once, as to
        # `server/discover`). Whatever happens, the stream has its keeper.
        try:
            if relay.from_client_now(body, ahead=ahead):
                session.channel.took()
            else:  # (it said it would take it) the relay's task takes it, as the app hands it over
                session.deliver_now(body)
        finally:
            post = LanePost(self, connection, request, session, stream)
        post.ready()
        return True

    def response_head(self, connection: Any, session: HttpSession, length: int, keep_alive: bool) -> bytes:
        """The head of a JSON answer `length` bytes long, as the app writes it: its status line and
        uvicorn's default headers, which change once a second (the date), are rendered then."""
        default_headers = connection.server_state.default_headers
        made_for, start = self._head
        if made_for is not default_headers:
            start = b"HTTP/1.1 200 OK\r\n" + b"".join(
                b"%s: %s\r\n" % header for header in (*default_headers, *_JSON_HEADERS)
            )
            self._head = (default_headers, start)
        end = b"" if keep_alive else b"connection: close\r\n"
        return b"%scontent-length: %d\r\n%s: %s\r\n%s\r\n" % (
            start,
            length,
            _SESSION_HEADER,
            session.id.encode(),
            end,
        )

    def _session_request(
        self, connection: Any, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[HttpSession, dict[str, Any]] | None:
        """The session and message of a lone request the app would relay, or None."""
        app = self.app
        verdict = self._verdict(connection, headers)
        if verdict is None:
            return None
        identity, session_id = verdict
        if len(body) > app.handshake.settings.max_body:
            return None
        session = app.handshake.sessions.peek(session_id)
        if session is None or session.identity != identity or session.router.closed:
            return None
        try:
            message = jsonrpc.decode(body)
        except ValueError:
            return None
        if not (isinstance(message, dict) and _lone_request(message)):
            return None
        return session, message

    def _verdict(self, connection: Any, raw: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
        """(client identity, session id) when the headers pass the app's checks, else None.

        A client's requests on one connection mostly carry the same headers but for their length,
        so the connection keeps its last verdict with the headers it was given for, and it holds
        again for exactly those headers (at once for the very same list, a `KnownHead`'s): the
        checks are on every call's path (`benchmarks/README.md`, the thirty-first round); they
        depend on nothing else but the access policy, which is fixed for the process's life.
        """
        last: Verdict | None = connection.lane_verdict
        if last is not None and last[0] is raw:  # the very same headers: a request's `KnownHead`
            return last[2]
        key = [header for header in raw if header[0] != b"content-length"]
        verdict = last[2] if last is not None and last[1] == key else self._check_headers(raw)
        connection.lane_verdict = (raw, key, verdict)
        return verdict

    def _check_headers(self, raw: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
        headers = header_map(raw)
        if "origin" in headers or sum(1 for name, _ in raw if name == b"host") != 1:
            return None  # CORS, or the app's 400
        if "expect" in headers:
            return None  # uvicorn writes the app's interim 100 Continue as its body is read
        policy = self.app.policy
        authorization = headers.get("authorization")
        if not host_allowed(headers.get("host"), policy):
            return None
        if policy.forward_authorization and authorization and not authorization.isascii():
            return None
        identity = policy.identify(authorization)
        session_id = headers.get(protocol.SESSION_HEADER)
        version = headers.get(protocol.VERSION_HEADER)
        if identity is None or session_id is None:
            return None
        if version is not None and version not in protocol.HANDSHAKE_VERSIONS:
            return None  # the app knows what that is (a 2026-07-28 request, or one it refuses)
        accept_json, accept_sse = accepts(headers)
        if not (accept_json and accept_sse and is_json_body(headers)):
            return None
        return identity, session_id


def _lone_request(message: dict[str, Any]) -> bool:
    """A JSON-RPC request the app would relay as it is (see `handshake._is_message`)."""
    method, request_id, params = message.get("method"), message.get("id"), message.get("params", {})
    return (
        message.get("jsonrpc") == "2.0"
        and isinstance(method, str)
        and method != protocol.INITIALIZE
        and "id" in message
        and type(request_id) in (str, int)
        and isinstance(params, dict)
    )


class HandedOver:
    """A request the lane took and hands to the app's POST handler: its session and stream, and
    what the lane held for it until the handler ends (`release`)."""

    def __init__(self, session: HttpSession, stream: EventStream, release: Callable[[], None]) -> None:
        self.session = session
        self.stream = stream
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        """Let go of what the lane held, once. It then refers to the lane no more: the request's
        scope holds this, and the lane the request (a cycle only the garbage collector would free,
        for every request handed over)."""
        release, self._release = self._release, None
        if release is not None:
            release()


class LanePost:
    """One request the lane took, until it is answered, handed over, or its client is gone.

    A request the lane read whole itself (`Lane.take_whole`) has no uvicorn cycle: only the bytes it
    came in, which uvicorn's parser reads into one when one is needed (`adopt`). A keep-alive
    request's answer needs none.
    """

    def __init__(
        self, lane: Lane, connection: Any, request: Any, session: HttpSession, stream: EventStream
    ) -> None:
        self._lane = lane
        self._app = app = lane.app
        self._connection = connection
        self._raw: bytes | None = None
        self._cycle: Any = None
        if isinstance(request, bytes):
            self._raw = request
        else:
            self._cycle = request
            request.body = bytearray()  # the relay has it
        self._session = session
        self._stream = stream
        self._loop: asyncio.AbstractEventLoop = connection.loop  # (not asyncio's lookup: a `getpid` each)
        stream.expect_reader()
        self._ready = False  # the request is on its way: an answer may be written
        self._looking = False  # a look is due (`changed`)
        self._over = False
        self._ahead = False  # its answer was written before the router had it (`answer_ahead`)
        self._booked = False  # `answered` did its work
        self._number = connection.requests_begun  # which of the connection's requests it is
        session.took_request()
        app.lane_began()
        stream.lane = self
        connection.lane_post = self
        self._timer = lane.hand_over.set(self._hand_over)

    def ready(self) -> None:
        self._ready = True
        if self._stream.after(0) or self._stream.finished:
            self.changed()

    # -- LaneWatch: told by the stream -------------------------------------------------------------

    def changed(self) -> None:
        if not self._looking and not self._over:
            self._looking = True
            self._loop.call_soon(self._look)

    def answer(self) -> None:
        if self._ready:
            self._look()
        else:
            self.changed()

    def _look(self) -> None:
        self._looking = False
        if self._over:
            return
        answer = single_answer(self._stream)
        if answer is not None:
            self._respond(answer)
        elif self._stream.after(0) or self._stream.finished:
            self._hand_over()  # something else came first: the handler writes SSE

    # -- the ends ------------------------------------------------------------------------------------

    def answer_first(self, message: bytes) -> bool:
        """The router's offer of the stream's one message before it keeps it (`LaneWatch`): written
        at once, so that the router's and the lane's bookkeeping (`answered`) comes after the client's
        answer, not before it (a call's every step before it is on the call's path: `benchmarks/
        README.md`, the thirty-second round)."""
        if self._ahead:
            return True  # written already (`answer_ahead`)
        if self._over or not self._ready:
            return False
        self._write(message)
        return True

    def answer_ahead(self, message: bytes) -> Callable[[], None] | None:
        """`LaneWatch.answer_ahead`: the answer written; the rest waits for the router (`answered`),
        the connection's books too when uvicorn knows nothing of the request (read whole by the lane,
        `_Guard.answered_earlier`): the client's next request may be read before them."""
        if self._over or not self._ready:
            return None
        self._ahead = True
        self._write(message)
        self._stream.lane = self  # (`_end` let go of it) the router's routing of it comes to `answered`
        if self._cycle is not None:
            self._connection_answered()  # uvicorn's cycle, whose end starts what it holds behind it
        return self.answered

    def _respond(self, answer: bytes) -> None:
        self._write(answer)
        self.answered()

    def _write(self, answer: bytes) -> None:
        connection = self._connection
        cycle = self._cycle
        keep_alive = cycle is None or cycle.keep_alive  # (one read whole is a keep-alive request)
        head = self._lane.response_head(connection, self._session, len(answer), keep_alive)
        self._end()
        connection.transport.write(head + answer)  # first: the rest waits for nobody

    def answered(self) -> None:
        """The answer written is the stream's: the session's books, then the connection's (once)."""
        if self._booked:
            return
        self._booked = True
        stream = self._stream
        stream.lane = None
        stream.handed_out(1)
        stream.answered_as_json = True
        self._session.router.forget(stream)
        self._let_go()
        self._app.lane_ended("200")
        if not self._ahead or self._cycle is None:  # (else `answer_ahead` kept them)
            self._connection_answered()

    def _connection_answered(self) -> None:
        cycle, connection = self._cycle, self._connection
        if cycle is None and self._ahead:
            connection.answered_earlier(self._number)
            return
        if cycle is not None:
            cycle.response_complete = True
            if not cycle.keep_alive:
                connection.transport.close()
        connection.on_response_complete()

    def _hand_over(self) -> None:
        """To the app's POST handler, which answers from the stream (see the module docstring)."""
        if self._over:
            return
        self._end()
        cycle = self.adopt()
        cycle.scope.setdefault("extensions", {})[HANDED_OVER] = HandedOver(
            self._session, self._stream, self._released
        )
        self._connection.start_app(cycle)

    def adopt(self) -> Any:
        """The request's uvicorn cycle, made first for a request the lane read whole itself: when
        the app is handed it, or when bytes come behind it on its connection (uvicorn must then know
        of it, to hold them until its answer is out, as it holds a request pipelined behind any)."""
        raw = self._raw
        if raw is not None:
            self._raw = None
            self._cycle = self._connection.adopt(raw)
            self._cycle.body = bytearray()  # the relay has it
        return self._cycle

    def _released(self) -> None:
        """The app's handler is done with a request handed over."""
        self._let_go()
        self._app.lane_ended(None)

    def lost(self) -> None:
        """The client's connection closed before the answer (no event id of it went out)."""
        if self._over:
            return
        self._end()
        log.debug(CLOSED_BEFORE_ANSWER, extra={"stream": self._stream.key})
        self._session.router.forget(self._stream)
        self._let_go()
        self._app.lane_ended("499")

    def _end(self) -> None:
        self._over = True
        self._timer.cancel()
        self._stream.lane = None
        self._connection.lane_post = None

    def _let_go(self) -> None:
        self._stream.reader_gone()
        self._session.let_go()
