"""The sidecar's ASGI application as a whole: what it counts in `/metrics`, and requests caught
by the drain."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import anyio
import pytest

from mcp_backfill.relay import Relay
from mcp_backfill.sidecar.app import SidecarApp, always_ready
from mcp_backfill.sidecar.handshake import HandshakeFront
from mcp_backfill.sidecar.http_io import FrontSettings
from mcp_backfill.sidecar.metrics import Metrics
from mcp_backfill.sidecar.security import ANONYMOUS, AccessPolicy
from mcp_backfill.sidecar.sessions import SessionSettings, SessionTable
from mcp_backfill.sidecar.stateless import HUB_BUFFER_BYTES, StatelessFront, StatelessHub, StatelessHubs
from mcp_backfill.sidecar.upstreams import UpstreamRequest
from mcp_backfill.transports import event_stream
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_server import MAX_OPEN_POSTS
from tests.unit.test_stateless_hubs import IdleRelay, Upstreams

pytestmark = pytest.mark.anyio


def _unused(*args: Any) -> Any:
    raise AssertionError("no upstream is opened here")


def sidecar_app(readiness: Any) -> tuple[SidecarApp, Metrics]:
    settings = FrontSettings(1024)
    sessions = SessionTable(1, SessionSettings(0, 1), _unused, _unused, lambda direction: None)
    hubs = StatelessHubs(_unused, max_upstreams=1, idle_timeout=0)
    metrics = Metrics()
    policy = AccessPolicy(allowed_hosts=("127.0.0.1:8080",), allowed_origins=())
    app = SidecarApp(
        policy, HandshakeFront(sessions, settings), StatelessFront(hubs, settings), metrics, readiness
    )
    return app, metrics


async def test_a_request_that_fails_inside_the_sidecar_counts_as_a_500_not_as_a_client_gone() -> None:
    """An exception out of a handler (uvicorn answers it with a 500) was counted as status 499, "the
    client went away", so the 5xx alert of deploy/observability never saw the sidecar's own failures."""

    async def broken() -> tuple[bool, dict[str, Any]]:
        raise RuntimeError("the store's client broke")

    app, metrics = sidecar_app(broken)
    scope = {"type": "http", "method": "GET", "path": "/readyz", "headers": [(b"host", b"127.0.0.1:8080")]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        raise AssertionError(f"nothing is sent before the failure: {message}")

    with pytest.raises(RuntimeError):
        await app(scope, receive, send)
    assert 'mcp_backfill_http_requests_total{method="GET",status="500"} 1' in metrics.render()


class Answer:
    """What an in-process request to the app got."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""


async def post(
    app: SidecarApp, body: dict[str, Any], headers: dict[str, str], answer: Answer, stall: bool = False
) -> None:
    """POST `body`; with `stall`, the client reads nothing of the response after its headers."""
    raw = [(b"host", b"127.0.0.1:8080"), *((k.encode(), v.encode()) for k, v in headers.items())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": raw}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await anyio.sleep_forever()
        sent = True
        return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
        elif stall:
            await anyio.sleep_forever()
        else:
            answer.body += message.get("body", b"")

    await app(scope, receive, send)


JSON_POST = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_a_session_waiting_for_room_when_the_drain_begins_is_not_opened() -> None:
    """Every upstream was taken; the opening waited for an idle one to stop, and the drain began
    meanwhile. The session used to open (its upstream started) under the drain: it gets the 503 of
    an opening that arrives during the drain instead."""
    taken = [1]
    asked, go = anyio.Event(), anyio.Event()
    opened: list[Any] = []

    async def make_room() -> bool:
        asked.set()
        await go.wait()
        taken[0] = 0
        return True

    def open_upstream(request: Any) -> Any:
        opened.append(request)
        raise RuntimeError("no upstream in this test")

    settings = FrontSettings(1024)
    sessions = SessionTable(
        1,
        SessionSettings(0, 1),
        open_upstream,
        _unused,
        lambda direction: None,
        others=lambda: taken[0],
        make_room=make_room,
    )
    hubs = StatelessHubs(_unused, max_upstreams=1, idle_timeout=0)
    policy = AccessPolicy(allowed_hosts=("127.0.0.1:8080",), allowed_origins=())
    app = SidecarApp(
        policy, HandshakeFront(sessions, settings), StatelessFront(hubs, settings), Metrics(), always_ready
    )
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    answer = Answer()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            sessions.start(tg)
            hubs.start(tg)
            tg.start_soon(post, app, initialize, JSON_POST, answer)
            await asked.wait()
            app.drain()
            go.set()
            with anyio.move_on_after(5):
                while answer.status is None:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert answer.status == 503, answer.body
    assert b"shutting down" in answer.body
    assert not opened
    assert len(sessions) == 0


async def test_a_2026_request_whose_upstream_starts_when_the_drain_begins_gets_the_drains_503() -> None:
    """A 2026-07-28 request waited for its hub's upstream to start, and the drain began meanwhile:
    it was relayed all the same (a request arriving then gets 503)."""
    upstreams = Upstreams("alice")
    app, hubs = stateless_app(FrontSettings(1024), upstreams)
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    }
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": meta}}
    headers = {**JSON_POST, "mcp-protocol-version": "2026-07-28", "mcp-method": "ping", "who": "alice"}
    answer = Answer()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            tg.start_soon(post, app, ping, headers, answer)
            await upstreams.starting.wait()
            app.drain()
            upstreams.go.set()
            with anyio.move_on_after(5):
                while answer.status is None:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert answer.status == 503, answer.body
    assert b"shutting down" in answer.body


def stateless_app(
    settings: FrontSettings, upstreams: Upstreams | None = None
) -> tuple[SidecarApp, StatelessHubs]:
    """A sidecar app whose 2026-07-28 hubs start `upstreams` (a fresh `Upstreams()` by default), one
    at a time, with relays that never answer."""
    started = upstreams if upstreams is not None else Upstreams()

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, IdleRelay())

    sessions = SessionTable(1, SessionSettings(0, 1), _unused, _unused, lambda direction: None)
    hubs = StatelessHubs(
        lambda identity: StatelessHub(started, make_relay, lambda direction: None, identity),
        max_upstreams=1,
        idle_timeout=0,
    )
    policy = AccessPolicy(allowed_hosts=("127.0.0.1:8080",), allowed_origins=())
    app = SidecarApp(
        policy, HandshakeFront(sessions, settings), StatelessFront(hubs, settings), Metrics(), always_ready
    )
    return app, hubs


def ping_2026(request_id: int) -> tuple[dict[str, Any], dict[str, str]]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
        "progressToken": request_id,
    }
    body = {"jsonrpc": "2.0", "id": request_id, "method": "ping", "params": {"_meta": meta}}
    return body, {**JSON_POST, "mcp-protocol-version": "2026-07-28", "mcp-method": "ping", "who": "alice"}


async def test_one_identity_may_have_more_2026_requests_in_flight_than_a_session_has_posts() -> None:
    """Every caller of a sidecar without tokens (and every holder of `--auth-token`) is one identity,
    so one hub: a limit of 256 requests in flight per hub, as a session has for its POSTs, refused a
    thousand users' requests with 429 (the benchmark's 1,000 clients: 16,366 errors). What a hub's
    requests may hold is bounded by bytes; how many there are, by `--max-connections`."""
    app, hubs = stateless_app(FrontSettings(1024))
    count = MAX_OPEN_POSTS + 44
    answers = [Answer() for _ in range(count)]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            for n, answer in enumerate(answers):  # one by one: each finds the others in flight
                tg.start_soon(post, app, *ping_2026(n), answer)
                while hubs.in_flight <= n and answer.status is None:
                    await anyio.sleep(0.001)
            reached = hubs.in_flight
            tg.cancel_scope.cancel()
    assert [answer.body for answer in answers if answer.status is not None] == []
    assert reached == count


async def test_a_2026_client_whose_answers_pile_up_unread_gets_429_for_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests whose readers stopped reading each hold up to 8 MiB of their answers; past 32 MiB
    held for one client, its next request is refused (429) rather than let it hold more. (Each
    notification's sender then waits for its stalled reader: they are sent side by side, as one
    after another they would each take that long. The wait is made longer than the test: a reader
    given up on after the usual `STALL_SECONDS` no longer has its answers kept whatever the limits,
    and on a loaded machine, in CI, the test once waited its whole bound for the 32 MiB after two
    readers had been given up on.)"""
    monkeypatch.setattr(event_stream, "STALL_SECONDS", 600.0)
    app, hubs = stateless_app(FrontSettings(1024, json_window=0.0))
    stalled = [Answer() for _ in range(5)]
    excess = Answer()
    chunk = "x" * (7 * 1024 * 1024)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            for n, answer in enumerate(stalled, start=1):
                tg.start_soon(post, app, *ping_2026(n), answer, True)
            while hubs.in_flight < len(stalled):
                await anyio.sleep(0.01)
            mux = await hubs.mux(dict, ANONYMOUS)
            assert mux is not None
            for mux_id in range(1, len(stalled) + 1):  # each request's own progress notification
                progress = {"progressToken": mux_id, "progress": 1, "message": chunk}
                message = {"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}
                tg.start_soon(mux.send, json.dumps(message).encode())
            while any(answer.status is None for answer in stalled):
                await anyio.sleep(0.01)
            while mux.buffered_bytes < HUB_BUFFER_BYTES:  # on a loaded machine the notes come later
                await anyio.sleep(0.01)
            with anyio.move_on_after(5):
                await post(app, *ping_2026(99), excess)
            tg.cancel_scope.cancel()
    assert excess.status == 429, excess.body
    assert b"MiB" in excess.body


async def test_a_2026_request_whose_upstream_is_starting_when_the_drain_ends_is_answered() -> None:
    """The drain timed out while a 2026-07-28 request waited for its hub's upstream to start: the
    start was cancelled, anyio's `start` raised ("child exited without calling started") and the
    request ended in a bare 500 with a traceback, not the answer the others get."""
    upstreams = Upstreams("alice")
    app, hubs = stateless_app(FrontSettings(1024), upstreams)
    answer = Answer()
    failures: list[BaseException] = []

    async def request() -> None:
        try:
            await post(app, *ping_2026(1), answer)
        except Exception as exc:
            failures.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            tg.start_soon(request)
            await upstreams.starting.wait()
            app.drain()
            app.end_requests()
            with anyio.move_on_after(5):
                while answer.status is None and not failures:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert not failures
    assert answer.status in (200, 503), answer.body
    assert b"shutting down" in answer.body
    assert not upstreams.open


class SlowToStop:
    """Upstreams of which `slow` takes until `exited` is set to stop (as a child that ignores its
    closed stdin until SIGKILL): the wait for it is shielded, as the real one is."""

    def __init__(self, *slow: str) -> None:
        self.slow = set(slow)
        self.stopping = 0
        self.exited = anyio.Event()

    @asynccontextmanager
    async def __call__(self, request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
        try:
            yield cast(MessageChannel, object())
        finally:
            if request.client_headers.get("who") in self.slow:
                self.stopping += 1
                with anyio.CancelScope(shield=True):
                    await self.exited.wait()


async def test_a_request_waiting_for_room_when_the_drain_ends_is_answered_at_once() -> None:
    """Every upstream was taken; a 2026-07-28 request of Alice's waited for Bob's idle one to stop
    (up to 3 x --shutdown-grace + 1 s), and a session opening for Carol's likewise. When the drain ended they
    kept waiting, past the second requests in flight get to answer, and were cut off by uvicorn
    without an answer. They now get the drain's 503 at once."""
    upstreams = SlowToStop("bob", "carol")

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, IdleRelay())

    settings = FrontSettings(1024)
    hubs = StatelessHubs(
        lambda identity: StatelessHub(upstreams, make_relay, lambda direction: None, identity),
        max_upstreams=2,
        idle_timeout=0,
        stop_timeout=60,
    )
    sessions = SessionTable(
        2,
        SessionSettings(0, 1),
        _unused,
        _unused,
        lambda direction: None,
        others=lambda: hubs.upstreams,
        make_room=hubs.make_room,
    )
    policy = AccessPolicy(allowed_hosts=("127.0.0.1:8080",), allowed_origins=())
    app = SidecarApp(
        policy, HandshakeFront(sessions, settings), StatelessFront(hubs, settings), Metrics(), always_ready
    )
    alice, opening = Answer(), Answer()
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            sessions.start(tg)
            try:
                for who in ("bob", "carol"):  # idle from now on
                    assert await hubs.mux(partial(dict, who=who), who) is not None
                body, headers = ping_2026(1)
                tg.start_soon(post, app, body, headers, alice)
                while upstreams.stopping < 1:  # Alice's request stops Bob's hub to make room
                    await anyio.sleep(0.01)
                tg.start_soon(post, app, initialize, JSON_POST, opening)
                while upstreams.stopping < 2:  # the opening stops Carol's
                    await anyio.sleep(0.01)
                app.drain()
                app.end_requests()
                with anyio.move_on_after(5):
                    while alice.status is None or opening.status is None:
                        await anyio.sleep(0.01)
            finally:
                upstreams.exited.set()
                tg.cancel_scope.cancel()
    for answer in (alice, opening):
        assert answer.status == 503, answer.body
        assert b"shutting down" in answer.body
