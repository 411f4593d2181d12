"""Relaying from the read callback (`LineChannel.deliver_at_once`, `send_now`; `Relay.from_client_now`,
`from_upstream_now`): over real pipes, what is taken at once, what is left to the receiving task,
and that every message still arrives whole and in order."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from mcp_backfill import assembly
from mcp_backfill.config import Config
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.providers.mock import MockProvider
from mcp_backfill.relay import Relay
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.transports.stdio import FdSendStream, LineChannel, open_fd_receive_stream
from tests.unit.test_line_channel import write_until_full

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def channel_pair(limit: int = 1 << 20) -> AsyncIterator[tuple[LineChannel, LineChannel]]:
    """Two `LineChannel`s joined by two pipes: what one sends, the other receives."""
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    a = LineChannel(await open_fd_receive_stream(a_read, owned=True), FdSendStream(a_write), limit)
    b = LineChannel(await open_fd_receive_stream(b_read, owned=True), FdSendStream(b_write), limit)
    try:
        yield a, b
    finally:
        for channel in (a, b):
            await channel.close_writer()
            await channel.close_reader()


@dataclass
class Taker:
    """A `deliver_at_once` handler that takes what `take` says and keeps it."""

    take: Callable[[bytes], bool] = lambda line: True
    taken: list[bytes] = field(default_factory=list)

    def __call__(self, line: bytes) -> bool:
        if not self.take(line):
            return False
        self.taken.append(line)
        return True


async def settle() -> None:
    """Let the pipes deliver and every task go back to waiting."""
    for _ in range(3):
        await anyio.sleep(0.02)
        await anyio.wait_all_tasks_blocked()


async def test_a_whole_line_is_handed_over_while_receive_waits_and_the_rest_is_received() -> None:
    async with channel_pair() as (peer, channel):
        taker = Taker(take=lambda line: b"keep" not in line)
        channel.deliver_at_once(taker)
        received: list[bytes] = []

        async def receive_all() -> None:
            while True:
                received.append(await channel.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive_all)
            await settle()
            await peer.send(b'{"n":1}')  # whole, while receive() waits: handed over
            await settle()
            await peer.send(b"   ")  # blank: nothing to relay
            await settle()
            await peer.send(b'{"keep":2}')  # the handler declines it: received
            await settle()
            # Half a line, then its end: the end arrives while a part is held, so both go the usual way.
            await peer._writer.send(b'{"n":')
            await settle()
            await peer._writer.send(b"3}\n")
            await settle()
            await peer._writer.send(b'{"n":4}\n{"n":5}\n')  # two lines in one read: received, in order
            await settle()
            tg.cancel_scope.cancel()
    assert taker.taken == [b'{"n":1}']
    assert received == [b'{"keep":2}', b'{"n":3}', b'{"n":4}', b'{"n":5}']


async def test_an_oversized_line_is_not_handed_over_but_refused_by_receive() -> None:
    async with channel_pair(limit=16) as (peer, channel):
        taker = Taker()
        channel.deliver_at_once(taker)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(peer.send, b'{"text":"' + b"x" * 32 + b'"}')
                with pytest.raises(MessageTooLarge):
                    await channel.receive()
    assert taker.taken == []


async def test_an_error_in_the_handler_is_raised_by_receive() -> None:
    async with channel_pair() as (peer, channel):

        def fail(line: bytes) -> bool:
            raise RuntimeError(f"cannot take {line!r}")

        channel.deliver_at_once(fail)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(peer.send, b'{"n":1}')
                with pytest.raises(RuntimeError, match="cannot take"):
                    await channel.receive()


async def test_send_now_leaves_what_a_full_pipe_refuses_to_the_writer_thread_and_keeps_the_order() -> None:
    read_fd, write_fd = os.pipe()
    reader = await open_fd_receive_stream(read_fd, owned=True)
    channel = LineChannel(reader, FdSendStream(write_fd), 1 << 22)
    other = LineChannel(await open_fd_receive_stream(read_fd), FdSendStream(os.dup(write_fd)), 1 << 22)
    await other.close_writer()
    filled = write_until_full(write_fd, b"\n" * 4096)  # blank lines: the reader skips them
    big = b'{"big":"' + b"x" * 300_000 + b'"}'
    try:
        assert channel.can_send_now()
        channel.send_now(big)  # the pipe is full: all of it goes to the thread
        assert not channel.can_send_now()  # ...and later messages must follow it there
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(channel.send, b'{"after":1}')
                assert await other.receive() == big
                assert await other.receive() == b'{"after":1}'
        assert filled > 0
        assert channel.can_send_now()  # the thread wrote everything it held
    finally:
        await channel.close_writer()
        await reader.aclose()


# -- the relay ------------------------------------------------------------------------------------


@dataclass
class Piped:
    client: LineChannel
    server: LineChannel
    at_once: dict[str, list[bool]]
    """Per side, whether the relay took each message handed to it at once."""

    async def client_sends(self, message: dict[str, Any]) -> Any:
        """The client sends `message`; what the server receives (once the relay is idle again)."""
        await self.client.send(json.dumps(message).encode())
        return await _next(self.server)

    async def server_sends(self, message: dict[str, Any]) -> Any:
        await self.server.send(json.dumps(message).encode())
        return await _next(self.client)


async def _next(channel: LineChannel) -> Any:
    with anyio.fail_after(5):
        message = json.loads(await channel.receive())
    await settle()
    return message


@asynccontextmanager
async def piped_relay() -> AsyncIterator[Piped]:
    """A relay between two `LineChannel`s over pipes, wired as the stdio wrapper wires it."""
    config = Config(upstream_command=("server",), provider="mock")
    sampler = Sampler(
        MockProvider(), assembly.sampler_settings(config), spend=Spend(assembly.spend_settings(config))
    )
    at_once: dict[str, list[bool]] = {"client": [], "upstream": []}

    def noted(side: str, relay_now: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
        def at_once_noted(raw: bytes) -> bool:
            at_once[side].append(relay_now(raw))
            return at_once[side][-1]

        return at_once_noted

    async with channel_pair() as (client, client_side), channel_pair() as (server, upstream_side):
        relay = Relay(assembly.relay_options(config), sampler, client_side, upstream_side)
        client_side.deliver_at_once(noted("client", relay.from_client_now))
        upstream_side.deliver_at_once(noted("upstream", relay.from_upstream_now))

        async def client_closed() -> None:
            await upstream_side.close_reader()

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, client_closed)
            await settle()
            yield Piped(client, server, at_once)
            tg.cancel_scope.cancel()


def call(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "echo"}}


def answer(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": [], "n": request_id}}


async def test_an_idle_relay_relays_from_the_read_callback_and_its_pumps_take_over_under_load() -> None:
    async with piped_relay() as piped:
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        got = await piped.client_sends({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        assert got["params"]["capabilities"]["sampling"] == {"tools": {}}  # rewritten at once too
        assert (await piped.server_sends(answer(0)))["id"] == 0
        assert await piped.client_sends(call(1)) == call(1)
        assert await piped.server_sends(answer(1)) == answer(1)
        assert piped.at_once == {"client": [True, True], "upstream": [True, True]}
        # Three in flight: the third request, and the answers while two or more wait, go through the pumps.
        for n in (2, 3, 4):
            assert await piped.client_sends(call(n)) == call(n)
        for n in (4, 3, 2):
            assert await piped.server_sends(answer(n)) == answer(n)
        assert piped.at_once == {
            "client": [True, True, True, True, False],
            "upstream": [True, True, False, False, True],
        }
        # Not JSON: the error goes back to the client from the read callback as well.
        await piped.client.send(b"{not json")
        error = await _next(piped.client)
        assert error["error"]["code"] == -32700
        assert piped.at_once["client"][-1] is True
