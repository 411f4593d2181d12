"""The one currency every transport speaks: whole JSON-RPC messages as bytes, in and out.

The relay never sees framing (lines, SSE events, HTTP bodies). Bytes rather than parsed objects so
that a message the relay does not modify is forwarded exactly as it arrived.
"""

from __future__ import annotations

from typing import Any, Protocol


class MessageTooLarge(Exception):
    """A message exceeded the size limit; it was discarded and the stream is still usable.

    Only its first and last `EDGE` bytes are kept: enough to recover the JSON-RPC id, which sits
    at one end of the object in every common serializer.
    """

    EDGE = 1024

    def __init__(self, size: int, limit: int, head: bytes = b"", tail: bytes = b"") -> None:
        super().__init__(f"message of at least {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit
        self.head = head
        self.tail = tail

    @classmethod
    def from_bytes(cls, data: bytes, limit: int) -> MessageTooLarge:
        return cls(len(data), limit, data[: cls.EDGE], data[-cls.EDGE :])

    def extend(self, more: bytes | bytearray) -> None:
        """More bytes of the same oversized message arrived (and were dropped)."""
        self.size += len(more)
        self.tail = (self.tail + bytes(more[-self.EDGE :]))[-self.EDGE :]
        self.args = (f"message of at least {self.size} bytes exceeds the limit of {self.limit} bytes",)


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
