"""`/mcp` for 2026-07-28 requests: sessionless POSTs sharing one upstream and one relay.

A request whose `MCP-Protocol-Version` header is not a handshake-era version takes this path (as in
the MCP SDK's server). There is no session id and no GET stream (GET and DELETE: 405). A POSTed
notification is acknowledged (202) and dropped: this revision has no client-to-server notifications
over HTTP, and a client cancels by closing its POST. A request must be one JSON-RPC 2.0 request (no
batch) whose `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers match its body, and whose
`params._meta` carries the protocol version and client capabilities, else 400 with the same
JSON-RPC error the SDK's server gives (-32020 for a header mismatch, -32602, -32022). A `tools/call`'s
`Mcp-Param-*` headers are checked here too, against the called tool's `x-mcp-header` annotations, as
the SDK's server checks them: a stdio upstream never sees the headers, and an HTTP upstream gets
ones the proxy derives from the body, so a gateway routing on a header the body contradicts would
otherwise go unnoticed. The schema comes from the tools listings the hub has carried, or from a
listing of the proxy's own when no listing has shown the tool yet; when that fails, or the server
has no such tool, the call goes to the upstream unchecked (as in the SDK's server).

The requests of one client identity (see `security`) share one upstream, started on its first
request (for `-- CMD`: one child process, a 2026-07-28 stdio server being stateless per request) and
again after it exits. Each start counts against the client's `--client-session-rate`, with its
handshake sessions' openings (an upstream exiting after each request would otherwise cost a process
start per request): a start past it is refused (429 with `Retry-After`); requests to the upstream
running never ask. Clients are never mixed on one upstream: a server message the mux can only
attribute to "the one request in flight" is then always the same client's, and with
`--forward-authorization` no request reaches the upstream with another client's credentials.

The answer is JSON when it comes within 15 s with nothing before it, else an SSE stream without
event ids (this revision does not resume streams), as the SDK's server does; JSON errors get the
SDK's HTTP status for their code (400, or 404 for -32601). One client's hub takes no request while
the answers its readers have not read hold `HUB_BUFFER_BYTES` (429, as a session's POSTs get); how
many it has in flight is bounded by `--max-connections` alone, since one identity may be many users
(every caller of a sidecar without tokens, every holder of `--auth-token`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import TooManyStarts, UpstreamStartError
from mcp_backfill.logs import get_logger
from mcp_backfill.options import SHUTTING_DOWN, named
from mcp_backfill.relay.input_required import SealedStash, Stash, stash_token
from mcp_backfill.sidecar.http_io import (
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
from mcp_backfill.sidecar.sessions import CountingChannel, CountMessage, MakeRelay, OpeningRate
from mcp_backfill.sidecar.upstreams import UPSTREAM_START_FAILED, UpstreamFactory, UpstreamRequest
from mcp_backfill.transports.event_stream import SESSION_REPLAY_BYTES
from mcp_backfill.transports.http_mux import MuxChannel, MuxedRequest
from mcp_backfill.transports.tool_schemas import LIST_PAGE_CAP

if TYPE_CHECKING:
    from mcp.shared.inbound import InboundLadderRejection

# The SDK's inbound checks (`mcp.shared.inbound`) are imported on the first 2026-07-28 request, not
# with this module: importing the SDK costs the sidecar ~0.85 s of startup and ~40 MB of memory,
# which a sidecar serving only handshake-era clients never needs.

log = get_logger("sidecar")

SUPPORTED_STATELESS_VERSIONS = (protocol.STATELESS_VERSION,)
# How long a tools listing of the proxy's own (for the `Mcp-Param-*` check), all its pages, may
# hold the call that needs it.
OWN_LIST_SECONDS = 10.0
HUB_LABEL = "2026-07-28 requests"
# What the response streams of one client's requests may hold for their readers before its next
# request is refused (429), as much as a handshake session keeps for replay.
HUB_BUFFER_BYTES = SESSION_REPLAY_BYTES


class StatelessHub:
    """The upstream and relay of one client identity's 2026-07-28 requests, (re)started when needed."""

    def __init__(
        self,
        open_upstream: UpstreamFactory,
        make_relay: MakeRelay,
        count: CountMessage,
        identity: str,
        opening: OpeningRate | None = None,
    ) -> None:
        self._open_upstream = open_upstream
        self._make_relay = make_relay
        self._count = count
        self.identity = identity
        # The client's upstream starts a minute, shared with its handshake sessions' openings.
        self._opening = opening or OpeningRate(0)
        self._mux: MuxChannel | None = None
        self._scope: anyio.CancelScope | None = None
        self._lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._headers: dict[str, str] = {}
        self._waiting = 0  # requests in `mux`, waiting for the upstream to start
        self._held = 0  # requests of this client whose body is arriving (`StatelessHubs.held`)
        self._stopped = anyio.Event()  # set while no upstream of this hub runs (or is stopping)
        self._stopped.set()
        self._shut = anyio.Event()  # the drain is over (`shut_down`)
        self._draining = anyio.Event()  # the drain has begun: no upstream starts any more
        # The proxy's answers to mixed rounds, kept for the client's retry: the hub's, not one
        # relay's, so that a round paid for outlives the upstream that asked it (restarted after it
        # exited; `StatelessHubs` hands it on to the client's next hub when this one is stopped).
        self.stash: Stash | SealedStash | None = None
        self.last_used = anyio.current_time()

    def start(self, tg: TaskGroup) -> None:
        self._tg = tg

    @property
    def in_flight(self) -> int:
        """Requests in flight, counting those that wait for the upstream to start: a hub that is
        starting is busy, never idle enough to be stopped to make room."""
        return self._waiting + (self._mux.in_flight if self._mux is not None else 0)

    @property
    def busy(self) -> bool:
        """Requests in flight, or a request of this client whose body is still arriving: the hub is
        not idle, to be stopped to make room or for idleness."""
        return self._held > 0 or self.in_flight > 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            self.last_used = anyio.current_time()

    async def mux(self, headers: UpstreamHeaders) -> MuxChannel | None:
        """The live mux, starting the upstream first if needed (None: the drain has begun, and no
        upstream starts then: the request is refused, and a new upstream would run for nothing
        until `serve` stops); raises `UpstreamStartError`, and `TooManyStarts` when the client has
        started upstreams (and opened sessions) as often as `--client-session-rate` allows in the
        last minute (only a start asks: a request to the running upstream never does)."""
        live = self._mux
        if live is not None and not live.closed:
            return live  # the common case: no lock to take
        if self._draining.is_set():
            return None
        self._waiting += 1
        try:
            async with self._lock:
                if self._mux is None or self._mux.closed:
                    assert self._tg is not None
                    # An upstream that closed its output may take seconds to exit: one started
                    # beside it would make two processes for this hub (past --max-sessions).
                    await first_of(self._stopped, self._shut, self._draining)
                    if self._shut.is_set() and self._mux is not None:
                        return self._mux  # closed: the drain is over
                    if self._draining.is_set():
                        return None
                    admission = self._opening.admit(self.identity)
                    if admission.wait is not None:
                        message, seconds = self._opening.refusal(self.identity, admission, "upstream starts")
                        raise TooManyStarts(message, seconds)
                    self._headers = headers()
                    await self._tg.start(self._run)
                    if self._draining.is_set():  # it began while the upstream started
                        self.stop()
                        return None
                assert self._mux is not None
                return self._mux
        finally:
            self._waiting -= 1

    @property
    def stopped(self) -> bool:
        """No upstream of this hub runs, nor is still stopping."""
        return self._stopped.is_set()

    @property
    def stopped_event(self) -> anyio.Event:
        """Set once no upstream of this hub runs, nor is still stopping."""
        return self._stopped

    async def _run(self, *, task_status: TaskStatus[None]) -> None:
        mux = MuxChannel(self._count)
        reason = "Upstream MCP server closed the connection (it exited or crashed)"
        started = False
        stopped = self._stopped = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                async with self._open_upstream(UpstreamRequest(HUB_LABEL, self._headers)) as upstream:
                    relay = self._make_relay(
                        mux,
                        CountingChannel(upstream, self._count, "from_upstream", "to_upstream"),
                        self.identity,
                    )
                    if self.stash is None:
                        self.stash = relay.rounds.stash
                    relay.rounds.adopt(self.stash)
                    self._mux = mux
                    started = True
                    task_status.started()
                    await relay.run(on_client_closed=self._stop)
                    log.warning("the upstream serving 2026-07-28 requests ended")
                    await relay.fail_pending(reason)
                    mux.close(reason)  # the next request starts a new upstream meanwhile
            if self._scope.cancelled_caught:
                reason = SHUTTING_DOWN
                if not started:  # stopped while it started (the drain is over): the request is told
                    mux.close(reason)
                    self._mux = mux
                    started = True
                    task_status.started()
        except UpstreamStartError:
            raise  # before `started`: the request that wanted the upstream reports it
        except Exception:
            log.exception("the relay for 2026-07-28 requests failed")
            reason = "Internal error in mcp-backfill"
            if not started:
                raise
        finally:
            mux.close(reason)
            stopped.set()
            if isinstance(self.stash, Stash) and self._tg is not None:  # until another relay has it
                self._tg.start_soon(watch_questions, self.stash, lambda: self._mux is mux)

    async def _stop(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def drain(self) -> None:
        """The drain has begun: the upstream running serves on, none starts any more."""
        self._draining.set()

    def shut_down(self, reason: str) -> None:
        """Stop, the requests still waiting answered with `reason` at once (the drain is over)."""
        self._shut.set()
        if self._mux is not None:
            self._mux.close(reason)
        self.stop()

    def end_listens(self) -> None:
        if self._mux is not None:
            self._mux.end_listens(SHUTTING_DOWN)


async def watch_questions(stash: Stash, still: Callable[[], bool]) -> None:
    """While `still()` (no relay watches them: the hub's upstream exited, or the hub was stopped),
    the approval questions open in `stash` expire on time, their sampling requests refused then
    (`Stash.expired`), not when the client's next request comes, if it ever does."""
    while still():
        expiries = [entry.expires for entry in stash.entries.values() if entry.pending]
        if not expiries:
            return
        left = min(expiries) - stash.clock()
        if left <= 0:
            stash.holds()  # drops the expired, each reported
            continue
        await anyio.sleep(max(left, 0.001))  # a loop may wake a tick early: then once more


class StatelessHubs:
    """The hubs that serve 2026-07-28 requests: one per client identity.

    At most `max_upstreams` upstreams exist at once: the hubs' and `others()` (the handshake
    sessions', which share `--max-sessions`). When a new identity arrives and all are taken, the hub
    idle the longest (no request in flight, none arriving) is stopped to make room (`make_room`,
    which a new session uses too; the newcomer waits for its upstream to be gone); only when no hub
    is idle is the request refused. So credentials
    that come and go (junk `Authorization` values under `--forward-authorization`, each its own
    identity) can never lock real clients out for longer than their own requests last. Hubs idle for
    `idle_timeout` (0: never) are stopped as well.
    """

    def __init__(
        self,
        make_hub: Callable[[str], StatelessHub],
        *,
        max_upstreams: int,
        idle_timeout: float,
        others: Callable[[], int] = lambda: 0,
        stop_timeout: float = 10.0,
        opening: OpeningRate | None = None,
    ) -> None:
        """`opening`: the clients' upstream starts a minute, which the hubs made count (asked here
        too, before another client's upstream is stopped to make room for a start it refuses)."""
        self._make_hub = make_hub
        self._opening = opening or OpeningRate(0)
        self._max_upstreams = max_upstreams
        self._idle_timeout = idle_timeout
        self._others = others
        self._stop_timeout = stop_timeout
        self._hubs: dict[str, StatelessHub] = {}
        # Stopped (to make room, or for idleness) and gone from `_hubs`, their upstream still
        # stopping: they hold their place under `max_upstreams` until it has.
        self._stopping: set[StatelessHub] = set()
        # The stashes of stopped hubs still holding answers a client has paid for, by identity: its
        # next hub takes its stash over (else the retry finds "requestState expired or unknown",
        # and the Claude calls made for the round are wasted).
        self._stashes: dict[str, Stash] = {}
        self._shut = anyio.Event()  # the drain is over: no more waiting for room
        self._draining = anyio.Event()  # the drain has begun: no new hubs, no room made
        self._tg: TaskGroup | None = None

    def start(self, tg: TaskGroup) -> None:
        self._tg = tg
        if self._idle_timeout > 0:
            tg.start_soon(self._reap_idle)

    @property
    def in_flight(self) -> int:
        return sum(hub.in_flight for hub in self._hubs.values())

    def __len__(self) -> int:
        return len(self._hubs)

    @property
    def upstreams(self) -> int:
        """The hubs' upstreams: the hubs' and those still stopping."""
        self._stopping = {hub for hub in self._stopping if not hub.stopped}
        return len(self._hubs) + len(self._stopping)

    async def mux(self, headers: UpstreamHeaders, identity: str) -> MuxChannel | None:
        """The live mux of `identity`'s hub (None: `max_upstreams` are all busy with other clients
        or sessions, or the drain has begun and the hub has no upstream running); raises
        `UpstreamStartError`, and `TooManyStarts` (`StatelessHub.mux`)."""
        hub = self._hubs.get(identity)
        if hub is None:  # its start would be refused: no hub made, no other client's stopped for it
            admission = self._opening.waiting(identity)
            if admission.wait is not None:
                message, seconds = self._opening.refusal(identity, admission, "upstream starts")
                raise TooManyStarts(message, seconds)
        while hub is None:
            if self._draining.is_set():
                return None
            if self.upstreams + self._others() < self._max_upstreams:
                assert self._tg is not None
                hub = self._hubs[identity] = self._make_hub(identity)
                hub.stash = self._stashes.pop(identity, None)
                hub.start(self._tg)
            elif not await self.make_room():
                return None
            else:  # another request of this client may have made its hub meanwhile
                hub = self._hubs.get(identity)
        hub.last_used = anyio.current_time()
        return await hub.mux(headers)

    def held(self, identity: str) -> contextlib.AbstractContextManager[None]:
        """`identity`'s hub, if it has one, is busy while a request's body arrives: else, with every
        upstream taken, a newcomer could have it stopped as idle under the request (then refused,
        503), and `--session-idle-timeout` could stop it too (as `HandshakeFront` holds a session)."""
        hub = self._hubs.get(identity)
        return hub.hold() if hub is not None else contextlib.nullcontext()

    async def make_room(self) -> bool:
        """Stop the hub idle the longest, to make room for another upstream, and wait (up to
        `stop_timeout`) for its upstream to be gone: False if no hub is idle, or it is still
        stopping. (A newcomer's upstream started beside one still stopping would make one more
        upstream process than `--max-sessions`.)"""
        idle = [(hub.last_used, key) for key, hub in self._hubs.items() if not hub.busy]
        if not idle:
            return False
        _, key = min(idle)
        hub = self._retire(key)
        log.info("upstream for 2026-07-28 requests of an idle client closed to make room")
        with anyio.move_on_after(self._stop_timeout):
            await first_of(hub.stopped_event, self._shut, self._draining)
        return hub.stopped

    def _retire(self, key: str) -> StatelessHub:
        """Stop a hub, which counts among `upstreams` until its upstream has stopped."""
        hub = self._hubs.pop(key)
        hub.stop()
        if not hub.stopped:
            self._stopping.add(hub)
        self._stashes = {identity: stash for identity, stash in self._stashes.items() if stash.holds()}
        if isinstance(hub.stash, Stash) and hub.stash.holds():
            self._stashes[key] = hub.stash
        return hub

    async def _reap_idle(self) -> None:
        while True:
            await anyio.sleep(min(self._idle_timeout / 2, 30.0))
            now = anyio.current_time()
            for key, hub in list(self._hubs.items()):
                if hub.busy:
                    hub.last_used = now
                elif now - hub.last_used >= self._idle_timeout:
                    self._retire(key)
                    log.info("idle upstream for 2026-07-28 requests closed")

    def stop(self) -> None:
        """Stop every hub (`serve` stops): the approval questions still open in the hubs' stashes,
        and in those of hubs stopped before, are given up, their sampling requests reported."""
        for hub in self._hubs.values():
            hub.stop()
            if isinstance(hub.stash, Stash):
                hub.stash.abandon()
        for stash in self._stashes.values():
            stash.abandon()
        self._stashes.clear()

    def drain(self) -> None:
        """The drain has begun: the upstreams running serve on, but none starts any more (a
        request refused for the drain would leave it running for nothing until `serve` stops)."""
        self._draining.set()
        for hub in self._hubs.values():
            hub.drain()

    def shut_down(self, reason: str) -> None:
        """The drain is over: every hub answers its requests still waiting with `reason`, and stops;
        those waiting for room wait no more."""
        self._shut.set()
        for hub in self._hubs.values():
            hub.shut_down(reason)

    def end_listens(self) -> None:
        """Shutting down: end every open `subscriptions/listen` stream, which would otherwise hold
        the drain for all of `--drain-timeout` and then be cut off mid-body."""
        for hub in self._hubs.values():
            hub.end_listens()


class StatelessFront:
    def __init__(self, hubs: StatelessHubs, settings: FrontSettings) -> None:
        self.hubs = hubs
        self.settings = settings

    async def handle(self, call: HttpCall, upstream_headers: UpstreamHeaders, identity: str) -> None:
        if call.method != "POST":
            await call.respond(405, headers=[(b"allow", b"POST")])
            return
        json_ok, sse_ok = accepts(call.headers)
        if not (json_ok and sse_ok):
            await call.respond(406)
            return
        with self.hubs.held(identity):
            body = await call.read_json_body(self.settings.max_body, self.settings.body_timeout)
        if body is None:
            return
        try:
            decoded = jsonrpc.decode(body)
        except ValueError:  # malformed, or nested too deeply
            await call.respond_error(400, protocol.PARSE_ERROR, "Parse error")
            return
        if _is_notification(decoded):
            await self._notification(call)
            return
        if not (_is_message(decoded) and protocol.string_or_integer(decoded.get("id"))):
            await call.respond_error(
                400,
                protocol.INVALID_REQUEST,
                "Body must be a single JSON-RPC 2.0 request or notification object",
            )
            return
        rejection = _reject(call, decoded)
        if rejection is not None:
            await _write_rejection(call, rejection, decoded["id"])
            return
        # A retry answering a round the proxy already sampled for (and paid for) is served while
        # the drain lasts, if the hub's upstream still runs: its answers are in this process.
        retry = _answers_a_round(decoded)
        if self.settings.draining and not retry:
            await call.respond_error(503, protocol.INTERNAL_ERROR, "Service Unavailable: shutting down")
            return
        try:
            mux = await self.hubs.mux(upstream_headers, identity)
        except UpstreamStartError as exc:
            log.error(str(exc))
            await call.respond_error(
                200,
                protocol.INTERNAL_ERROR,
                UPSTREAM_START_FAILED,
                decoded["id"],
            )
            return
        except TooManyStarts as exc:
            log.warning(
                "2026-07-28 request refused: client starts upstreams too fast", extra={"client": identity}
            )
            await call.respond_error(
                429,
                protocol.INTERNAL_ERROR,
                str(exc),
                decoded["id"],
                headers=[(b"retry-after", str(exc.retry_after).encode())],
            )
            return
        if mux is None:
            if self.settings.draining:  # it began while the request waited for room
                await call.respond_error(503, protocol.INTERNAL_ERROR, "Service Unavailable: shutting down")
                return
            await call.respond_error(
                503,
                protocol.INTERNAL_ERROR,
                f"Too many sessions and clients with requests in flight at once ({named('--max-sessions')}); "
                "try again later",
                decoded["id"],
            )
            return
        rejection = await _param_rejection(call, mux, decoded)
        if rejection is not None:
            await _write_rejection(call, rejection, decoded["id"])
            return
        if self.settings.draining and not retry:  # it began while the request waited for its upstream
            await call.respond_error(503, protocol.INTERNAL_ERROR, "Service Unavailable: shutting down")
            return
        if not await _room_for_one_more(call, mux, decoded["id"]):
            return
        exchange, rewritten = mux.open(decoded)
        try:
            # If the upstream just ended, `close` has answered the exchange already.
            with contextlib.suppress(anyio.ClosedResourceError):
                await mux.deliver(rewritten)
            if self.settings.draining:  # began while it was delivered: a listen would hold the drain
                mux.end_listens(SHUTTING_DOWN)
            await self._answer(call, mux, exchange)
        finally:
            mux.release(exchange)

    async def _notification(self, call: HttpCall) -> None:
        from mcp.shared.inbound import unsupported_protocol_version_rejection

        rejection = unsupported_protocol_version_rejection(
            call.headers.get(protocol.VERSION_HEADER, ""), SUPPORTED_STATELESS_VERSIONS
        )
        if rejection is not None:
            await _write_rejection(call, rejection, None)
            return
        await call.respond(202)

    async def _answer(self, call: HttpCall, mux: MuxChannel, exchange: MuxedRequest) -> None:
        with exchange.stream.expecting_reader():
            await self._json_or_sse(call, mux, exchange)

    async def _json_or_sse(self, call: HttpCall, mux: MuxChannel, exchange: MuxedRequest) -> None:
        stream = exchange.stream
        deadline = anyio.current_time() + self.settings.json_window
        answer = await quick_answer(stream, self.settings.json_window)
        if answer is not None:
            await respond_single(call, stream, answer, _status_of(answer))
            return
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call.watch_disconnect, scope)
                await wait_for_events(stream, deadline - anyio.current_time())
                answer = single_answer(stream)
                if answer is not None:
                    await respond_single(call, stream, answer, _status_of(answer))
                else:
                    await call.start(200, protocol.SSE_TYPE, sse_headers())
                    await pump_sse(call, stream, 0, with_ids=False, keepalive=self.settings.keepalive)
                    await call.body(b"")
                if not call.finished:  # else the watcher ends by itself (see watch_disconnect)
                    tg.cancel_scope.cancel()
        if scope.cancelled_caught and not stream.finished:
            with anyio.CancelScope(shield=True):
                await mux.abandon(exchange, "the client closed its HTTP request")


async def _room_for_one_more(call: HttpCall, mux: MuxChannel, request_id: Any) -> bool:
    """Does one client's hub take one more request? Each keeps a response stream that can hold up
    to 8 MiB for a reader that stops reading (up to `HOLD_UP_BYTES` of the hub's while its reader is
    taken to be reading): none more while those of the client hold `HUB_BUFFER_BYTES` already (429).
    Not a count: one identity may be a thousand users."""
    if mux.buffered_bytes < HUB_BUFFER_BYTES:
        return True
    reason = (
        f"the answers of this client's requests not yet read hold {HUB_BUFFER_BYTES // 2**20} MiB "
        "already; read them (or cancel those requests)"
    )
    log.warning(
        "2026-07-28 request refused: answers not read pile up",
        extra={"requests": mux.in_flight, "buffered_bytes": mux.buffered_bytes},
    )
    await call.respond_error(
        429, protocol.INVALID_REQUEST, f"Too many requests in flight: {reason}", request_id
    )
    return False


async def first_of(*events: anyio.Event) -> None:
    """Until one of `events` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def _answers_a_round(request: dict[str, Any]) -> bool:
    """A retry echoing a `requestState` of the proxy's: the client's answers to an `input_required`
    round whose sampling the proxy did (or whose approval it asked). Without a shared
    `--request-state-key` no other replica knows that state, so during the drain it is served
    here rather than refused (503): the Claude call made for the round is not wasted."""
    params = request.get("params")
    return (
        request.get("method") in protocol.INPUT_REQUIRED_METHODS
        and isinstance(params, dict)
        and stash_token(params) is not None
    )


def _is_message(decoded: Any) -> bool:
    """A JSON-RPC 2.0 request or notification. Without `"jsonrpc": "2.0"` the SDK's server refuses
    it (-32600), and a stdio upstream drops the line unanswered: relayed, it would leave its POST
    open for ever (and its hub busy, never reaped)."""
    return (
        isinstance(decoded, dict)
        and decoded.get("jsonrpc") == "2.0"
        and isinstance(decoded.get("method"), str)
    )


def _is_notification(decoded: Any) -> bool:
    return _is_message(decoded) and "id" not in decoded


def _reject(call: HttpCall, request: dict[str, Any]) -> InboundLadderRejection | None:
    """The SDK server's checks of a 2026-07-28 request's envelope and routing headers."""
    from mcp.shared.inbound import (
        InboundLadderRejection,
        classify_inbound_request,
        find_duplicated_routing_header,
    )
    from mcp_types.jsonrpc import HEADER_MISMATCH

    items = call.header_items()
    duplicated = find_duplicated_routing_header(items)
    if duplicated is not None:
        message = f"{duplicated} header appears more than once"
        return InboundLadderRejection(code=HEADER_MISMATCH, message=message)
    verdict = classify_inbound_request(
        request, headers=dict(items), supported_modern_versions=SUPPORTED_STATELESS_VERSIONS
    )
    return verdict if isinstance(verdict, InboundLadderRejection) else None


async def _param_rejection(
    call: HttpCall, mux: MuxChannel, request: dict[str, Any]
) -> InboundLadderRejection | None:
    """The SDK server's check of a `tools/call`'s `Mcp-Param-*` headers against its arguments."""
    params = request.get("params")
    if request["method"] != protocol.TOOLS_CALL or not isinstance(params, dict):
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict | None):
        return None
    if not arguments and not any(key.startswith(protocol.PARAM_HEADER_PREFIX) for key in call.headers):
        return None  # nothing a declaration could disagree with
    tools = mux.tools
    if not (tools.knows(name) or tools.complete):
        await _list_tools(mux, name, params)
    schema = tools.schema_of(name)
    if schema is None:
        return None
    from mcp.shared.inbound import validate_mcp_param_headers
    from starlette.datastructures import Headers  # its `items()` keeps repeated lines, as the SDK's

    return validate_mcp_param_headers(schema, arguments or {}, Headers(scope=call.scope))


async def _list_tools(mux: MuxChannel, name: str, params: dict[str, Any]) -> None:
    """List the upstream's tools (the mux keeps their schemas) until `name` is among them, under the
    calling request's envelope; gives up quietly, leaving the call unchecked."""
    meta = params.get("_meta")
    meta = meta if isinstance(meta, dict) else {}
    envelope = {k: v for k, v in meta.items() if k.startswith(protocol.ENVELOPE_PREFIX)}
    list_params: dict[str, Any] = {"_meta": envelope}
    deadline = anyio.current_time() + OWN_LIST_SECONDS
    for _ in range(LIST_PAGE_CAP):
        left = deadline - anyio.current_time()
        if left <= 0:
            log.warning("tools listing too slow; Mcp-Param-* headers not checked")
            return
        result = await mux.own_request(protocol.TOOLS_LIST, list_params, left)
        cursor = result.get("nextCursor") if isinstance(result, dict) else None
        if mux.tools.knows(name) or not isinstance(cursor, str):
            return
        list_params = {**list_params, "cursor": cursor}
    log.warning("tools listing without end; Mcp-Param-* headers not checked", extra={"pages": LIST_PAGE_CAP})


async def _write_rejection(call: HttpCall, rejection: InboundLadderRejection, request_id: Any) -> None:
    from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

    error = jsonrpc.error_response(request_id, rejection.code, rejection.message, rejection.data)
    body = jsonrpc.encode(error)
    await call.respond(ERROR_CODE_HTTP_STATUS.get(rejection.code, 400), body, protocol.JSON_TYPE)


def _status_of(answer: bytes) -> int:
    """The SDK's HTTP status for a JSON answer: 200, or the table's status for an error's code."""
    from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

    try:
        message = json.loads(answer)
    except ValueError:
        return 200
    error = message.get("error") if isinstance(message, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return ERROR_CODE_HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200
