"""`Deadlines`: deadlines of one length behind one timer, on a real event loop."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import anyio
import pytest

from mcp_backfill.transports.deadlines import Deadlines

pytestmark = pytest.mark.anyio

SECONDS = 0.05


async def until(condition: Any) -> None:
    with anyio.fail_after(10):  # (a loaded machine runs timers late; never early)
        while not condition():
            await anyio.sleep(0.01)


async def test_each_deadline_runs_once_when_due_in_order_and_a_cancelled_one_never() -> None:
    deadlines = Deadlines(SECONDS)
    loop = asyncio.get_running_loop()
    ran: list[tuple[int, float]] = []
    set_at: dict[int, float] = {}
    kept = []
    for n in range(6):
        set_at[n] = loop.time()
        deadline = deadlines.set(lambda n=n: ran.append((n, loop.time())))  # type: ignore[misc]
        if n % 2:
            deadline.cancel()
            assert deadline.cancelled
        kept.append(deadline)
        await anyio.sleep(0.01)
    await until(lambda: len(deadlines) == 0)  # reached and dropped, the cancelled ones too
    assert [n for n, _ in ran] == [0, 2, 4]
    for n, at in ran:
        assert at >= set_at[n] + SECONDS - 0.002, (n, at - set_at[n])  # not before (but a clock tick)
    await anyio.sleep(SECONDS + 0.05)
    assert [n for n, _ in ran] == [0, 2, 4]  # once each


async def test_a_deadline_set_by_a_callback_and_the_ones_after_a_failing_one_still_run() -> None:
    deadlines = Deadlines(SECONDS)
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    loop.set_exception_handler(lambda _, context: seen.append(context.get("exception")))
    ran: list[tuple[str, float]] = []

    def fails() -> None:
        ran.append(("fails", loop.time()))
        deadlines.set(lambda: ran.append(("set by a callback", loop.time())))
        raise RuntimeError("a bug in a callback")

    try:
        deadlines.set(fails)
        deadlines.set(lambda: ran.append(("after it", loop.time())))
        await until(lambda: len(ran) == 3)
        assert [what for what, _ in ran] == ["fails", "after it", "set by a callback"]
        assert ran[2][1] >= ran[0][1] + SECONDS - 0.002  # its own length after it was set
        assert [type(error) for error in seen] == [RuntimeError]  # told to the loop, as a timer's
    finally:
        loop.set_exception_handler(None)


async def test_a_cancelled_deadline_lets_go_of_its_callback_at_once() -> None:
    """A cancelled deadline waits in the queue until the timer reaches it; what its callback refers
    to must not wait with it."""
    deadlines = Deadlines(60.0)

    class Owner:
        def expired(self) -> None:
            raise AssertionError("cancelled: never called")

    owner = Owner()
    deadline = deadlines.set(owner.expired)
    seen = weakref.ref(owner)
    gc.disable()
    try:
        deadline.cancel()
        del owner
        assert seen() is None
    finally:
        gc.enable()
    assert len(deadlines) == 1  # still queued, holding nothing
