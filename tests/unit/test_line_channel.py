"""Writing lines to a real pipe: whole messages in order, even when the pipe fills up mid-message."""

from __future__ import annotations

import os

import anyio
import pytest
from anyio.abc import ByteReceiveStream

from mcp_backfill.transports.stdio import (
    FdSendStream,
    LineChannel,
    LineSplitter,
    open_fd_receive_stream,
    unwritten,
)

pytestmark = pytest.mark.anyio


class NoInput(ByteReceiveStream):
    """The unused reading side of a send-only channel."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        pass


def test_unwritten_drops_exactly_the_bytes_written() -> None:
    parts = (b"abc", b"defg", b"\n")
    for written in range(9):
        assert b"".join(unwritten(parts, written)) == b"abcdefg\n"[written:]


async def test_concurrent_sends_never_interleave_on_a_full_pipe() -> None:
    read_fd, write_fd = os.pipe()
    big = b'{"big":"' + b"x" * (1 << 20) + b'"}'  # far more than the 64 KiB pipe holds
    small = [f'{{"n":{n}}}'.encode() for n in range(50)]
    source = await open_fd_receive_stream(read_fd, owned=True)
    writer = LineChannel(NoInput(), FdSendStream(write_fd), 1 << 22)
    splitter = LineSplitter(1 << 22)
    received: list[bytes] = []

    async def read_all() -> None:
        while len(received) < 1 + len(small):
            splitter.feed(await source.receive())
            while isinstance(line := splitter.next_line(), bytes):
                received.append(line)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all)
            tg.start_soon(writer.send, big)  # blocks on the full pipe partway through
            await anyio.sleep(0)
            for message in small:  # these queue behind it instead of landing in its middle
                tg.start_soon(writer.send, message)
    await writer.close_writer()
    await source.aclose()
    assert received[0] == big
    assert sorted(received[1:]) == sorted(small)


async def test_send_after_close_is_a_closed_resource_error() -> None:
    read_fd, write_fd = os.pipe()
    stream = FdSendStream(write_fd)
    await stream.aclose()
    await stream.aclose()  # idempotent: the descriptor number is not closed twice
    with pytest.raises(anyio.ClosedResourceError):
        await stream.send(b"x")
    os.close(read_fd)
