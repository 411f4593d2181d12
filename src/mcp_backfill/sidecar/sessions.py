"""Handshake-era client sessions: one upstream and one relay per `Mcp-Session-Id`.

A session is created by the client's `initialize` POST and ends when the client DELETEs it, when it
stays idle (no HTTP request being served: a request its client dropped mid-answer does not count) for
`--session-idle-timeout` seconds, when its upstream goes away, or when the sidecar shuts down. Ending
it stops the upstream (for a child process: stdin closed, then SIGTERM, then SIGKILL), answers the
requests still in flight with an error, and forgets the id, so later requests with it get 404.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill.errors import SessionGone, UpstreamStartError
from mcp_backfill.logs import get_logger
from mcp_backfill.options import named
from mcp_backfill.relay import Relay, UpstreamAtOnce
from mcp_backfill.sidecar.upstreams import UPSTREAM_START_FAILED, UpstreamFactory, UpstreamRequest
from mcp_backfill.transports.base import MessageChannel, PostsAhead, SendsAtOnce
from mcp_backfill.transports.deadlines import CLOCK_RESOLUTION
from mcp_backfill.transports.http_server import INBOX_SIZE, SessionChannel, SessionRouter
from mcp_backfill.transports.http_upstream import HttpUpstream
from mcp_backfill.transports.queue import MessageQueue

log = get_logger("sidecar")

# Server messages kept per SSE stream for clients that resume with Last-Event-ID.
REPLAY_LIMIT = 1024
# Client identities whose recent session openings `OpeningRate` keeps before it drops idle ones
# (forwarded Authorization headers make identities as cheap as a header).
OPENING_IDENTITIES = 4096

IDLE_REASON = "MCP session closed after being idle"
MakeRelay = Callable[[MessageChannel, MessageChannel, str], Relay]
"""(client side, upstream side, client identity) -> the relay between them."""
CountMessage = Callable[[str], None]


class CountingChannel:
    """A `MessageChannel` that reports each message it carries (for the metrics)."""

    def __init__(self, inner: MessageChannel, count: CountMessage, received: str, sent: str) -> None:
        self._inner = inner
        self._count = count
        self._received = received
        self._sent = sent

    async def receive(self) -> bytes:
        message = await self._inner.receive()
        self._count(self._received)
        return message

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        message, origin = await self._inner.receive_with_origin()
        self._count(self._received)
        return message, origin

    async def send(self, message: bytes, related: Any = None) -> None:
        await self._inner.send(message, related)
        self._count(self._sent)


class CountingAtOnce(CountingChannel):
    """A `CountingChannel` around a channel that also `SendsAtOnce`."""

    def __init__(self, inner: SendsAtOnce, count: CountMessage, received: str, sent: str) -> None:
        super().__init__(inner, count, received, sent)  # type: ignore[arg-type]
        self._at_once = inner
        # The inner channel's own: asked before every message relayed at once, up to four times a
        # call, where a method of this class in between would add a call each time.
        self.can_send_now: Callable[[], bool] = inner.can_send_now

    def send_now(self, message: bytes, related: Any = None) -> None:
        self._at_once.send_now(message, related)
        self._count(self._sent)


class CountingAhead(CountingAtOnce):
    """A `CountingAtOnce` around a channel that also `PostsAhead` (counted as its `send_now`)."""

    def __init__(self, inner: PostsAhead, count: CountMessage, received: str, sent: str) -> None:
        super().__init__(inner, count, received, sent)  # type: ignore[arg-type]
        self.post_ahead: Callable[[bytes, dict[str, Any]], bool] = inner.post_ahead


def counting(upstream: MessageChannel, count: CountMessage) -> CountingChannel:
    if isinstance(upstream, PostsAhead):
        return CountingAhead(upstream, count, "from_upstream", "to_upstream")
    if isinstance(upstream, SendsAtOnce):
        return CountingAtOnce(upstream, count, "from_upstream", "to_upstream")
    return CountingChannel(upstream, count, "from_upstream", "to_upstream")


@dataclass(frozen=True)
class SessionSettings:
    idle_timeout: float  # 0: never
    stop_timeout: float  # how long a DELETE waits for the upstream to stop


class HttpSession:
    """One client session: its stream router, its inbox, and the task running its relay."""

    def __init__(
        self, session_id: str, settings: SessionSettings, count: CountMessage, identity: str
    ) -> None:
        self.id = session_id
        self.identity = identity
        """The client identity that opened the session: the only one that may use it."""
        self._settings = settings
        self._count = count
        self._scope = anyio.CancelScope()
        self._terminated = False
        self._connections = 0
        # The idle clock (see `_activity_changed`): when the session last went idle or saw activity
        # while idle, and the timer that looks at it (at most one armed).
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # once known (asyncio's lookup is a `getpid`)
        self.router = SessionRouter(REPLAY_LIMIT, on_change=self._activity_changed)
        self._inbox = MessageQueue[bytes](INBOX_SIZE)
        self.channel = SessionChannel(self.router, self._inbox, count)
        self.ended = anyio.Event()
        self.relay: Relay | None = None  # once the upstream is open
        self._activity_changed()

    @property
    def label(self) -> str:
        return f"session {self.id[:8]}"

    async def run(
        self, open_upstream: UpstreamFactory, make_relay: MakeRelay, headers: Mapping[str, str]
    ) -> None:
        """Relay until the session ends, however it ends; never raises."""
        reason = "MCP session closed"
        try:
            with self._scope:
                async with open_upstream(UpstreamRequest(self.label, headers)) as upstream:
                    counted = counting(upstream, self._count)
                    relay = make_relay(self.channel, counted, self.identity)
                    self.relay = relay
                    if isinstance(upstream, HttpUpstream):
                        upstream.deliver_at_once(UpstreamAtOnce(relay, lambda: self._count("from_upstream")))
                    relay.traces.session_id = self.id
                    try:
                        await relay.run(on_client_closed=self._stop)
                    finally:
                        if self._scope.cancel_called and not self._terminated:
                            # Ended for idleness: later requests get 404 from now on, not once the
                            # upstream has stopped (seconds, for one slow to exit).
                            self.router.close(IDLE_REASON)
                    # An HTTP upstream ends when its server forgot the session, and says so.
                    told = getattr(upstream, "stop_reason", None)
                    reason = told or "Upstream MCP server closed the connection (it exited or crashed)"
                    log.warning("upstream ended the session", extra={"session": self.label})
                    await relay.fail_pending(reason)
                    self.router.close(reason)  # later requests get 404 while the upstream stops
            if self._scope.cancelled_caught and not self._terminated:
                log.info("idle session closed", extra={"session": self.label})
                reason = IDLE_REASON
        except UpstreamStartError as exc:
            log.error(str(exc), extra={"session": self.label})
            reason = UPSTREAM_START_FAILED
        except Exception:
            log.exception("session failed", extra={"session": self.label})
            reason = "Internal error in mcp-backfill; the MCP session is closed"
        finally:
            self.router.close(reason)
            self._inbox.close()
            self.ended.set()
            if self._idle_timer is not None:  # (nothing arms it once `ended` is set)
                self._idle_timer.cancel()
                self._idle_timer = None

    async def _stop(self) -> None:
        self.terminate()

    def shut_down(self, reason: str) -> None:
        """End the session now, its requests still waiting answered with `reason` at once (not once
        its upstream has stopped): the sidecar's drain is over."""
        self.router.close(reason)
        self.terminate()

    def terminate(self) -> None:
        """End the session now (DELETE, shutdown); `ended` is set once its upstream has stopped."""
        self._terminated = True
        self._scope.cancel()

    async def deliver(self, raw: bytes) -> None:
        """Hand what the client POSTed to the relay, and let the relay take it before going on: the
        request is then on its way upstream before the handler prepares its answer."""
        try:
            await self._inbox.send(raw)
        except anyio.ClosedResourceError:
            raise SessionGone from None
        await asyncio.sleep(0)

    def deliver_now(self, raw: bytes) -> None:
        """`deliver`, without waiting for room (from the lane, which has none to wait in)."""
        try:
            self._inbox.send_nowait(raw)
        except anyio.ClosedResourceError:
            log.debug("message for an ended session dropped", extra={"session": self.label})

    @contextmanager
    def hold(self) -> Iterator[None]:
        """An HTTP request of this session is being served: the session is not idle meanwhile."""
        self.took_request()
        try:
            yield
        finally:
            self.let_go()

    def took_request(self) -> None:
        """`hold`, begun (`let_go` ends it): the session is busy, its idle clock stopped."""
        self._connections += 1

    def let_go(self) -> None:
        self._connections -= 1
        self._activity_changed()

    @property
    def busy(self) -> bool:
        """Serving an HTTP request. A request in flight holds its POST (and a stream held open its
        GET) until answered; one whose client dropped the POST and left does not keep the session:
        an upstream that never answers it would keep its process for good. (A client that comes
        back within the idle timeout finds the answer kept for it to resume.)"""
        return self._connections > 0

    def _activity_changed(self) -> None:
        """A request was taken or ended, or a message routed: while no request is served, the idle
        clock starts again from now. The clock is looked at by one timer, armed when none is and
        moved on when it fires early, so this is cheap enough for every request (a deadline moved
        for each cost the session's call path about 5% of its CPU: `benchmarks/README.md`, the
        twenty-fifth round)."""
        if self._connections or self._settings.idle_timeout <= 0 or self.ended.is_set():
            return  # a busy session is not idle; the request's end starts the clock again
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_at(self._idle_since + self._settings.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._connections or self.ended.is_set():
            return  # the request being served starts the clock again when it ends
        due = self._idle_since + self._settings.idle_timeout
        loop = asyncio.get_running_loop()
        if loop.time() + CLOCK_RESOLUTION >= due:  # (a timer may fire a tick before its time)
            self._scope.cancel()
        else:
            self._idle_timer = loop.call_at(due, self._idle_check)


@dataclass(frozen=True)
class Admission:
    """`OpeningRate.admit`'s answer."""

    wait: float | None  # None: the opening may happen (counted), else the seconds until one may
    at: float  # when it was asked


class OpeningRate:
    """At most `per_minute` upstream starts per client identity in any sliding minute (0: no limit):
    its new handshake-era sessions and its 2026-07-28 hub's (re)starts, counted together.

    Opening a session starts an upstream (a process, or an upstream session), the costliest thing a
    client can make the sidecar do; one client opening and deleting sessions in a loop, or posting
    2026-07-28 requests to an upstream that exits after each one, would take the CPU from everyone
    else. Identities seen in the last minute are kept, no others.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._opened: dict[str, deque[float]] = {}

    def admit(self, identity: str) -> Admission:
        """Whether `identity` may open a session now (then counted, until `refused` says otherwise)."""
        now = self._clock()
        if self.per_minute <= 0:
            return Admission(None, now)
        if len(self._opened) > OPENING_IDENTITIES:
            self._opened = {k: v for k, v in self._opened.items() if v and v[-1] > now - 60}
        opened = self._opened.setdefault(identity, deque())
        while opened and opened[0] <= now - 60:
            opened.popleft()
        if len(opened) >= self.per_minute:
            return Admission(opened[0] + 60 - now, now)
        opened.append(now)
        return Admission(None, now)

    def waiting(self, identity: str) -> Admission:
        """What `admit` would answer now, counting nothing: a start that needs room made first
        (another client's idle upstream stopped) asks this before making it."""
        now = self._clock()
        opened = self._opened.get(identity)
        if self.per_minute <= 0 or not opened:
            return Admission(None, now)
        recent = [at for at in opened if at > now - 60]
        if len(recent) >= self.per_minute:
            return Admission(recent[0] + 60 - now, now)
        return Admission(None, now)

    def refusal(self, identity: str, admission: Admission, what: str) -> tuple[str, int]:
        """The error message of an opening `admit` refused (`what`: what was refused), and its
        `Retry-After` in seconds."""
        seconds = max(1, math.ceil(admission.wait or 0))
        message = (
            f"Too many {what}: at most {self.per_minute} a minute for client {identity!r} "
            f"({named('--client-session-rate')}), new sessions and 2026-07-28 upstream starts "
            f"counted together; retry in {seconds} s"
        )
        return message, seconds

    def refused(self, identity: str, admission: Admission) -> None:
        """The opening `admit` counted did not happen (no slot was free): it counts no more. Its own
        place goes, not the client's latest: another opening of the client's may have been counted
        while this one waited for room."""
        opened = self._opened.get(identity)
        if admission.wait is None and opened and admission.at in opened:
            opened.remove(admission.at)


async def _no_room() -> bool:
    return False


class SessionTable:
    """The live sessions by id, with the admission limit.

    `max_upstreams` counts upstreams: the sessions' and `others()` (the 2026-07-28 hubs', which
    share `--max-sessions`). A new session finding them all taken asks `make_room` to stop an idle
    hub (and waits for its upstream to be gone); when there is none it is refused.
    """

    def __init__(
        self,
        max_upstreams: int,
        settings: SessionSettings,
        open_upstream: UpstreamFactory,
        make_relay: MakeRelay,
        count: CountMessage,
        others: Callable[[], int] = lambda: 0,
        make_room: Callable[[], Awaitable[bool]] = _no_room,
    ) -> None:
        self._max = max_upstreams
        self._settings = settings
        self._open_upstream = open_upstream
        self._make_relay = make_relay
        self._count = count
        self._others = others
        self._make_room = make_room
        self._sessions: dict[str, HttpSession] = {}
        # Ended by DELETE and gone from `_sessions` (their id gets 404), their upstream still
        # stopping: they hold their place under `max_upstreams` until it has.
        self._stopping: set[HttpSession] = set()
        self._tg: TaskGroup | None = None

    def start(self, tg: TaskGroup) -> None:
        self._tg = tg

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def upstreams(self) -> int:
        """The sessions' upstreams: the open sessions' and those still stopping."""
        return len(self._sessions) + len(self._stopping)

    def all(self) -> list[HttpSession]:
        return list(self._sessions.values())

    def get(self, session_id: str) -> HttpSession | None:
        """The session, its relay's books of every message it has relayed kept (`Relay.settle`)."""
        session = self._sessions.get(session_id)
        if session is not None and session.relay is not None:
            session.relay.settle()
        return session

    def settle(self) -> None:
        """Every session's relay's books kept (`Relay.settle`): what is counted is all relayed."""
        for session in self._sessions.values():
            if session.relay is not None:
                session.relay.settle()

    def peek(self, session_id: str) -> HttpSession | None:
        """`get`, for the lane: it posts a request ahead of those books (`lane.py`)."""
        return self._sessions.get(session_id)

    async def room(self) -> bool:
        """Is there room for one more upstream? When `max_upstreams` are open, an idle hub is
        stopped to make it (waiting for its upstream to be gone); False when none of them is idle.
        The caller opens its session without awaiting anything in between, else the room may go."""
        while self.upstreams + self._others() >= self._max:
            if not await self._make_room():
                return False
        return True

    def open(self, headers: Mapping[str, str], identity: str) -> HttpSession:
        """A new session of client `identity` with its relay starting, in the room `room` found.
        (Apart, so that the caller can tell whether it still wants the session after the wait: the
        drain may have begun meanwhile.)"""
        assert self._tg is not None
        session = HttpSession(secrets.token_hex(16), self._settings, self._count, identity)
        self._sessions[session.id] = session
        log.info(
            "session opened",
            extra={"session": session.label, "client": identity, "sessions": len(self._sessions)},
        )
        self._tg.start_soon(self._run, session, headers)
        return session

    async def _run(self, session: HttpSession, headers: Mapping[str, str]) -> None:
        try:
            await session.run(self._open_upstream, self._make_relay, headers)
        finally:
            self._sessions.pop(session.id, None)
            self._stopping.discard(session)
            log.info("session ended", extra={"session": session.label, "sessions": len(self._sessions)})

    async def close(self, session: HttpSession) -> None:
        """End a session (DELETE) and wait, within reason, for its upstream to stop."""
        if self._sessions.pop(session.id, None) is not None and not session.ended.is_set():
            self._stopping.add(session)
        session.terminate()
        with anyio.move_on_after(self._settings.stop_timeout):
            await session.ended.wait()

    async def close_all(self) -> None:
        """End every session and wait for their upstreams to stop."""
        sessions = [*self._sessions.values(), *self._stopping]
        self._sessions.clear()
        for session in sessions:
            session.terminate()
        for session in sessions:
            await session.ended.wait()
