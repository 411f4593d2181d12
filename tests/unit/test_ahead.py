"""The one answer the relay owes its books of (`relay/ahead.py`): routed when asked, or at its deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from mcp_backfill.relay.ahead import AHEAD_SECONDS, Owed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # (deadlines are the asyncio loop's timers)


async def test_an_answer_owed_is_settled_at_its_deadline_if_nobody_takes_it_first() -> None:
    settled: list[tuple[bytes, Any, Callable[[], None]] | None] = []
    owed = Owed(lambda: settled.append(owed.take()))
    owed.owe(b"{}", 7, lambda: None)
    assert owed.answer is not None
    await anyio.sleep(AHEAD_SECONDS / 4)
    assert settled == []
    with anyio.fail_after(10):
        while not settled:
            await anyio.sleep(AHEAD_SECONDS / 4)
    assert settled[0] is not None
    assert settled[0][:2] == (b"{}", 7)
    assert owed.answer is None


async def test_an_answer_taken_before_its_deadline_is_not_settled_again() -> None:
    calls: list[str] = []
    owed = Owed(lambda: calls.append("deadline"))
    owed.owe(b"{}", None, lambda: None)
    taken = owed.take()
    assert taken is not None
    assert owed.take() is None
    await anyio.sleep(AHEAD_SECONDS * 3)
    assert calls == []
