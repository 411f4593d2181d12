"""`MessageQueue`: order, waiting while full or empty, closing, and cancelled waiters losing nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_backfill.transports.queue import MessageQueue

pytestmark = pytest.mark.anyio


async def test_items_come_out_in_the_order_they_went_in() -> None:
    queue = MessageQueue[int](4)
    for item in range(4):
        await queue.send(item)
    assert len(queue) == 4
    assert [await queue.receive() for _ in range(4)] == [0, 1, 2, 3]


async def test_a_receiver_waits_for_the_next_item() -> None:
    queue = MessageQueue[str](1)
    got: list[str] = []

    async def receive() -> None:
        got.append(await queue.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        await queue.send("a")
    assert got == ["a"]


async def test_a_sender_waits_while_the_queue_is_full_and_goes_on_once_there_is_room() -> None:
    queue = MessageQueue[int](2)
    await queue.send(1)
    await queue.send(2)
    sent = anyio.Event()

    async def send_third() -> None:
        await queue.send(3)
        sent.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_third)
        await anyio.wait_all_tasks_blocked()
        assert not sent.is_set()
        assert await queue.receive() == 1
        await sent.wait()
    assert [await queue.receive(), await queue.receive()] == [2, 3]


async def test_send_nowait_queues_past_the_size() -> None:
    queue = MessageQueue[int](1)
    queue.send_nowait(1)
    queue.send_nowait(2)
    assert [await queue.receive(), await queue.receive()] == [1, 2]


async def test_after_close_the_receiver_takes_what_is_left_then_the_stream_ends() -> None:
    queue = MessageQueue[int](4)
    await queue.send(1)
    queue.close()
    with pytest.raises(anyio.ClosedResourceError):
        await queue.send(2)
    assert await queue.receive() == 1
    with pytest.raises(anyio.EndOfStream):
        await queue.receive()


async def raises_once_closed(
    queue: MessageQueue[int], wait: Callable[[], Awaitable[object]], error: type[Exception]
) -> bool:
    """Whether `wait()`, blocked on `queue`, raises `error` once the queue is closed."""
    raised = False

    async def waiting() -> None:
        nonlocal raised
        try:
            await wait()
        except error:
            raised = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        await anyio.wait_all_tasks_blocked()
        queue.close()
    return raised


async def test_closing_wakes_a_waiting_receiver_and_a_waiting_sender() -> None:
    full = MessageQueue[int](1)
    await full.send(0)
    assert await raises_once_closed(full, lambda: full.send(1), anyio.ClosedResourceError)
    empty = MessageQueue[int](1)
    assert await raises_once_closed(empty, empty.receive, anyio.EndOfStream)


async def test_a_receiver_cancelled_while_waiting_leaves_the_next_item_for_another() -> None:
    queue = MessageQueue[int](2)
    with anyio.move_on_after(0.01):
        await queue.receive()
    await queue.send(7)
    assert await queue.receive() == 7


async def test_a_receiver_woken_then_cancelled_passes_its_turn_on_and_loses_nothing() -> None:
    queue = MessageQueue[int](2)
    got: list[int] = []

    async def receive() -> None:
        got.append(await queue.receive())

    first = asyncio.create_task(receive())
    await anyio.wait_all_tasks_blocked()
    second = asyncio.create_task(receive())
    await anyio.wait_all_tasks_blocked()
    queue.send_nowait(1)  # wakes the first receiver...
    first.cancel()  # ...which is cancelled before it runs: the second takes the item
    await second
    assert first.cancelled()
    assert got == [1]
    assert len(queue) == 0


async def test_a_cancelled_sender_does_not_hold_a_place() -> None:
    queue = MessageQueue[int](1)
    await queue.send(1)
    with anyio.move_on_after(0.01):
        await queue.send(2)
    assert await queue.receive() == 1
    await queue.send(3)
    assert await queue.receive() == 3


async def test_a_waiting_sender_is_not_overtaken_by_one_that_comes_later() -> None:
    """The room a receive frees belongs to the longest-waiting sender, not to whoever sends next.

    Found by scenario 8 of the benchmarks (1,000 clients on one 2026-07-28 upstream): a woken
    sender that found its room taken went to the back of the line again, and 1% of the calls
    waited 11-14 s while the median took 85 ms."""
    queue = MessageQueue[str](1)
    await queue.send("first")

    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.send, "waited")
        await anyio.wait_all_tasks_blocked()
        assert await queue.receive() == "first"  # wakes the waiting sender ...
        with anyio.move_on_after(0.2):
            await queue.send("came later")  # ... whose room this one may not take (it gives up)
        assert await queue.receive() == "waited"


async def test_senders_get_room_in_the_order_they_came() -> None:
    queue = MessageQueue[int](2)
    order: list[int] = []

    async def send(item: int) -> None:
        await queue.send(item)
        order.append(item)

    async with anyio.create_task_group() as tg:
        for item in range(40):
            tg.start_soon(send, item)
            if item % 3 == 0:
                await anyio.lowlevel.checkpoint()
        received = []
        for _ in range(40):
            received.append(await queue.receive())
            if len(received) % 2:  # newcomers arrive between receives
                await anyio.lowlevel.checkpoint()
    assert received == sorted(received)
    assert order == sorted(order)


async def test_a_sender_woken_then_cancelled_passes_the_room_on() -> None:
    queue = MessageQueue[str](1)
    await queue.send("first")
    first = asyncio.create_task(queue.send("cancelled"))
    await anyio.wait_all_tasks_blocked()
    second = asyncio.create_task(queue.send("next"))
    await anyio.wait_all_tasks_blocked()
    assert await queue.receive() == "first"  # wakes the first sender ...
    first.cancel()  # ... which is cancelled before it runs: the second gets the room
    with anyio.fail_after(5):
        await second
    assert first.cancelled()
    assert await queue.receive() == "next"
    assert len(queue) == 0


def test_a_queue_holds_at_least_one_item() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MessageQueue[int](0)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 4), producers=st.lists(st.lists(st.integers(), max_size=12), min_size=1, max_size=4)
)
def test_every_item_arrives_once_and_each_senders_items_stay_in_order(
    size: int, producers: list[list[int]]
) -> None:
    tagged = [[(index, item) for item in items] for index, items in enumerate(producers)]
    total = sum(len(items) for items in tagged)

    async def main() -> list[tuple[int, int]]:
        queue = MessageQueue[tuple[int, int]](size)
        got: list[tuple[int, int]] = []

        async def produce(items: list[tuple[int, int]]) -> None:
            for item in items:
                await queue.send(item)
                await anyio.lowlevel.checkpoint()

        async def consume() -> None:
            for _ in range(total):
                got.append(await queue.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            for items in tagged:
                tg.start_soon(produce, items)
        return got

    got = anyio.run(main)
    assert sorted(got) == sorted(item for items in tagged for item in items)
    for index, items in enumerate(tagged):
        assert [item for item in got if item[0] == index] == items
