"""`MessageQueue`: the hand-over between a transport's tasks and the relay, one event loop's FIFO.

A sender waits while the queue is full, the receiver while it is empty; closing it lets the receiver
take what is left and then tells it the stream ended (`anyio.EndOfStream`), and refuses later sends
(`anyio.ClosedResourceError`). These are the exceptions anyio's memory object streams raise, which
this replaces on the message path: a memory object stream passes through the event loop on every
send and every receive, even when the other side is ready (a checkpoint), which costs a session's
answer one more trip round the loop at each hand-over, in the time between the upstream's answer
and the client's (`benchmarks/README.md`, 3b). Here a hand-over to a waiting receiver wakes it and
goes on, and a receiver that finds a message takes it without waiting.

An item stays queued until a receiver takes it, so a receiver cancelled as it wakes loses nothing.
Senders get room in the order they came: the room a receive frees is held for the sender it wakes,
so a sender that comes later cannot take it first and send the woken one to the back of the line
(which left 1% of 1,000 clients' calls waiting 11-14 s on one 2026-07-28 upstream: scenario 8).
asyncio only, like the rest of the transports beneath the relay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class MessageQueue(Generic[T]):
    """A bounded FIFO between tasks (see the module docstring)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a queue holds at least one item")
        self._size = size
        self._items: deque[T] = deque()
        self._receivers: deque[asyncio.Future[None]] = deque()  # waiting for an item
        self._senders: deque[asyncio.Future[None]] = deque()  # waiting for room
        # Senders woken but not yet run: the room each was woken for is theirs, not a newcomer's.
        self._woken_senders = 0
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def waiting(self) -> bool:
        """Is the receiver waiting for an item, with none queued?"""
        return not self._items and bool(self._receivers)

    async def send(self, item: T) -> None:
        """Queue `item`, once there is room and every sender that waited before has had its turn;
        raises `anyio.ClosedResourceError` once closed."""
        if (self._senders or len(self._items) + self._woken_senders >= self._size) and not self.closed:
            await _wait(self._senders, self._pass_room_on)
            self._woken_senders -= 1
        self.send_nowait(item)

    def send_nowait(self, item: T) -> None:
        """Queue `item` now, room or not (a message the sender must not wait to hand over)."""
        if self.closed:
            raise anyio.ClosedResourceError
        self._items.append(item)
        _wake(self._receivers)

    async def receive(self) -> T:
        """The next item; raises `anyio.EndOfStream` once the queue is closed and empty."""
        while not self._items:
            if self.closed:
                raise anyio.EndOfStream
            await _wait(self._receivers, self._pass_item_on)
        item = self._items.popleft()
        if len(self._items) + self._woken_senders < self._size:
            self._wake_sender()
        return item

    def close(self) -> None:
        """No more items: the receiver takes what is queued, then gets `anyio.EndOfStream`."""
        self.closed = True
        while self._receivers:
            _wake(self._receivers)
        while self._senders:
            self._wake_sender()

    def _wake_sender(self) -> None:
        """Wake the longest-waiting sender, the room it was woken for held for it until it runs."""
        if _wake(self._senders):
            self._woken_senders += 1

    def _pass_room_on(self) -> None:
        """A sender woken for room was cancelled before it took it: the next in line gets it."""
        self._woken_senders -= 1
        self._wake_sender()

    def _pass_item_on(self) -> None:
        """A receiver woken for an item was cancelled before it took it: the next one's turn."""
        _wake(self._receivers)


async def _wait(waiters: deque[asyncio.Future[None]], pass_on: Callable[[], None]) -> None:
    """Wait in line until woken; `pass_on()` when cancelled after being woken."""
    waiter = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        await waiter
    except BaseException:
        if waiter.done() and not waiter.cancelled():
            pass_on()
        elif waiter in waiters:
            waiters.remove(waiter)
        raise


def _wake(waiters: deque[asyncio.Future[None]]) -> bool:
    """Wake the longest-waiting of `waiters`, if any; whether one was woken."""
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return True
    return False
