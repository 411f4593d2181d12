"""What a store outage means to the ledger: refusal (default) or local counts, and settlements the
store missed, made once it is back. The store is a `MemoryStore` that can be switched off."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import SamplingError, StoreUnavailable
from mcp_backfill.options import Allowance
from mcp_backfill.sampling.spend import Reservation, Spend
from mcp_backfill.sampling.store import Held, Limit, MemoryStore, Rate, RateRefusal, Standing
from tests.defaults import SPEND

pytestmark = pytest.mark.anyio


class SwitchableStore(MemoryStore):
    """A shared store for the ledger's sake, whose every operation fails while `down`."""

    shared = True
    description = "redis://ledger:6379/0"

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lease_seconds = 0.3

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable(self.description, "ConnectionError: refused")

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        self._check()
        return await super().reserve(limits, lease, amount)

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        self._check()
        return await super().admit(limits, rates, member, lease, amount)

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        self._check()
        await super().settle(limits, lease, tokens)

    async def renew(self, held: Sequence[Held]) -> None:
        self._check()


def ledger(store: SwitchableStore, **settings: Any) -> Spend:
    return Spend(replace(SPEND, **{"rate_limit": 0, "budget": (Allowance(1000),), **settings}), store)


async def answered(spend: Spend, tokens: int) -> None:
    async with spend.admit(None) as ticket, ticket.call(Reservation(0, 100)) as charge:
        charge.begin_attempt()
        charge.report({"input_tokens": tokens}, final=True)


async def used(store: MemoryStore) -> int:
    """What the store counted for the process (read past a switched-off store's switch)."""
    return (await MemoryStore.reserve(store, [Limit("process", (Allowance(10**9),))], "", 0)).used[0][0]


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
    assert spend.link.unsettled == 0  # nothing was reserved in the store: nothing to settle there


async def test_a_settlement_the_store_missed_is_made_when_it_is_back() -> None:
    store = SwitchableStore()
    spend = ledger(store)
    async with spend.upkeep():
        async with spend.admit(None) as ticket, ticket.call(Reservation(0, 100)) as charge:
            charge.begin_attempt()
            charge.report({"input_tokens": 30}, final=True)
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
