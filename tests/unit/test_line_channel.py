"""Writing lines to a real pipe: whole messages in order, even when the pipe fills up mid-message."""

from __future__ import annotations

import fcntl
import os

import anyio
import pytest
from anyio.abc import ByteReceiveStream

from mcp_backfill.transports.stdio import (
    READ_CHUNK,
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


def write_until_full(fd: int, chunk: bytes) -> int:
    """Write `chunk` to the non-blocking `fd` until the pipe refuses more; how many bytes went in."""
    os.set_blocking(fd, False)
    written = 0
    while True:
        try:
            written += os.write(fd, chunk)
        except BlockingIOError:
            return written


async def test_a_pipe_reader_that_falls_behind_holds_a_bounded_amount_and_loses_nothing() -> None:
    """Reading pauses once more than `READ_CHUNK` waits unread, so a writer that outpaces the relay
    is held up by the full pipe instead of filling the proxy's memory; every byte still arrives,
    in order, in pieces of at most the size asked for."""
    read_fd, write_fd = os.pipe()
    source = await open_fd_receive_stream(read_fd, owned=True)
    pattern = bytes(range(256)) * 256  # 64 KiB, each offset recognisable
    written = 0
    for _ in range(50):  # the event loop reads what it can between rounds
        written += write_until_full(write_fd, pattern[written % len(pattern) :] + pattern)
        await anyio.sleep(0.01)
    capacity = fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ)
    assert written <= READ_CHUNK + 2 * len(pattern) + 2 * capacity  # not the 50 rounds' worth
    os.close(write_fd)
    received = bytearray()
    with anyio.fail_after(10):
        while True:
            try:
                piece = await source.receive(1000)
            except anyio.EndOfStream:
                break
            assert len(piece) <= 1000
            received += piece
    await source.aclose()
    assert len(received) == written
    assert received == (pattern * (written // len(pattern) + 1))[:written]


async def test_a_cancelled_pipe_read_loses_nothing() -> None:
    read_fd, write_fd = os.pipe()
    source = await open_fd_receive_stream(read_fd, owned=True)
    with anyio.move_on_after(0.05):
        await source.receive()  # nothing to read: cancelled while waiting
    with anyio.fail_after(5):
        for piece in (b"after the cancel\n", b"and more\n"):
            os.write(write_fd, piece)
            await anyio.sleep(0.05)  # it arrives while no read waits for it
            assert await source.receive() == piece
    os.close(write_fd)
    with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
        await source.receive()
    await source.aclose()
