"""The writer thread of a slow pipe (`transports/pipe_writer.py`), on real pipes.

What must hold whichever way a message goes out: every message whole and in the order it was sent,
across switches between writing inline and through the thread; the event loop held up only while
more than the limit waits unwritten; a broken pipe reported on the next send; closing writes what is
held, and gives up on a reader that stopped reading without leaking the descriptor.
"""

from __future__ import annotations

import os
import random
import threading
from contextlib import suppress

import anyio
import pytest

from mcp_backfill.transports import pipe_writer, stdio
from mcp_backfill.transports.pipe_writer import PipeWriter
from mcp_backfill.transports.stdio import (
    FdSendStream,
    LineChannel,
    LineSplitter,
    open_fd_receive_stream,
)
from tests.unit.test_line_channel import NoInput, write_until_full

pytestmark = pytest.mark.anyio

THREAD_NAME = "mcp-backfill-pipe-writer"


def writer_threads() -> set[threading.Thread]:
    """The writer threads alive now (a set, so that one left by an earlier test and ending on its
    own schedule is not counted as this test's)."""
    return {thread for thread in threading.enumerate() if thread.name == THREAD_NAME}


def ended(threads: set[threading.Thread]) -> bool:
    """Have the writer threads started since `threads` was taken all left (within 10 s)? Closing
    returns once the thread has written its last byte and said so; the thread object is alive a
    moment longer, until its function has returned, which on a loaded machine can be a while."""
    for thread in writer_threads() - threads:
        thread.join(10)
    return not writer_threads() - threads


async def read_lines(read_fd: int, count: int, pause: float = 0.0) -> list[bytes]:
    """Read `count` lines from the pipe (pausing between reads, to let it fill), then close it."""
    source = await open_fd_receive_stream(read_fd, owned=True)
    splitter = LineSplitter(1 << 22)
    lines: list[bytes] = []
    try:
        while len(lines) < count:
            splitter.feed(await source.receive())
            while isinstance(line := splitter.next_line(), bytes):
                lines.append(line)
            await anyio.sleep(pause)
    finally:
        await source.aclose()
    return lines


def messages(count: int, seed: int) -> list[bytes]:
    """Numbered messages, every seventh larger than the pipe holds."""
    rng = random.Random(seed)
    return [
        f'{{"n":{n},"pad":"{"x" * (300_000 if n % 7 == 3 else rng.randrange(200))}"}}'.encode()
        for n in range(count)
    ]


@pytest.mark.parametrize("seed", range(4))
async def test_order_holds_across_switches_between_inline_and_the_thread(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stdio, "SLOW_WRITE_NS", -1)  # every write counts as slow
    rng = random.Random(seed)
    crowded_answers: list[bool] = []

    def crowded() -> bool:
        crowded_answers.append(rng.random() < 0.5)
        return crowded_answers[-1]

    read_fd, write_fd = os.pipe()
    channel = LineChannel(NoInput(), FdSendStream(write_fd), 1 << 22)
    channel.offload_writes(crowded)
    sent = messages(120, seed)
    received: list[bytes] = []
    threads = writer_threads()

    async def read() -> None:
        received.extend(await read_lines(read_fd, len(sent), pause=0.001))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for n, message in enumerate(sent):
                if n % 3:  # some back to back, some as concurrent tasks started in order
                    await channel.send(message)
                else:
                    tg.start_soon(channel.send, message)
                    await anyio.sleep(0)
            assert len(writer_threads() - threads) == 1
            await channel.close_writer()
    assert set(crowded_answers) == {True, False}  # both ways were open to it
    assert received == sent
    assert ended(threads)  # closing ended the thread


async def test_a_lone_request_keeps_writes_inline() -> None:
    read_fd, write_fd = os.pipe()
    channel = LineChannel(NoInput(), FdSendStream(write_fd), 1 << 22)
    channel.offload_writes(lambda: False)  # one request in flight: never worth a thread
    threads = writer_threads()
    sent = [message for message in messages(30, 0) if len(message) < 1000]  # the pipe holds them all
    for message in sent:
        await channel.send(message)
    assert not writer_threads() - threads  # written inline, however slow the writes were
    await channel.close_writer()
    with anyio.fail_after(30):
        assert await read_lines(read_fd, len(sent)) == sent


async def test_the_loop_waits_only_while_more_than_the_limit_is_held() -> None:
    read_fd, write_fd = os.pipe()
    stream = FdSendStream(write_fd)
    capacity = write_until_full(write_fd, b"f" * 4096)  # the pipe is full: the thread will block
    writer = PipeWriter(stream, limit=12_000)
    await writer.write([b"a" * 6000])  # held, within the limit: returns at once
    await writer.write([b"b" * 6000])  # so does this, 12,000 held
    assert writer.holding
    blocked = anyio.Event()

    async def write_more() -> None:
        blocked.set()
        await writer.write([b"c" * 10])

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(write_more)
            await blocked.wait()
            await anyio.sleep(0.2)
            assert writer.holding  # still waiting on the full pipe ...
            source = await open_fd_receive_stream(read_fd, owned=True)
            received = bytearray()
            while len(received) < capacity + 12_010:  # ... until someone reads
                received += await source.receive()
        assert await writer.aclose()
    assert bytes(received) == b"f" * capacity + b"a" * 6000 + b"b" * 6000 + b"c" * 10
    assert not writer.holding
    await stream.aclose()
    await source.aclose()


async def test_a_broken_pipe_fails_the_next_write() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    stream = FdSendStream(write_fd)
    writer = PipeWriter(stream, limit=1 << 20)
    await writer.write([b"lost\n"])  # handed over; the thread finds the pipe broken
    with anyio.fail_after(5):
        while writer.holding:  # until the thread has tried
            await anyio.sleep(0.01)
    with pytest.raises(anyio.BrokenResourceError):
        await writer.write([b"more\n"])
    assert await writer.aclose()
    await stream.aclose()


async def test_closing_writes_everything_held_first() -> None:
    read_fd, write_fd = os.pipe()
    stream = FdSendStream(write_fd)
    writer = PipeWriter(stream, limit=1 << 24)
    payload = bytes(range(256)) * 4096  # 1 MiB: sixteen pipes full
    for offset in range(0, len(payload), 100_000):
        await writer.write([payload[offset : offset + 100_000]])
    source = await open_fd_receive_stream(read_fd, owned=True)
    received = bytearray()

    async def read_to_end() -> None:
        with suppress(anyio.EndOfStream):
            while True:
                received.extend(await source.receive())

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_to_end)
            assert await writer.aclose()
            await stream.aclose()  # the reader sees the end only after all of it
    await source.aclose()
    assert received == payload


async def test_closing_abandons_a_reader_that_never_reads_and_the_thread_closes_the_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipe_writer, "POLL_SECONDS", 0.02)
    read_fd, write_fd = os.pipe()
    write_until_full(write_fd, b"f" * 4096)
    channel = LineChannel(NoInput(), FdSendStream(write_fd), 1 << 22)
    channel.offload_writes(lambda: True)
    monkeypatch.setattr(stdio, "SLOW_WRITE_NS", -1)
    threads = writer_threads()
    await channel.send(b'{"stuck":true}')  # handed to the thread, which waits on the full pipe
    with anyio.fail_after(5):
        await channel.close_writer(flush_timeout=0.3)  # gives up instead of hanging
    with anyio.fail_after(5):
        while writer_threads() - threads:  # the thread notices within a poll and leaves ...
            await anyio.sleep(0.01)
    os.set_blocking(read_fd, False)
    drained = b""
    while chunk := os.read(read_fd, 1 << 16):  # ... having closed the writing end: EOF
        drained += chunk
    os.close(read_fd)
    assert drained.strip(b"f") in (b"", b'{"stuck":true}\n')


async def test_a_cancelled_waiting_writer_leaves_the_others_waiting_unharmed() -> None:
    read_fd, write_fd = os.pipe()
    stream = FdSendStream(write_fd)
    capacity = write_until_full(write_fd, b"f" * 4096)
    writer = PipeWriter(stream, limit=100)
    finished: list[bytes] = []

    async def write(data: bytes) -> None:
        await writer.write([data])
        finished.append(data)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(write, b"x" * 200)  # both wait: 400 bytes held, the pipe full
            tg.start_soon(write, b"y" * 200)
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(write, b"z" * 200)  # a third waits too, then gives up
                await anyio.sleep(0.1)
                doomed.cancel_scope.cancel()
            source = await open_fd_receive_stream(read_fd, owned=True)
            received = bytearray()
            while len(received) < capacity + 600:  # what was handed over is written all the same
                received += await source.receive()
    assert sorted(finished) == [b"x" * 200, b"y" * 200]
    assert bytes(received) == b"f" * capacity + b"x" * 200 + b"y" * 200 + b"z" * 200
    assert await writer.aclose()
    await stream.aclose()
    await source.aclose()
