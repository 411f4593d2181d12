"""The sidecar's ASGI application: `/mcp`, `/healthz`, `/readyz` and `/metrics`.

Every request, whatever its path, is checked first for Host and Origin (403: DNS-rebinding
protection covers `/metrics` and `/healthz` too); a browser's page the Origin check admits gets
CORS on `/mcp` (`cors`: its preflight answered, its origin named on each response). `/mcp` and
`/metrics` then need the bearer token when one is configured (401 with `WWW-Authenticate`), and the
upstream is never touched by a request that fails. The `MCP-Protocol-Version` header then picks the
protocol path: absent or a handshake-era version goes to the session front (`handshake.py`),
anything else to the 2026-07-28 front (`stateless.py`). `/healthz` (liveness: the process serves)
and `/readyz` (readiness: it is not draining and its state store answers) need no credentials.

The HTTP method becomes a metrics label only from a fixed set (anything else counts as `OTHER`), so
a client cannot add series to `/metrics`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from starlette.types import Message, Receive, Scope, Send

from mcp_backfill import __version__, protocol
from mcp_backfill.errors import ClientGone
from mcp_backfill.logs import get_logger
from mcp_backfill.options import SHUTTING_DOWN, named
from mcp_backfill.sidecar import cors
from mcp_backfill.sidecar import metrics as prometheus
from mcp_backfill.sidecar.handshake import HandshakeFront
from mcp_backfill.sidecar.http_io import HttpCall, json_bytes, upstream_headers
from mcp_backfill.sidecar.lane import HANDED_OVER
from mcp_backfill.sidecar.metrics import Metrics
from mcp_backfill.sidecar.security import AccessPolicy, host_allowed, origin_allowed
from mcp_backfill.sidecar.stateless import StatelessFront

log = get_logger("sidecar")

MCP_PATHS = ("/mcp", "/mcp/")
# The methods a metrics label may name; any other counts as "OTHER".
LABELLED_METHODS = frozenset({"GET", "HEAD", "POST", "DELETE", "OPTIONS", "PUT", "PATCH"})
UNAUTHORIZED_HEADERS = [(b"www-authenticate", b'Bearer realm="mcp-backfill"')]
BAD_TOKEN_HEADERS = [(b"www-authenticate", b'Bearer realm="mcp-backfill", error="invalid_token"')]
REFUSED = "Unauthorized: this mcp-backfill needs 'Authorization: Bearer <token>' (MCP_BACKFILL_AUTH_TOKEN)"
REFUSED_METRICS = (
    "Unauthorized: /metrics needs 'Authorization: Bearer <token>' with the --metrics-token "
    "(MCP_BACKFILL_METRICS_TOKEN)"
)
NOT_FORWARDABLE = (
    "Bad Request: the Authorization header holds bytes past ASCII, which cannot be forwarded to the "
    "upstream (--forward-authorization, MCP_BACKFILL_FORWARD_AUTHORIZATION)"
)


Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""Whether this replica can sample now, and what `/readyz` says about it."""


async def always_ready() -> tuple[bool, dict[str, Any]]:
    return True, {}


class SidecarApp:
    def __init__(
        self,
        policy: AccessPolicy,
        handshake: HandshakeFront,
        stateless: StatelessFront,
        metrics: Metrics,
        readiness: Readiness = always_ready,
    ) -> None:
        self.policy = policy
        self.handshake = handshake
        self.stateless = stateless
        self.metrics = metrics
        self.readiness = readiness
        self._in_flight = 0
        self._lane_counted: dict[str, prometheus.Labels] = {}  # the lane's statuses' series keys
        self._idle: anyio.Event | None = None

    @property
    def draining(self) -> bool:
        return self.handshake.settings.draining

    def drain(self) -> None:
        """Shutting down: refuse new sessions and requests, and end the streams that never end by
        themselves (handshake sessions' standalone GET streams, 2026-07-28 `subscriptions/listen`)."""
        self.handshake.settings.draining = True
        self.stateless.settings.draining = True
        self.stateless.hubs.drain()
        for session in self.handshake.sessions.all():
            session.router.get_stream.finish()
        self.stateless.hubs.end_listens()

    def lane_began(self) -> None:
        """A request the lane answers (`lane.py`) is in flight, as one the app answers is."""
        self._in_flight += 1

    def lane_ended(self, status: str | None) -> None:
        """... and is over; `status` is counted (None: the app's handler counted it)."""
        if status is not None:
            key = self._lane_counted.get(status)
            if key is None:
                key = self._lane_counted[status] = prometheus.labels_key(method="POST", status=status)
            self.metrics.http_requests.add(key)
        self._in_flight -= 1
        if not self._in_flight and self._idle is not None:
            self._idle.set()

    @property
    def busy(self) -> bool:
        """Is an HTTP request being answered?"""
        return self._in_flight > 0

    def end_requests(self, reason: str = SHUTTING_DOWN) -> None:
        """The drain is over: every session and 2026-07-28 upstream answers the requests still in
        flight with a JSON-RPC error (`reason`) and stops (its Claude calls are cancelled, and
        charged), so that their handlers end with an answer instead of being cancelled by uvicorn
        (a bare `500`)."""
        for session in self.handshake.sessions.all():
            session.shut_down(reason)
        self.stateless.hubs.shut_down(reason)

    async def wait_idle(self) -> None:
        """Until no HTTP request is being answered (while draining: none is left in flight)."""
        while self._in_flight:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self._in_flight += 1
        try:
            await self._answer(scope, receive, send)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._idle is not None:
                self._idle.set()

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 0

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        call = HttpCall(scope, receive, recording_send)
        try:
            await self._route(call)
        except ClientGone:
            status = status or 499
        except Exception:
            status = status or 500  # uvicorn answers it with a 500 (the 5xx alert must see it)
            raise
        finally:
            method = call.method if call.method in LABELLED_METHODS else "OTHER"
            self.metrics.http_requests.inc(method=method, status=str(status or 499))

    async def _route(self, call: HttpCall) -> None:
        handed = call.scope.get("extensions", {}).get(HANDED_OVER)
        if handed is not None:  # checked by the lane already
            await self.handshake.take_over(call, handed)
            return
        if not await self._origin_checked(call):
            return
        path = call.scope["path"]
        if path in MCP_PATHS:
            origin = call.headers.get("origin")
            if origin is not None:  # a browser's page the allow-list admits: CORS (see `cors`)
                if cors.is_preflight(call):
                    await cors.answer_preflight(call, origin)
                    return
                call.response_headers = cors.response_headers(origin)
            await self._mcp(call)
        elif path == "/healthz" and call.method in ("GET", "HEAD"):
            await self._healthz(call)
        elif path == "/readyz" and call.method in ("GET", "HEAD"):
            await self._readyz(call)
        elif path == "/metrics" and call.method in ("GET", "HEAD"):
            if self.policy.reads_metrics(call.headers.get("authorization")):
                self.handshake.sessions.settle()
                data = self.metrics.render().encode()
                await call.respond(200, data, prometheus.CONTENT_TYPE)
            else:
                await self._refuse(call, REFUSED_METRICS if self.policy.metrics_token else REFUSED)
        else:
            await call.respond(404, b"Not Found", "text/plain; charset=utf-8")

    async def _healthz(self, call: HttpCall) -> None:
        body = {
            "status": "draining" if self.draining else "ok",
            "version": __version__,
            "sessions": len(self.handshake.sessions),
            "requests_in_flight_2026": self.stateless.hubs.in_flight,
        }
        await call.respond(503 if self.draining else 200, json_bytes(body))

    async def _readyz(self, call: HttpCall) -> None:
        ready, about = await self.readiness()
        ready = ready and not self.draining
        body = {"status": "ready" if ready else ("draining" if self.draining else "not ready"), **about}
        await call.respond(200 if ready else 503, json_bytes(body))

    async def _origin_checked(self, call: HttpCall) -> bool:
        """Host and Origin against the allow-lists; answers 403 itself when either is refused (400
        for more than one Host line, RFC 9112 §3.2: another than the one checked may be used)."""
        if sum(1 for name, _ in call.scope["headers"] if name == b"host") > 1:
            log.warning("request refused: more than one Host header")
            await call.respond_error(400, protocol.INVALID_REQUEST, "Bad Request: more than one Host header")
            return False
        host = call.headers.get("host")
        if not host_allowed(host, self.policy):
            log.warning(
                f"request refused: Host not allowed ({named('--allowed-hosts')})", extra={"host": host}
            )
            await call.respond_error(403, protocol.INVALID_REQUEST, "Forbidden: Host header not allowed")
            return False
        origin = call.headers.get("origin")
        if not origin_allowed(origin, self.policy):
            log.warning(
                f"request refused: Origin not allowed ({named('--allowed-origins')})",
                extra={"origin": origin},
            )
            await call.respond_error(403, protocol.INVALID_REQUEST, "Forbidden: Origin header not allowed")
            return False
        return True

    async def _mcp(self, call: HttpCall) -> None:
        identity = await self._identify(call)
        if identity is None:
            return
        # Built only if this request opens an upstream (a session's first POST, a hub's first call).
        headers = partial(upstream_headers, call, strip_authorization=self.policy.authenticates)
        version = call.headers.get(protocol.VERSION_HEADER)
        if _stateless(version, call.headers.get(protocol.SESSION_HEADER)):
            await self.stateless.handle(call, headers, identity)
        else:
            await self.handshake.handle(call, headers, identity)

    async def _identify(self, call: HttpCall) -> str | None:
        """The caller's client identity; None (after answering 401) when its token is missing or
        wrong, or (400) when it is a credential to forward that no header can carry as text."""
        authorization = call.headers.get("authorization")
        if self.policy.forward_authorization and authorization and not authorization.isascii():
            # Forwarded, it goes upstream as a header, which holds no such value as text: the
            # session it opened failed every request with an internal error.
            log.warning(f"request refused: Authorization not ASCII ({named('--forward-authorization')})")
            await call.respond_error(400, protocol.INVALID_REQUEST, NOT_FORWARDABLE)
            return None
        identity = self.policy.identify(authorization)
        if identity is not None:
            return identity
        await self._refuse(call, REFUSED)
        return None

    async def _refuse(self, call: HttpCall, message: str) -> None:
        """401: the bearer token is missing or wrong."""
        log.warning(
            "request refused: missing or wrong bearer token",
            extra={"path": call.scope["path"], "client": _peer(call)},
        )
        authorization = call.headers.get("authorization")
        await call.respond_error(
            401,
            protocol.INVALID_REQUEST,
            message,
            headers=BAD_TOKEN_HEADERS if authorization else UNAUTHORIZED_HEADERS,
        )


def _peer(call: HttpCall) -> str | None:
    client = call.scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


def _stateless(version: str | None, session_id: str | None) -> bool:
    """Is this a 2026-07-28-style request (no session)? Its `MCP-Protocol-Version` names no handshake
    revision. A request naming a session is the session's, unless it names 2026-07-28: a session
    negotiated at a revision this proxy does not know sends that revision in the header (it was
    taken for a stateless request and refused, every request of the session with it)."""
    if version is None or version in protocol.HANDSHAKE_VERSIONS:
        return False
    return session_id is None or version == protocol.STATELESS_VERSION
