"""`/readyz`'s answer about a shared state store (`sidecar.server.Readiness`)."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from mcp_backfill.errors import StoreUnavailable
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.sampling.store import MemoryStore
from mcp_backfill.sidecar.server import Readiness
from tests.defaults import SPEND

pytestmark = pytest.mark.anyio


class DownStore(MemoryStore):
    """A shared store that is down, counting the pings it gets."""

    shared = True
    description = "redis://ledger:6379/0"

    def __init__(self) -> None:
        super().__init__()
        self.pings = 0

    async def ping(self) -> None:
        self.pings += 1
        await anyio.sleep(0.05)
        raise StoreUnavailable(self.description, "ConnectionError: refused")


async def test_readyz_during_an_outage_asks_the_store_once_a_second_not_once_a_request() -> None:
    """While sampling had found the store unavailable, every `/readyz` (which needs no credentials)
    pinged the store, however many came at once: anyone could have the sidecar hammer its store
    while it was down."""
    store = DownStore()
    spend = Spend(replace(SPEND), store)
    spend.link.outage = "ConnectionError: refused"  # as a failed sampling request leaves it
    readiness = Readiness(spend, timeout=2.0)
    answers: list[bool] = []

    async def ask() -> None:
        ready, about = await readiness.check()
        answers.append(ready)
        assert about["store_status"] == "unavailable"

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(ask)
    for _ in range(50):
        await ask()
    assert answers == [False] * 100
    assert store.pings == 1
