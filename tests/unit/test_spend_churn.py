"""A long-running sidecar serves client identities that come and go (under `--forward-authorization`
each OAuth access token is one, and tokens rotate): what the ledger keeps of those gone stays
bounded, while no budget that is set is reset by forgetting them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import SamplingError
from mcp_backfill.options import Allowance
from mcp_backfill.sampling.spend import Reservation, SamplingSession, Spend
from mcp_backfill.sampling.store import Limit, MemoryStore, Rate
from tests.clock import Clock
from tests.defaults import SPEND

IDENTITIES = 5000


def spend_with(clock: Clock, **settings: Any) -> Spend:
    return Spend(replace(SPEND, **{"rate_limit": 0, **settings}), clock=clock, wall_clock=clock)


async def spend_on(spend: Spend, session: SamplingSession, tokens: int = 10) -> None:
    async with spend.admit(session) as ticket, ticket.call(Reservation(0, 0)) as charge:
        charge.begin_attempt()
        charge.report({"input_tokens": tokens}, final=True)


def store_entries(store: MemoryStore) -> int:
    """What the in-memory store keeps: payers, rate windows, slot sets and claims (its private
    tables: the store has no other seam that counts them)."""
    return len(store._payers) + len(store._hits) + len(store._slots) + len(store._claims)


async def churn(spend: Spend, clock: Clock, count: int = IDENTITIES, step: float = 1.0) -> None:
    """`count` identities that each sample once, a second apart, and are never seen again."""
    for i in range(count):
        await spend_on(spend, spend.new_session(f"s{i}", client=f"authorization:{i:016x}"))
        clock.now += step


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("client_budget", "step"),
    [
        ((), 30.0),
        ((Allowance(1000, "hour"),), 30.0),
        ((Allowance(1000, "hour"), Allowance(5000, "day")), 300.0),
    ],
    ids=["no budget", "per hour", "per hour and day"],
)
async def test_what_is_kept_of_identities_gone_stays_bounded(
    client_budget: tuple[Allowance, ...], step: float
) -> None:
    """A count of a window not over yet is kept (here at most 288 identities a day)."""
    clock = Clock()
    spend = spend_with(
        clock,
        budget=(Allowance(10**9, "day"),),
        client_budget=client_budget,
        client_rate_limit=5,
        client_max_concurrent=2,
    )
    assert isinstance(spend.store, MemoryStore)
    await churn(spend, clock, IDENTITIES, step=step)
    assert len(spend.clients) < 1500
    assert store_entries(spend.store) < 2500  # payers and rate windows: 5000 each were kept


@pytest.mark.anyio
async def test_a_lifetime_client_budget_is_never_forgotten() -> None:
    clock = Clock()
    spend = spend_with(clock, client_budget=(Allowance(100),), client_rate_limit=5)
    alice = spend.new_session("a", client="alice")
    await spend_on(spend, alice, 100)
    await churn(spend, clock)
    clock.now += 30 * 86400
    await churn(spend, clock)
    with pytest.raises(SamplingError, match="token budget of client 'alice' is exhausted: 100 of 100"):
        await spend_on(spend, spend.new_session("a2", client="alice"))


@pytest.mark.anyio
async def test_a_window_budget_is_kept_for_its_window_only() -> None:
    clock = Clock(86400 * 20000)  # a day's start
    spend = spend_with(clock, client_budget=(Allowance(100, "day"),), client_rate_limit=5)
    await spend_on(spend, spend.new_session("a", client="alice"), 100)
    await churn(spend, clock, step=10.0)  # the day is not over
    with pytest.raises(SamplingError, match="token budget of client 'alice' is exhausted: 100 of 100"):
        await spend_on(spend, spend.new_session("a2", client="alice"))
    clock.now = 86400 * 20001 + 1
    await churn(spend, clock, step=1.0)
    await spend_on(spend, spend.new_session("a3", client="alice"), 60)
    assert spend.client("alice").budget.remaining == 40


@pytest.mark.anyio
async def test_a_clients_account_in_use_is_kept_and_so_is_its_rate_minute() -> None:
    clock = Clock()
    spend = spend_with(clock, client_rate_limit=2, client_max_concurrent=1)
    alice = spend.new_session("a", client="alice")
    release, inside = anyio.Event(), anyio.Event()

    async def long_call() -> None:
        async with spend.admit(alice):
            inside.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_call)
        await inside.wait()
        account = spend.client("alice")
        await churn(spend, clock, step=1.0)  # more than a minute passes: alice is still in flight
        assert spend.clients.get("alice") is account
        assert account.in_flight == 1
        release.set()
    clock.now += 1
    bob = spend.new_session("b", client="bob")
    await spend_on(spend, bob)
    await spend_on(spend, bob)
    await churn(spend, clock, count=2000, step=0.01)  # 20 s: bob's minute is not over
    with pytest.raises(SamplingError, match="rate limit of client 'bob' reached"):
        await spend_on(spend, spend.new_session("b2", client="bob"))


@pytest.mark.anyio
async def test_the_memory_store_forgets_empty_slot_sets_and_rate_windows_past() -> None:
    clock = Clock()
    store = MemoryStore(clock, clock)
    for i in range(IDENTITIES):
        key = f"client:{i}"
        assert await store.acquire_slot(key, 1, "h")
        await store.release_slot(key, "h")
        _, refusal = await store.admit([Limit(key, ())], [Rate(key, 3)], "m")
        assert refusal is None
        await store.settle([Limit(key, ())], "", 5)
        assert await store.claim(key, "c", clock.now + 10)
        clock.now += 1
    assert store_entries(store) < 1500
