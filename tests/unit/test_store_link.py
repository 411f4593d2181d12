"""What a store outage means to the ledger: refusal (default) or local counts, and settlements the
store missed, made once it is back. The store is a `MemoryStore` that can be switched off."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import SamplingError, StoreUnavailable
from mcp_backfill.options import Allowance
from mcp_backfill.sampling.spend import Reservation, Spend
from mcp_backfill.sampling.store import Held, Limit, MemoryStore, Rate, RateRefusal, Standing
from mcp_backfill.sampling.store_link import StoreLink
from tests.defaults import SPEND

pytestmark = pytest.mark.anyio


class SwitchableStore(MemoryStore):
    """A shared store for the ledger's sake, whose every operation fails while `down`, and whose
    reservations' replies may come late (`reply_delay`) or be lost (`reply_lost`) after they ran."""

    shared = True
    description = "redis://ledger:6379/0"

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.cause = "ConnectionError: refused"
        self.lease_seconds = 0.3
        self.reply_delay = 0.0
        self.reply_lost = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable(self.description, self.cause)

    async def _reply(self) -> None:
        await anyio.sleep(self.reply_delay)
        if self.reply_lost:
            raise StoreUnavailable(self.description, "TimeoutError")

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        self._check()
        standing = await super().reserve(limits, lease, amount)
        if amount > 0:  # not a check (as within an admission)
            await self._reply()
        return standing

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        self._check()
        answer = await super().admit(limits, rates, member, lease, amount)
        await self._reply()
        return answer

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        self._check()
        await super().settle(limits, lease, tokens)

    async def renew(self, held: Sequence[Held]) -> None:
        self._check()


def ledger(store: SwitchableStore, **settings: Any) -> Spend:
    return Spend(replace(SPEND, **{"rate_limit": 0, "budget": (Allowance(1000),), **settings}), store)


def usage(tokens: int) -> dict[str, int]:
    """A complete answer's usage of `tokens` in all (an answer reports some output: one that says 0
    is charged as one whose usage a gateway stripped)."""
    return {"input_tokens": tokens - 1, "output_tokens": 1}


async def answered(spend: Spend, tokens: int) -> None:
    async with spend.admit(None) as ticket, ticket.call(Reservation(0, 100)) as charge:
        charge.begin_attempt()
        charge.report(usage(tokens), final=True)


async def used(store: MemoryStore) -> int:
    """What the store counted for the process (read past a switched-off store's switch)."""
    return (await MemoryStore.reserve(store, [Limit("process", (Allowance(10**9),))], "", 0)).used[0][0]


async def held(store: MemoryStore) -> int:
    """What reservations hold against the process's budget in the store."""
    return (await MemoryStore.reserve(store, [Limit("process", (Allowance(10**9),))], "", 0)).reserved[0]


async def test_by_default_sampling_is_refused_while_the_store_is_down() -> None:
    store = SwitchableStore()
    spend = ledger(store)
    store.down = True
    with pytest.raises(SamplingError) as caught:
        await answered(spend, 10)
    assert caught.value.data == {
        "limit": "state_store",
        "store": "redis://ledger:6379/0",
        "option": "--state-store-outage",
    }
    assert "MCP_BACKFILL_STATE_STORE_OUTAGE" in caught.value.message
    assert spend.link.outage == "ConnectionError: refused"
    store.down = False
    await answered(spend, 10)
    assert spend.link.outage is None
    assert await used(store) == 10


async def test_a_refusal_reads_well_whatever_punctuation_the_stores_error_ends_with() -> None:
    """redis-py's errors end with a period ("... Connection refused."): the refusal read
    "Connection refused.; relaying goes on"."""
    store = SwitchableStore()
    spend = ledger(store)
    store.down = True
    store.cause = "Error 111 connecting to 127.0.0.1:6379. Connection refused."
    with pytest.raises(SamplingError) as caught:
        await answered(spend, 10)
    assert "6379. Connection refused; relaying goes on. To sample" in caught.value.message


async def test_the_local_policy_counts_in_this_process_meanwhile() -> None:
    store = SwitchableStore()
    spend = ledger(store, store_outage="local", budget=(Allowance(50),))
    store.down = True
    await answered(spend, 40)
    await answered(spend, 40)  # 40 used < 50: admitted; now the local count is over
    with pytest.raises(SamplingError, match="token budget shared through the state store is exhausted"):
        await answered(spend, 1)
    assert await used(spend.link.fallback) == 80
    assert await used(store) == 0
    # Each call's reservation may have been held by the store (it did not answer): it is released
    # when the store is back, or forgotten once it would have lapsed there.
    assert spend.link.unsettled == 2


async def test_a_settlement_the_store_missed_is_made_when_it_is_back() -> None:
    store = SwitchableStore()
    spend = ledger(store)
    async with spend.upkeep():
        async with spend.admit(None) as ticket, ticket.call(Reservation(0, 100)) as charge:
            charge.begin_attempt()
            charge.report(usage(30), final=True)
            store.down = True  # the call is answered, but its settlement cannot land
        with anyio.fail_after(5):
            while spend.link.unsettled == 0:
                await anyio.sleep(0.01)
        assert await used(store) == 0
        store.down = False
        with anyio.fail_after(5):  # the upkeep retries every third of the lease
            while spend.link.unsettled:
                await anyio.sleep(0.01)
    assert await used(store) == 30


@pytest.mark.parametrize("step", ["admission", "call"])
@pytest.mark.parametrize("reply", ["slow", "lost"])
async def test_a_reservation_whose_reply_never_came_is_released(step: str, reply: str) -> None:
    """The store held a reservation (the admission's for the first call, or a call's own), but its
    reply did not come: the request was cancelled meanwhile (the server's cancel, its timeout), or
    the reply was lost (`StoreUnavailable`). Nobody would have settled that lease: it would have
    lapsed and been charged whole, for a call never made."""
    store = SwitchableStore()
    spend = ledger(store)

    def fault() -> None:
        store.reply_delay, store.reply_lost = (5.0, False) if reply == "slow" else (0.0, True)

    async def request() -> None:
        if step == "admission":
            fault()
        async with spend.admit(None, Reservation(0, 100) if step == "admission" else None) as ticket:
            fault()
            async with ticket.call(Reservation(0, 100)):
                raise AssertionError("the reservation was not answered")

    async with spend.upkeep():
        with anyio.move_on_after(0.5), contextlib.suppress(SamplingError):
            await request()
        store.reply_delay, store.reply_lost = 0.0, False
    assert (await held(store), await used(store), spend.link.unsettled) == (0, 0, 0)


async def test_a_reservation_whose_reply_was_lost_is_released_while_counting_locally() -> None:
    store = SwitchableStore()
    spend = ledger(store, store_outage="local")
    async with spend.upkeep():
        store.reply_lost = True  # the call's reservation is held in the store, then counted locally
        await answered(spend, 10)
        store.reply_lost = False
    assert (await held(store), await used(store)) == (0, 0)
    assert (await held(spend.link.fallback), await used(spend.link.fallback)) == (0, 10)


async def test_a_release_the_store_missed_is_kept_only_while_its_lease_may_be_held() -> None:
    """A settlement of 0 tokens only releases a reservation; once the lease lapsed (charged whole),
    a late one charges nothing: it is not worth keeping through a long outage."""
    store = SwitchableStore()
    link = StoreLink(store, "refuse", MemoryStore())
    process = (Limit("process", (Allowance(10**9),)),)
    store.down = True
    await link.settle(store, process, "released", 0, wait=True)
    await link.settle(store, process, "charged", 5, wait=True)
    await anyio.sleep(store.lease_seconds)
    await link.settle(store, process, "released later", 0, wait=True)
    assert link.unsettled == 2  # the first release is forgotten
    store.down = False
    async with link.upkeep():
        with anyio.fail_after(5):
            while link.unsettled:
                await anyio.sleep(0.01)
    assert await used(store) == 5


async def test_settlements_still_missed_at_exit_are_told_to_the_operator(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process ending while the store is down dropped the settlements it had missed without a
    word: their reservations lapse and are charged whole, but what the calls cost beyond that is
    lost, and the operator never knew."""
    store = SwitchableStore()
    spend = ledger(store)
    with caplog.at_level("ERROR", logger="mcp_backfill"):
        async with spend.upkeep():
            async with spend.admit(None) as ticket, ticket.call(Reservation(0, 100)) as charge:
                charge.begin_attempt()
                charge.report(usage(130), final=True)
                store.down = True
            with anyio.fail_after(5):
                while spend.link.unsettled == 0:
                    await anyio.sleep(0.01)
    [record] = [r for r in caplog.records if hasattr(r, "unsettled")]
    assert record.levelname == "ERROR"
    assert getattr(record, "unsettled", None) == 1
    assert getattr(record, "tokens", None) == 130
    assert getattr(record, "store", None) == "redis://ledger:6379/0"


class SlotReplyStore(SwitchableStore):
    """A shared store whose slot acquisitions run, then never answer (`taken` tells when the slot
    is held), or their reply is lost (`StoreUnavailable`) when `slot_reply_lost`."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = anyio.Event()
        self.slot_reply_lost = False

    async def acquire_slot(self, key: str, limit: int, holder: str) -> bool:
        got = await super().acquire_slot(key, limit, holder)
        self.taken.set()
        if self.slot_reply_lost:
            raise StoreUnavailable(self.description, "TimeoutError")
        await anyio.sleep_forever()
        return got


@pytest.mark.parametrize("reply", ["cancelled", "lost"])
async def test_a_slot_whose_reply_never_came_is_released(reply: str) -> None:
    """The store gave a client's request its concurrency slot, but the reply did not come: the
    request was cancelled meanwhile (the client's cancel, a DELETE of its session), or the reply was
    lost. Nobody released that slot: the client had one slot fewer until its lease lapsed (30 s),
    every slot after as many such cancels. A reservation in the same case was released already."""
    store = SlotReplyStore()
    store.slot_reply_lost = reply == "lost"
    spend = ledger(store, client_max_concurrent=1)
    session = spend.new_session("s1", client="alice")
    async with spend.upkeep(), anyio.create_task_group() as tg:

        async def request() -> None:
            with contextlib.suppress(SamplingError):
                async with spend.admit(session):
                    raise AssertionError("the slot was not answered")

        tg.start_soon(request)
        await store.taken.wait()
        tg.cancel_scope.cancel()
    assert await MemoryStore.acquire_slot(store, "client:alice", 1, "another request")
