"""The `LedgerStore` contract, run against every backend: memory, a SQLite file, a real Redis.

Each store must check and reserve in one step, settle into every window, admit against several rate
limits at once or not at all, cap slots, and (when shared) let the leases of a holder that stopped
renewing them lapse. Two store objects on one file or server stand for two processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.credentials import hide_url_credentials
from mcp_backfill.errors import ConfigError, StoreUnavailable
from mcp_backfill.options import Allowance
from mcp_backfill.relay.input_required import SealedStash, request_state_key
from mcp_backfill.sampling.spend import Spend, SpendSettings
from mcp_backfill.sampling.store import (
    LAPSED_MEMORY_SECONDS,
    Held,
    LedgerStore,
    Limit,
    MemoryStore,
    Rate,
    exhausted,
)
from mcp_backfill.stores import open_store
from mcp_backfill.stores.redis import RedisStore
from mcp_backfill.stores.sqlite import SqliteStore
from tests.services import redis_server

pytestmark = pytest.mark.anyio

Factory = Callable[..., LedgerStore]


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """Makes stores of one backend that share their counts (for memory: the same object)."""
    made: list[LedgerStore] = []
    if request.param == "memory":
        memory = MemoryStore()
        yield lambda **_: memory
    elif request.param == "sqlite":

        def sqlite(**options: Any) -> LedgerStore:
            made.append(SqliteStore(str(tmp_path / "ledger.db"), **options))
            return made[-1]

        yield sqlite
    else:
        async with redis_server() as server:

            def redis(**options: Any) -> LedgerStore:
                made.append(RedisStore(server.url, **options))
                return made[-1]

            try:
                yield redis
            finally:
                for store in made:
                    await store.aclose()
    for store in made:
        await store.aclose()


DAY = Limit("client:alice", (Allowance(100), Allowance(50, "day")))
PROCESS = Limit("process", (Allowance(1000),))


async def test_a_reservation_is_held_until_settled_and_then_charged(stores: Factory) -> None:
    store = stores()
    standing = await store.reserve([DAY, PROCESS], "a", 30)
    assert standing.admitted
    assert (standing.used, standing.reserved) == (((0, 0), (0,)), (0, 0))
    standing = await store.reserve([DAY, PROCESS], "", 0)  # a check
    assert standing.reserved == (30, 30)
    await store.settle([DAY, PROCESS], "a", 12)
    standing = await store.reserve([DAY, PROCESS], "", 0)
    assert (standing.used, standing.reserved) == (((12, 12), (12,)), (0, 0))


async def test_admits_while_some_of_every_allowance_is_neither_used_nor_reserved(stores: Factory) -> None:
    store = stores()
    await store.reserve([DAY], "a", 20)
    await store.settle([DAY], "a", 20)
    assert (await store.reserve([DAY], "b", 30)).admitted  # 20 used < 50 a day: admitted, and now full
    refused = await store.reserve([DAY, PROCESS], "c", 5)
    assert not refused.admitted
    assert exhausted([DAY, PROCESS], refused.used, refused.reserved) == (0, 1)
    assert (await store.reserve([PROCESS], "", 0)).reserved == (0,)  # a refusal reserves nowhere


async def test_two_processes_cannot_both_take_the_last_tokens(stores: Factory) -> None:
    first, second = stores(), stores()
    budget = Limit("client:bob", (Allowance(100),))
    admitted: list[str] = []

    async def reserve(store: LedgerStore, lease: str) -> None:
        if (await store.reserve([budget], lease, 10)).admitted:
            admitted.append(lease)

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(reserve, (first, second)[n % 2], f"lease-{n}")
    assert len(admitted) == 10  # 10 x 10 reserved fill the budget: nobody got past it


async def test_a_key_is_claimed_once_among_all_who_share_the_store_until_its_time(stores: Factory) -> None:
    """A sealed approval token redeems once whichever replica takes the retry (`Spend.claim_once`)."""
    first, second = stores(), stores()
    until = time.time() + 0.6
    claimed: list[str] = []

    async def claim(store: LedgerStore, claimant: str) -> None:
        if await store.claim("sealed:n1", claimant, until):
            claimed.append(claimant)

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(claim, (first, second)[n % 2], f"replica-{n}")
    assert len(claimed) == 1
    # The winner asking again (a reply lost, the claim re-sent) is still the winner.
    assert await second.claim("sealed:n1", claimed[0], until)
    assert await first.claim("sealed:n2", "replica-0", until)  # another key: its own claim
    await anyio.sleep(max(0.0, until - time.time()) + 0.2)
    assert await second.claim("sealed:n1", "replica-1", time.time() + 60)  # expired: claimable again


async def hit(store: LedgerStore, rates: list[Rate], member: str, limits: Sequence[Limit] = ()) -> Any:
    standing, refusal = await store.admit(limits, rates, member)
    return refusal if standing.admitted else "budget"


async def test_admission_takes_every_rate_limit_or_none(stores: Factory) -> None:
    store = stores()
    client, process = Rate("client:alice", 2), Rate("process", 3)
    assert await hit(store, [client, process], "1") is None
    assert await hit(store, [client, process], "2") is None
    refusal = await hit(store, [client, process], "3")
    assert refusal is not None
    assert refusal.index == 0
    assert 0 < refusal.retry_after <= 60
    # Alice's refusal counted nowhere: the process has room for one more.
    assert await hit(store, [Rate("client:bob", 2), process], "4") is None
    refusal = await hit(store, [Rate("client:carol", 2), process], "5")
    assert refusal is not None
    assert refusal.index == 1
    assert await hit(store, [Rate("client:dave", 0)], "6") is None  # 0: no limit


async def test_a_request_its_budget_refuses_takes_no_rate_admission(stores: Factory) -> None:
    store = stores()
    full = Limit("client:erin", (Allowance(10),))
    await store.reserve([full], "a", 1)
    await store.settle([full], "a", 10)
    rate = Rate("client:erin", 1)
    assert await hit(store, [rate], "1", [full]) == "budget"
    assert await hit(store, [rate], "2") is None  # the refused request took no admission


async def test_an_admission_may_hold_its_first_calls_reservation_in_the_same_step(stores: Factory) -> None:
    store = stores()
    rate = Rate("client:frank", 1)
    standing, refusal = await store.admit([DAY, PROCESS], [rate], "1", "a", 30)
    assert (standing.admitted, refusal, standing.reserved) == (True, None, (0, 0))
    assert (await store.reserve([DAY, PROCESS], "", 0)).reserved == (30, 30)
    standing, refusal = await store.admit([DAY, PROCESS], [rate], "2", "b", 40)
    assert refusal is not None  # the rate refused: nothing more held
    assert (await store.reserve([DAY, PROCESS], "", 0)).reserved == (30, 30)
    await store.settle([DAY, PROCESS], "a", 12)  # the lease settles like any reservation
    standing = await store.reserve([DAY, PROCESS], "", 0)
    assert (standing.used, standing.reserved) == (((12, 12), (12,)), (0, 0))
    full = Limit("client:gina", (Allowance(10),))
    await store.reserve([full], "c", 1)
    await store.settle([full], "c", 10)
    standing, refusal = await store.admit([full], [], "3", "d", 5)
    assert not standing.admitted  # the budget refused: nothing held
    assert (await store.reserve([full], "", 0)).reserved == (0,)


async def test_slots_are_capped_and_released(stores: Factory) -> None:
    first, second = stores(), stores()
    assert await first.acquire_slot("client:alice", 2, "h1")
    assert await second.acquire_slot("client:alice", 2, "h2")
    assert not await first.acquire_slot("client:alice", 2, "h3")
    assert await first.acquire_slot("client:bob", 2, "h3")  # another key has its own
    await second.release_slot("client:alice", "h2")
    assert await first.acquire_slot("client:alice", 2, "h3")


@pytest.mark.parametrize("stores", ["sqlite", "redis"], indirect=True)  # memory's end with the process
async def test_a_shared_stores_leases_lapse_unless_renewed(stores: Factory) -> None:
    store = stores(lease_seconds=0.5)
    await store.reserve([DAY], "kept", 5)
    await store.admit([DAY], [], "admission", "dropped", 7)  # held by an admission: a lease too
    assert await store.acquire_slot("client:alice", 1, "holder")
    for _ in range(4):
        await anyio.sleep(0.25)
        await store.renew([Held("reservation", DAY.key, "kept"), Held("slot", "client:alice", "holder")])
    standing = await store.reserve([DAY], "", 0)
    # The renewed one is still held; the other lapsed, and was charged whole: its holder never
    # said what the call cost.
    assert (standing.reserved, standing.used) == ((5,), ((7, 7),))
    assert not await store.acquire_slot("client:alice", 1, "other")
    await anyio.sleep(0.7)
    standing = await store.reserve([DAY], "", 0)
    assert (standing.reserved, standing.used) == ((0,), ((12, 12),))
    assert await store.acquire_slot("client:alice", 1, "other")


@pytest.mark.parametrize("stores", ["sqlite", "redis"], indirect=True)
@pytest.mark.parametrize(("cost", "charged"), [(4, 7), (7, 7), (10, 10)])
async def test_a_late_settlement_after_its_lease_lapsed_is_not_charged_twice(
    stores: Factory, cost: int, charged: int
) -> None:
    """A holder that was only slow (a stalled process, a store it could not reach for a while)
    settles after its reservation lapsed and was charged whole: the call is charged what it cost
    or the reservation, whichever is more, never both."""
    store = stores(lease_seconds=0.3)
    await store.reserve([DAY], "slow", 7)
    await anyio.sleep(0.5)
    standing = await store.reserve([DAY], "", 0)  # collects the lapsed reservation: charged whole
    assert standing.used == ((7, 7),)
    await store.settle([DAY], "slow", cost)
    standing = await store.reserve([DAY], "", 0)
    assert (standing.reserved, standing.used) == ((0,), ((charged, charged),))


@pytest.mark.parametrize("stores", ["redis"], indirect=True)
async def test_a_redis_reservation_that_comes_after_its_release_holds_nothing(stores: Factory) -> None:
    """A request that gave up waiting for its reservation's reply releases it on another connection;
    should the release overtake the reservation, the reservation would lapse and be charged whole."""
    store = stores()
    await store.settle([DAY], "given-up", 0)
    await store.reserve([DAY], "given-up", 30)
    standing = await store.reserve([DAY], "", 0)
    assert (standing.reserved, standing.used) == ((0,), ((0, 0),))


@pytest.mark.parametrize("stores", ["redis"], indirect=True)
async def test_a_redis_admission_that_comes_after_its_release_is_not_rate_counted(stores: Factory) -> None:
    """A request whose admission's reply did not come in time is refused, and releases the
    admission's reservation on another connection; should the release overtake the admission, the
    reservation was not held, but the refused request was counted by the rate limit for a minute."""
    store = stores()
    await store.settle([DAY], "given-up", 0)
    await store.admit([DAY], [Rate("client:alice", 1)], "member-1", "given-up", 30)
    standing, refusal = await store.admit([DAY], [Rate("client:alice", 1)], "member-2")
    assert (refusal, standing.reserved) == (None, (0,))


@pytest.mark.parametrize("stores", ["redis"], indirect=True)
async def test_a_redis_slot_that_comes_after_its_release_is_not_taken(stores: Factory) -> None:
    """A request that gave up waiting for its slot's reply (cancelled, or the reply lost) gives the
    slot back on another connection; should that overtake the acquisition (Redis stalled, then
    serving both connections), the slot was taken after all, and the client had one slot fewer
    until its lease lapsed (30 s), as in the case of a reservation (above)."""
    store = stores()
    await store.release_slot("client:alice", "given-up")
    await store.acquire_slot("client:alice", 1, "given-up")
    assert await store.acquire_slot("client:alice", 1, "another request")


@pytest.mark.parametrize("stores", ["sqlite", "redis"], indirect=True)
async def test_a_dead_replicas_reservation_is_charged_to_every_budget_it_held_whichever_is_read_first(
    stores: Factory,
) -> None:
    """The deployment's budget is charged by the next call of any client, though the one whose call
    it was never comes back; that client's when it does, once."""
    dead, live = stores(lease_seconds=0.3), stores()
    await dead.reserve([DAY, PROCESS], "dead", 7)
    await anyio.sleep(0.5)
    standing = await live.reserve([PROCESS], "", 0)  # another client's call: the deployment's only
    assert (standing.reserved, standing.used) == ((0,), ((7,),))
    standing = await live.reserve([DAY, PROCESS], "", 0)
    assert (standing.reserved, standing.used) == ((0, 0), ((7, 7), (7,)))
    standing = await live.reserve([DAY, PROCESS], "", 0)
    assert standing.used == ((7, 7), (7,))


DAY_SECONDS = 86400.0


async def test_a_sqlite_reservation_that_lapsed_days_ago_is_charged_to_the_window_it_lapsed_in(
    tmp_path: Path,
) -> None:
    """A replica died in a call of alice's, who comes back two days later: its reservation, charged
    whole when her budget is next read, went into that day's window (a call of two days ago
    spending today's budget); it counts in the window it lapsed in, and in her lifetime's."""
    clock = [100 * DAY_SECONDS - 100.0]  # just before a day ends
    dead = SqliteStore(str(tmp_path / "ledger.db"), clock=lambda: clock[0])
    await dead.reserve([DAY, PROCESS], "dead", 7)
    clock[0] += 2 * DAY_SECONDS
    live = SqliteStore(str(tmp_path / "ledger.db"), clock=lambda: clock[0])
    standing = await live.reserve([DAY, PROCESS], "", 0)
    await dead.aclose()
    await live.aclose()
    assert (standing.reserved, standing.used) == ((0, 0), ((7, 0), (7,)))


async def test_a_redis_reservation_that_lapsed_days_ago_is_charged_to_the_window_it_lapsed_in() -> None:
    """As for SQLite; Redis's clock is its own, so the dead replica's reservation is written as it
    left it, its lease expired two days ago."""
    async with redis_server() as server:
        store = RedisStore(server.url)
        raw = aioredis.Redis.from_url(server.url)
        try:
            seconds, micros = await raw.time()
            expired = (seconds - 2 * DAY_SECONDS) * 1000 + micros // 1000
            for payer in (DAY.key, PROCESS.key):
                await raw.zadd(f"mcp-backfill:res:{payer}", {"dead": expired})
                await raw.hset(f"mcp-backfill:resamt:{payer}", "dead", 7)
            standing = await store.reserve([DAY, PROCESS], "", 0)
        finally:
            await raw.aclose()
            await store.aclose()
    assert (standing.reserved, standing.used) == ((0, 0), ((7, 0), (7,)))


async def test_redis_remembers_a_settled_lease_as_long_as_a_lapsed_one() -> None:
    """The store link retries a settlement the store missed until it lands, perhaps after a long
    outage; if the first try had landed (its reply lost), the retry must still find the lease
    settled, or it charges the call again. A lapsed lease is remembered a day for the same reason."""
    async with redis_server() as server:
        store = RedisStore(server.url)
        raw = aioredis.Redis.from_url(server.url)
        try:
            await store.reserve([DAY], "a", 30)
            await store.settle([DAY], "a", 12)
            remembered = await raw.pttl(f"mcp-backfill:settled:{DAY.key}")
        finally:
            await raw.aclose()
            await store.aclose()
    assert remembered >= (LAPSED_MEMORY_SECONDS - 60) * 1000


async def test_a_sqlite_transaction_whose_commit_failed_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else it stays open, and every later operation fails: "cannot start a transaction within a
    transaction"."""

    class CommitFailsOnce(sqlite3.Connection):
        failed = False

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "COMMIT" and not CommitFailsOnce.failed:
                CommitFailsOnce.failed = True
                raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql, *args)

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **kw: connect(*a, **kw, factory=CommitFailsOnce))
    store = SqliteStore(str(tmp_path / "ledger.db"))
    with pytest.raises(StoreUnavailable, match="disk I/O error"):
        await store.reserve([DAY], "a", 30)
    standing = await store.reserve([DAY], "", 0)
    await store.aclose()
    assert standing.reserved == (0,)  # the failed transaction held nothing


async def test_an_unreachable_store_says_so_and_names_itself_without_its_password(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    sqlite = SqliteStore(str(tmp_path / "file" / "ledger.db"))
    with pytest.raises(StoreUnavailable, match=r"sqlite:"):
        await sqlite.reserve([DAY], "", 0)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@127.0.0.1:1/0", "redis://:***@127.0.0.1:1/0"),
        # redis-py takes the password from the query too (and any connection argument, such as
        # the TLS key's passphrase)
        ("redis://127.0.0.1:1/0?password=hunter2", "redis://127.0.0.1:1/0?password=***"),
        (
            "rediss://alice:hunter2@127.0.0.1:1/0?ssl_password=hunter2&db=1",
            "rediss://alice:***@127.0.0.1:1/0?ssl_password=***&db=1",
        ),
    ],
)
async def test_an_unreachable_redis_store_names_itself_without_its_password(url: str, shown: str) -> None:
    closed = RedisStore(url, timeout=0.5)
    with pytest.raises(StoreUnavailable) as caught:
        await closed.reserve([DAY], "", 0)
    await closed.aclose()
    assert "hunter2" not in str(caught.value)
    assert caught.value.store == closed.description == shown


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("memory", lease_seconds=30, timeout=1), MemoryStore)
    assert isinstance(open_store(f"sqlite://{tmp_path}/x.db", lease_seconds=30, timeout=1), SqliteStore)
    with pytest.raises(ConfigError, match="every user can write to"):  # /tmp: another user's files
        open_store("sqlite:///tmp/x.db", lease_seconds=30, timeout=1)
    with pytest.raises(ConfigError, match="MCP_BACKFILL_STATE_STORE"):
        open_store("postgres://db", lease_seconds=30, timeout=1)
    with pytest.raises(ConfigError, match="needs a file"):
        open_store("sqlite://", lease_seconds=30, timeout=1)
    assert hide_url_credentials("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert hide_url_credentials("rediss://h:1/0") == "rediss://h:1/0"


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("redis://user:s3cr#et@127.0.0.1:6379/0", "s3cr#et"),
        ("redis://user:s3cr?et@host/0", "s3cr?et"),
        ("rediss://:pass/word@host:6380/0", "pass/word"),
        ("redis://user:p/a@ss@host/0", "p/a@ss"),
        ("https://user:to#ken@[::1]:8000/mcp", "to#ken"),
    ],
)
def test_a_password_holding_an_unencoded_delimiter_is_hidden(url: str, password: str) -> None:
    """A password with an unencoded `/`, `#` or `?` ends the URL's authority where urllib reads it
    (`user:s3cr` as host and port): `check` showed `--state-store = redis://user:s3cr#et@...` in its
    report (meant to be pasted into a bug report), twice, though the store's own error no longer
    quotes it. Now everything from the colon to the last `@` is hidden."""
    hidden = hide_url_credentials(url)
    assert password not in hidden
    assert password.partition(next(c for c in password if c in "/#?"))[2] not in hidden
    assert ":***@" in hidden


@pytest.mark.parametrize(
    "url",
    [
        "https://h:8443/path@x",
        "https://[::1]/a@b",
        "redis://h:6379/0?client_name=a@b",
        "https://h/mcp?x=1#a:b@c",
    ],
)
def test_an_at_sign_after_a_sound_authority_is_shown(url: str) -> None:
    assert hide_url_credentials(url) == url


def test_a_sqlite_store_is_described_by_the_url_it_was_given(tmp_path: Path) -> None:
    """Its description names it in `/readyz` and store errors: `sqlite:/x` was a file nobody named."""
    for url in (
        f"sqlite://{tmp_path}/x.db",
        f"sqlite://{os.path.relpath(tmp_path)}/y.db",
    ):
        assert open_store(url, lease_seconds=30, timeout=1).description == url


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///var/lib/x.db",
        "sqlite:////var/lib/x.db",
        "sqlite://ledger.db",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_a_url_without_credentials_is_shown_as_written(url: str) -> None:
    """Taken apart and put together again, `sqlite:///var/lib/x.db` came back as `sqlite:/var/lib/x.db`
    (in `check`'s report, the logs and `/readyz`): a file the user never named."""
    assert hide_url_credentials(url) == url
    hidden = hide_url_credentials(f"{url}{'&' if '?' in url else '?'}password=pw")
    assert hidden == f"{url}{'&' if '?' in url else '?'}password=***"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:s3cret@redis:abc/0", "its port is not a number"),
        ("redis://redis:99999/0", "its port is not a number"),
        ("redis://:s3cr/et@redis:6379/0", "its port is not a number"),  # an unencoded / cuts the password
        ("redis://:s3cr#et@redis:6379/0", "must be percent-encoded"),
        ("redis://admin:s3cr?et@redis:6379/0", "its port is not a number"),
        ("redis://redis:6379/0?socket_timeout=abc", "a parameter's value is not one Redis takes"),
        ("redis://redis:6379/0?password=s3cret&sockettimeout=1", "Redis takes no parameter 'sockettimeout'"),
    ],
)
def test_a_redis_url_it_cannot_use_is_a_config_error_without_its_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store(url, lease_seconds=30, timeout=1)
    message = str(caught.value)
    assert message.startswith("--state-store / MCP_BACKFILL_STATE_STORE: ")
    assert problem in message
    assert "s3cr" not in message


@given(
    st.lists(st.lists(st.integers(1, 50), min_size=0, max_size=3), min_size=1, max_size=3),
    st.data(),
)
def test_exhausted_names_the_first_allowance_with_no_room(
    tokens: list[list[int]], data: st.DataObject
) -> None:
    limits = [Limit(f"k{i}", tuple(Allowance(t) for t in each)) for i, each in enumerate(tokens)]
    used = [[data.draw(st.integers(0, 60)) for _ in each] for each in tokens]
    reserved = [data.draw(st.integers(0, 60)) for _ in tokens]
    full = [
        (i, j) for i, each in enumerate(tokens) for j, t in enumerate(each) if used[i][j] + reserved[i] >= t
    ]
    assert exhausted(limits, used, reserved) == (full[0] if full else None)


class LosingReplies:
    """A TCP relay in front of Redis that, when told to, drops the next reply and the connection: the
    command ran, its answer was lost (a network hiccup), and the client sends it again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lose_next = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def upwards() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        task = asyncio.create_task(upwards())
        try:
            while data := await up_reader.read(65536):
                if self.lose_next:
                    self.lose_next = False
                    writer.transport.abort()
                    break
                writer.write(data)
                await writer.drain()
        finally:
            task.cancel()
            up_writer.close()
            writer.close()


SPENT = Limit("client:alice", (Allowance(100_000), Allowance(50_000, "day")))


@asynccontextmanager
async def losing_replies() -> AsyncIterator[tuple[RedisStore, LosingReplies]]:
    """A Redis store behind a `LosingReplies` relay, its scripts loaded (a first run of each)."""
    async with redis_server() as redis:
        relay = LosingReplies(redis.port)
        listener = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0")
        try:
            await store.settle([SPENT], "warm-up", 0)
            await store.reserve([SPENT], "", 0)
            await store.admit([SPENT], [], "warm-up", "", 0)
            yield store, relay
        finally:
            await store.aclose()
            listener.close()


async def test_a_redis_settlement_sent_again_after_its_reply_was_lost_charges_once() -> None:
    """redis-py sends a script again when its reply is lost; the second run found no reservation and
    charged the call in full once more."""
    async with losing_replies() as (store, relay):
        assert (await store.reserve([SPENT], "lease-1", 5000)).admitted
        relay.lose_next = True
        await store.settle([SPENT], "lease-1", 1000)
        standing = await store.reserve([SPENT], "", 0)
    assert standing.used == ((1000, 1000),)


async def test_a_redis_reservation_sent_again_after_its_reply_was_lost_is_not_refused_by_itself() -> None:
    """The second run counted the reservation the first had made for the same lease: the call was
    refused by its own reservation, which nobody settled: it lapsed and was charged whole."""
    async with losing_replies() as (store, relay):
        relay.lose_next = True
        standing = await store.reserve([SPENT], "lease-1", 50_000)  # the whole day's allowance
        assert (standing.admitted, standing.reserved) == (True, (0,))  # as the first run saw it
        await store.settle([SPENT], "lease-1", 1000)
        standing = await store.reserve([SPENT], "", 0)
    assert (standing.used, standing.reserved) == (((1000, 1000),), (0,))


async def test_a_redis_admission_sent_again_after_its_reply_was_lost_is_not_refused_by_itself() -> None:
    """The second run counted the first's rate admission (and reservation): the request was refused
    by its own admission, and the reservation the first run held was never settled."""
    async with losing_replies() as (store, relay):
        relay.lose_next = True
        standing, refusal = await store.admit([SPENT], [Rate(SPENT.key, 1)], "member-1", "lease-1", 400)
        assert (standing.admitted, refusal, standing.reserved) == (True, None, (0,))
        await store.settle([SPENT], "lease-1", 100)
        standing, refusal = await store.admit([SPENT], [Rate(SPENT.key, 1)], "member-2")
        assert refusal is not None  # the first admission counts, once
    assert (standing.used, standing.reserved) == (((100, 100),), (0,))


async def test_redis_keeps_no_key_for_ever_of_a_payer_without_a_lifetime_allowance() -> None:
    """Client identities come and go (a rotating OAuth token under `--forward-authorization`):
    only a lifetime budget's count must outlive them; every other key of theirs expires."""
    async with redis_server() as server:
        store = RedisStore(server.url)
        raw = aioredis.Redis.from_url(server.url)
        try:
            for limits in ([Limit("client:gone", ())], [Limit("client:gone-too", (Allowance(50, "day"),))]):
                rates = [Rate(limits[0].key, 5)]
                await store.admit(limits, rates, "m", "lease", 30)
                await store.settle(limits, "lease", 12)
                assert await store.acquire_slot(limits[0].key, 1, "h")
                await store.release_slot(limits[0].key, "h")
            await store.settle([Limit("client:kept", (Allowance(100),))], "", 12)
            await store.settle([Limit("process", (), total=True)], "", 12)  # what the deployment spent
            kept = {key.decode(): await raw.ttl(key) async for key in raw.scan_iter("mcp-backfill:*")}
        finally:
            await raw.aclose()
            await store.aclose()
    assert {key for key, ttl in kept.items() if ttl < 0} == {
        "mcp-backfill:used:client:kept",
        "mcp-backfill:used:process",
    }


async def test_sqlite_drops_what_identities_gone_left_once_it_no_longer_counts(tmp_path: Path) -> None:
    """Rate windows past and budget windows past of payers never seen again, and lifetime counts of
    payers without a lifetime allowance, do not pile up in the file; a lifetime budget's stays."""
    clock = [1000.0]
    store = SqliteStore(str(tmp_path / "ledger.db"), clock=lambda: clock[0])
    kept = Limit("client:kept", (Allowance(100),))
    await store.settle([kept], "", 100)
    for i in range(3000):
        limits = [Limit(f"client:{i}", (Allowance(50, "hour"),))]
        _, refusal = await store.admit(limits, [Rate(limits[0].key, 5)], f"m{i}", f"l{i}", 30)
        assert refusal is None
        await store.settle(limits, f"l{i}", 12)
        clock[0] += 20.0
    standing = await store.reserve([kept], "", 0)
    await store.aclose()
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        rows = sum(
            db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in ("used", "hits", "leases")
        )
    assert rows < 1500  # 3000 identities: 6000 rows were kept, 9000 with their rate windows
    assert not standing.admitted  # the lifetime budget is still used up


async def test_the_sqlite_sweep_does_not_read_every_payers_counts(tmp_path: Path) -> None:
    """The sweep runs inside a request's transaction (the file's write lock held for every replica)
    every 1,024 operations; the `used` table holds every lifetime count there is (one per client
    with a lifetime budget, for ever), so dropping past windows must find them by an index, not
    read every row of every payer."""
    store = SqliteStore(str(tmp_path / "ledger.db"))
    await store.settle([Limit("client:kept", (Allowance(100),))], "", 1)  # the file and its schema
    await store.aclose()
    statements: list[str] = []
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        db.set_trace_callback(statements.append)
        SqliteStore._sweep(db, time.time())
        db.set_trace_callback(None)
        plans = {
            statement: " / ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}"))
            for statement in statements
            if " used " in statement
        }
    assert plans
    assert not {statement: plan for statement, plan in plans.items() if "SCAN used" in plan}


async def test_sqlite_operations_queued_behind_a_locked_file_each_wait_no_longer_than_the_timeout(
    tmp_path: Path,
) -> None:
    """`--state-store-timeout` bounds each operation. While another process held the file's write
    lock, this process's operations waited for it one after the other, each the whole busy timeout:
    the eighth request was refused after eight timeouts, a worker thread held all that while."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(str(path), timeout=0.5)
    await store.reserve([DAY], "", 0)  # the file and its schema
    took: list[float] = []

    async def reserve(n: int) -> None:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="database is locked"):
            await store.reserve([DAY], f"lease-{n}", 10)
        took.append(time.monotonic() - started)

    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(reserve, n)
        other.execute("ROLLBACK")
    standing = await store.reserve([DAY], "", 0)
    await store.aclose()
    assert len(took) == 8
    assert max(took) < 2.0, sorted(took)  # 8 x 0.5 s when each waited for the one before it
    assert standing.reserved == (0,)


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_a_sqlite_ledger_removed_or_replaced_while_in_use_is_left_for_the_new_file(
    tmp_path: Path, how: str
) -> None:
    """The file at the path is the ledger every process shares. A process kept using the file it had
    opened after an operator removed it (to start the budgets again) or put another in its place
    (a backup): the processes started since counted in the new file, the older ones in the old one,
    unseen by each other, so together they could spend each budget twice over."""
    path = tmp_path / "ledger.db"
    first = SqliteStore(str(path))
    await first.reserve([DAY], "a", 30)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"ledger.db{suffix}").unlink(missing_ok=True)
    if how == "replaced":
        (tmp_path / "backup").mkdir(mode=0o700)
        backup = SqliteStore(str(tmp_path / "backup" / "ledger.db"))
        await backup.settle([DAY], "old", 5)
        await backup.aclose()
        os.replace(tmp_path / "backup" / "ledger.db", path)
    second = SqliteStore(str(path))  # a process started since
    try:
        await second.reserve([DAY], "b", 20)
        seen_by_first = await first.reserve([DAY], "c", 10)
        seen_by_second = await second.reserve([DAY], "", 0)
    finally:
        await first.aclose()
        await second.aclose()
    used = 5 if how == "replaced" else 0
    assert (seen_by_first.used, seen_by_first.reserved) == (((used, used),), (20,))
    assert seen_by_second.reserved == (30,)


async def test_a_sealed_approval_claimed_by_one_replica_is_claimed_for_one_whose_clock_is_behind() -> None:
    """Each replica checks a sealed token's expiry by its own clock, and the store forgot the claim
    when the token expired by the clock of the replica that claimed it: a replica whose clock was
    behind still honoured the token, found it unclaimed, and sampled ("Allow once") a second time."""
    key, pending = request_state_key("a-key-shared-by-the-replicas-0123456789"), {"q": {"method": "x"}}
    on_time = SealedStash(key, 1.0, "alice")
    behind = SealedStash(key, 1.0, "alice", wall_clock=lambda: time.time() - 120)  # 2 minutes slow
    token = on_time.put({}, False, None, 1, pending)
    async with redis_server() as server:
        replicas = [Spend(SpendSettings(0, 0, (), ()), RedisStore(server.url)) for _ in range(2)]
        try:
            first = on_time.take(token)
            assert first is not None
            assert await replicas[0].claim_once(f"sealed:{first.nonce}", first.expires)
            await anyio.sleep(max(0.0, first.expires - time.time()) + 0.5)
            assert on_time.take(token) is None  # expired here
            again = behind.take(token)
            assert again is not None  # not yet there
            replayed = await replicas[1].claim_once(f"sealed:{again.nonce}", again.expires)
        finally:
            for replica in replicas:
                await replica.store.aclose()
    assert not replayed


async def test_closing_a_sqlite_store_while_an_operation_waits_for_a_locked_file_keeps_the_loop_running(
    tmp_path: Path,
) -> None:
    """`aclose` took the connection's lock on the event loop's thread: at exit, while an operation
    waited (in its worker thread) for the write lock another process held, the whole event loop
    stopped for up to `--state-store-timeout`."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(str(path), timeout=3.0)
    await store.reserve([DAY], "", 0)  # the file and its schema
    ticked: list[float] = []

    async def waiting() -> None:
        with contextlib.suppress(StoreUnavailable):
            await store.reserve([DAY], "lease", 10)

    async def tick(since: float) -> None:
        await anyio.sleep(0.05)
        ticked.append(time.monotonic() - since)

    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            with anyio.fail_after(10):
                while not store._lock.locked():  # the operation waits for the file
                    await anyio.sleep(0.01)
            tg.start_soon(tick, time.monotonic())
            async with anyio.create_task_group() as closing:
                closing.start_soon(store.aclose)
                with anyio.fail_after(10):
                    while not ticked:
                        await anyio.sleep(0.01)
                other.execute("ROLLBACK")
    assert ticked[0] < 1.0, ticked  # not the 3 s the operation may wait
    assert store._db is None
