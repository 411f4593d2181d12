"""The 2026-07-28 hubs: one upstream per client identity, at most `max_upstreams` with the handshake
sessions', idle ones make room."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import pytest

from mcp_backfill.relay import Relay
from mcp_backfill.relay.input_required import Stash
from mcp_backfill.sidecar.stateless import StatelessHub, StatelessHubs
from mcp_backfill.sidecar.upstreams import UpstreamRequest
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_mux import MuxChannel

pytestmark = pytest.mark.anyio


class Rounds:
    """The relay's round driver, as far as a hub sees it: the stash of the proxy's answers."""

    def __init__(self) -> None:
        self.stash: Any = Stash(ttl=300)

    def adopt(self, stash: Any) -> None:
        self.stash = stash


class IdleRelay:
    """Stands in for the relay between a hub's mux and its upstream: runs until cancelled."""

    def __init__(self) -> None:
        self.rounds = Rounds()

    async def run(self, on_client_closed: Callable[[], Any]) -> None:
        await anyio.sleep_forever()

    async def fail_pending(self, reason: str) -> None:
        pass


class Upstreams:
    """Opens an upstream per identity (named by the `who` header); those in `slow` wait for `go`."""

    def __init__(self, *slow: str) -> None:
        self.slow = set(slow)
        self.starting = anyio.Event()
        self.go = anyio.Event()
        self.open: set[str] = set()

    @asynccontextmanager
    async def __call__(self, request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
        who = request.client_headers["who"]
        if who in self.slow:
            self.starting.set()
            await self.go.wait()
        self.open.add(who)
        try:
            yield cast(MessageChannel, object())
        finally:
            self.open.discard(who)


def make_hubs(upstreams: Upstreams, max_hubs: int, sessions: int = 0) -> StatelessHubs:
    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, IdleRelay())

    return StatelessHubs(
        lambda identity: StatelessHub(upstreams, make_relay, lambda direction: None, identity),
        max_upstreams=max_hubs,
        idle_timeout=0,
        others=lambda: sessions,
    )


async def mux_for(hubs: StatelessHubs, who: str) -> MuxChannel | None:
    return await hubs.mux(lambda: {"who": who}, who)


async def test_an_idle_hub_makes_room_for_a_new_client() -> None:
    upstreams = Upstreams()
    hubs = make_hubs(upstreams, max_hubs=1)
    async with anyio.create_task_group() as tg:
        hubs.start(tg)
        assert await mux_for(hubs, "alice") is not None
        assert await mux_for(hubs, "bob") is not None
        await anyio.wait_all_tasks_blocked()
        assert upstreams.open == {"bob"}
        tg.cancel_scope.cancel()


async def test_a_hub_whose_upstream_is_starting_is_busy_not_idle() -> None:
    """Alice's first request waits for her upstream to start; Bob's, arriving meanwhile with every
    hub taken, used to stop her hub as idle: her request failed (500) and her half-started upstream
    was torn down. Now Bob is told to come back (the caller's 503) and Alice gets her upstream."""
    upstreams = Upstreams("alice")
    hubs = make_hubs(upstreams, max_hubs=1)
    alices: list[MuxChannel | None] = []

    async def alice() -> None:
        alices.append(await mux_for(hubs, "alice"))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            tg.start_soon(alice)
            await upstreams.starting.wait()
            assert hubs.in_flight == 1
            assert await mux_for(hubs, "bob") is None
            upstreams.go.set()
            while not alices:
                await anyio.sleep(0.01)
            [mux] = alices
            assert mux is not None
            assert not mux.closed
            assert upstreams.open == {"alice"}
            assert hubs.in_flight == 0  # started: Alice's request is the mux's to count now
            tg.cancel_scope.cancel()


async def test_handshake_sessions_count_against_the_hubs_limit() -> None:
    """`--max-sessions` counts upstreams of both kinds (each kind used to get all of it): with every
    slot taken by sessions a 2026-07-28 client is refused (the caller's 503); with one left, new
    clients take turns in it, and a new session can have an idle hub stopped to make room."""
    full = make_hubs(Upstreams(), max_hubs=2, sessions=2)
    upstreams = Upstreams()
    hubs = make_hubs(upstreams, max_hubs=2, sessions=1)
    async with anyio.create_task_group() as tg:
        full.start(tg)
        hubs.start(tg)
        assert await mux_for(full, "alice") is None
        assert len(full) == 0
        assert await mux_for(hubs, "alice") is not None
        assert await mux_for(hubs, "bob") is not None  # Alice's hub is idle: it makes room
        await anyio.wait_all_tasks_blocked()
        assert upstreams.open == {"bob"}
        assert await hubs.make_room()  # for a new session
        assert len(hubs) == 0
        assert not await hubs.make_room()
        tg.cancel_scope.cancel()


class EndingRelay:
    """The relay of an upstream that closes its output when `end` is set."""

    def __init__(self, end: anyio.Event) -> None:
        self._end = end
        self.rounds = Rounds()

    async def run(self, on_client_closed: Callable[[], Any]) -> None:
        await self._end.wait()

    async def fail_pending(self, reason: str) -> None:
        pass


class SlowToExit:
    """Upstreams that take until `exited` is set to stop once they have closed their output."""

    def __init__(self) -> None:
        self.running = 0
        self.started = 0
        self.most = 0
        self.exited = anyio.Event()

    @asynccontextmanager
    async def __call__(self, request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
        self.running += 1
        self.started += 1
        self.most = max(self.most, self.running)
        try:
            yield cast(MessageChannel, object())
            await self.exited.wait()
        finally:
            self.running -= 1


async def test_a_restarted_hub_waits_for_its_old_upstream_to_stop() -> None:
    """The upstream closed its output but took time to exit; the next request used to start a new
    one beside it (two processes for one hub, past --max-sessions), and the hub said it was stopped
    once the new one was, the old one still running."""
    upstreams = SlowToExit()
    ends = [anyio.Event(), anyio.Event()]

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, EndingRelay(ends[upstreams.started - 1]))

    hub = StatelessHub(upstreams, make_relay, lambda direction: None, "alice")
    got: list[MuxChannel] = []

    async def request() -> None:
        mux = await hub.mux(lambda: {})
        assert mux is not None
        got.append(mux)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hub.start(tg)
            first = await hub.mux(lambda: {})
            assert first is not None
            ends[0].set()  # the upstream closes its output, and takes its time to exit
            while not first.closed:
                await anyio.sleep(0.01)
            tg.start_soon(request)
            await anyio.wait_all_tasks_blocked()
            assert upstreams.running == 1, "a new upstream started beside the one still stopping"
            assert not got
            assert hub.busy  # the request waits: the hub is not idle meanwhile
            upstreams.exited.set()
            while not got:
                await anyio.sleep(0.01)
            assert upstreams.most == 1
            assert not got[0].closed
            assert not hub.stopped
            tg.cancel_scope.cancel()


async def test_a_request_waiting_for_the_old_upstream_to_stop_is_let_go_when_the_drain_ends() -> None:
    upstreams = SlowToExit()
    ends = [anyio.Event()]

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, EndingRelay(ends[upstreams.started - 1]))

    hub = StatelessHub(upstreams, make_relay, lambda direction: None, "alice")
    got: list[MuxChannel] = []

    async def request() -> None:
        mux = await hub.mux(lambda: {})
        assert mux is not None
        got.append(mux)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hub.start(tg)
            first = await hub.mux(lambda: {})
            assert first is not None
            ends[0].set()
            while not first.closed:
                await anyio.sleep(0.01)
            tg.start_soon(request)
            await anyio.wait_all_tasks_blocked()
            hub.shut_down("mcp-backfill is shutting down")
            while not got:
                await anyio.sleep(0.01)
            assert got[0].closed  # answered at once (the front tells the client the drain is over)
            assert upstreams.started == 1
            upstreams.exited.set()
            tg.cancel_scope.cancel()


async def test_no_upstream_starts_once_the_drain_has_begun() -> None:
    """A 2026-07-28 request that began before the drain waited for its hub's old upstream (which had
    closed its output) to exit, then started a new one during the drain: the front answered the
    request 503 and the new upstream ran, for nothing, until `serve` stopped. Now a hub starts none
    while the drain lasts (the front's 503 stands), nor is a hub made for a new client."""
    upstreams = SlowToExit()
    ends = [anyio.Event(), anyio.Event()]

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, EndingRelay(ends[upstreams.started - 1]))

    hubs = StatelessHubs(
        lambda identity: StatelessHub(upstreams, make_relay, lambda direction: None, identity),
        max_upstreams=2,
        idle_timeout=0,
    )
    got: list[MuxChannel | None] = []

    async def request() -> None:
        got.append(await mux_for(hubs, "alice"))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            hubs.start(tg)
            first = await mux_for(hubs, "alice")
            assert first is not None
            ends[0].set()  # the upstream closes its output, and takes its time to exit
            while not first.closed:
                await anyio.sleep(0.01)
            tg.start_soon(request)
            await anyio.wait_all_tasks_blocked()
            hubs.drain()
            upstreams.exited.set()
            while not got:
                await anyio.sleep(0.01)
            await anyio.wait_all_tasks_blocked()
            assert got == [None]
            assert upstreams.started == 1, "an upstream started during the drain"
            assert await mux_for(hubs, "bob") is None
            assert upstreams.started == 1
            assert len(hubs) == 1
            tg.cancel_scope.cancel()


async def test_a_stopped_hubs_answers_still_waiting_go_to_the_clients_next_hub() -> None:
    """The proxy's answers to a mixed round (paid for) wait for the client's retry in the stash of
    its hub's relay: a hub stopped to make room took them along, and the retry found nothing. Now
    the client's next hub takes the stash over; an empty one is not kept."""
    upstreams = Upstreams()
    hubs = make_hubs(upstreams, max_hubs=1)
    async with anyio.create_task_group() as tg:
        hubs.start(tg)
        assert await mux_for(hubs, "alice") is not None
        await anyio.wait_all_tasks_blocked()
        alices = hubs._hubs["alice"].stash
        assert isinstance(alices, Stash)
        token = alices.put({"ask": {"role": "assistant"}}, False, None, 1)
        assert await mux_for(hubs, "bob") is not None  # Alice's idle hub makes room
        await anyio.wait_all_tasks_blocked()
        assert await mux_for(hubs, "alice") is not None  # and Bob's for hers
        await anyio.wait_all_tasks_blocked()
        assert hubs._hubs["alice"].stash is alices
        stashed = alices.take(token)
        assert stashed is not None
        assert stashed.answers == {"ask": {"role": "assistant"}}
        assert await mux_for(hubs, "bob") is not None
        await anyio.wait_all_tasks_blocked()
        assert "alice" not in hubs._stashes  # nothing left in it
        tg.cancel_scope.cancel()


async def test_a_stopped_hubs_approval_question_expires_on_time() -> None:
    """A round's approval question open in the stash of a hub stopped to make room: its relay, which
    would have refused its sampling request when the time was up, is gone. The expiry is heard on
    time all the same (the refusal, its audit line); it was heard only when a later hub stopped."""
    upstreams = Upstreams()
    hubs = make_hubs(upstreams, max_hubs=1)
    expired: list[str] = []
    async with anyio.create_task_group() as tg:
        hubs.start(tg)
        assert await mux_for(hubs, "alice") is not None
        await anyio.wait_all_tasks_blocked()
        alices = hubs._hubs["alice"].stash
        assert isinstance(alices, Stash)
        alices.expired = lambda token, entry: expired.append(token)
        token = alices.put({}, False, None, 1, pending={"q": {"messages": []}}, ttl=0.2)
        assert await mux_for(hubs, "bob") is not None  # Alice's idle hub makes room
        with anyio.fail_after(10):
            while not expired:
                await anyio.sleep(0.02)
        assert expired == [token]
        tg.cancel_scope.cancel()


async def test_approval_questions_open_when_serve_stops_are_given_up() -> None:
    """`serve` stops: the approval questions still open, in a hub's stash or in that of a hub
    stopped before, are let go and heard of (their sampling requests get their audit lines)."""
    upstreams = Upstreams()
    hubs = make_hubs(upstreams, max_hubs=1)
    abandoned: list[str] = []
    async with anyio.create_task_group() as tg:
        hubs.start(tg)
        tokens = []
        for who in ("alice", "bob"):
            assert await mux_for(hubs, who) is not None  # Bob's makes Alice's hub stop
            await anyio.wait_all_tasks_blocked()
            stash = hubs._hubs[who].stash
            assert isinstance(stash, Stash)
            stash.abandoned = lambda token, entry: abandoned.append(token)
            tokens.append(stash.put({}, False, None, 1, pending={"q": {"messages": []}}, ttl=300))
        hubs.stop()
        assert sorted(abandoned) == sorted(tokens)
        tg.cancel_scope.cancel()


async def test_an_approval_question_expires_on_time_after_the_hubs_upstream_exited() -> None:
    """The hub's upstream exits while a round's approval question is open in its stash: the relay,
    which watched it, is gone, and the hub waits for the client's next request. The expiry is
    heard on time all the same (the refusal, its audit line), not only when a request came again."""
    ended = anyio.Event()

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        return cast(Relay, EndingRelay(ended))

    hubs = StatelessHubs(
        lambda identity: StatelessHub(Upstreams(), make_relay, lambda direction: None, identity),
        max_upstreams=1,
        idle_timeout=0,
        others=lambda: 0,
    )
    expired: list[str] = []
    async with anyio.create_task_group() as tg:
        hubs.start(tg)
        assert await mux_for(hubs, "alice") is not None
        await anyio.wait_all_tasks_blocked()
        stash = hubs._hubs["alice"].stash
        assert isinstance(stash, Stash)
        stash.expired = lambda token, entry: expired.append(token)
        token = stash.put({}, False, None, 1, pending={"q": {"messages": []}}, ttl=0.3)
        ended.set()  # the upstream exits; the hub stays, its stash kept for the client's next request
        with anyio.fail_after(10):
            while not expired:
                await anyio.sleep(0.02)
        assert expired == [token]
        tg.cancel_scope.cancel()
