"""The one currency every transport speaks: whole JSON-RPC messages as bytes, in and out.

The relay never sees framing (lines, SSE events, HTTP bodies). Bytes rather than parsed objects so
that a message the relay does not modify is forwarded exactly as it arrived.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


class MessageChannel(Protocol):
    """One side of the relay.

    `receive()` returns the next message (one JSON-RPC message or batch, undecoded), raises
    `anyio.EndOfStream` when the peer is gone, and `MessageTooLarge` for an oversized message
    it skipped. `receive_with_origin()` also says which of our requests the message arrived in
    answer to (an HTTP upstream delivers a POST's related messages on that POST's stream), or None.
    `send()` writes one message; `related` is the id of the peer's request the message belongs to,
    when known, so that an HTTP front can put it on that request's stream. Concurrent sends must
    not interleave.
    """

    async def receive(self) -> bytes: ...

    async def receive_with_origin(self) -> tuple[bytes, Any]: ...

    async def send(self, message: bytes, related: Any = None) -> None: ...


@runtime_checkable
class SendsAtOnce(Protocol):
    """A channel that can also write a message without waiting, from outside any task (the stdio
    pipes: `LineChannel`). `send_now` is called only right after `can_send_now()` said yes, and
    then sends like `send()` would, in order with the sends before it."""

    def can_send_now(self) -> bool: ...

    def send_now(self, message: bytes, related: Any = None) -> None: ...


@runtime_checkable
class PostsAhead(Protocol):
    """An upstream channel that can write a request's POST before the relay has kept its books for
    it (`Relay.post_ahead`): the relay's `send_now` of the same bytes, which must follow before the
    callback returns, then finds it written."""

    def post_ahead(self, message: bytes, request: dict[str, Any]) -> bool:
        """Write the POST of `message` (`request`, decoded) now; False: nothing was written."""
        ...


@runtime_checkable
class AnswersAhead(Protocol):
    """A client channel that can write a request's one answer before the relay has routed it
    (`Relay.answer_ahead`): the relay's `send_now` of the same bytes follows, later, and then
    only keeps the books."""

    def answer_ahead(self, message: bytes, response: dict[str, Any]) -> Callable[[], None] | None:
        """Write `message` (`response`, decoded) to its client now when it is the one answer of a
        request being answered so; the hook returned is called once the relay has routed it (it
        finishes the answer's books if routing could not). None: nothing was written."""
        ...


# How often an upstream's stop looks whether what is in flight elsewhere has finished (polled: the
# relay has no event for it).
ELSEWHERE_POLL_SECONDS = 0.05


def nothing_elsewhere() -> bool:
    """An upstream stop's `in_flight_elsewhere` when nothing goes through it but its own requests."""
    return False
