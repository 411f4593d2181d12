"""The one currency every transport speaks: whole JSON-RPC messages as bytes, in and out.

The relay never sees framing (lines, SSE events, HTTP bodies). Bytes rather than parsed objects so
that a message the relay does not modify is forwarded exactly as it arrived.
"""

from __future__ import annotations

from typing import Any, Protocol


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
