"""A handshake session's idle clock (`HttpSession`): one timer, which lets go of the session once it
has ended, however it ended."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from mcp_backfill.errors import UpstreamStartError
from mcp_backfill.relay import Relay
from mcp_backfill.sidecar.sessions import HttpSession, SessionSettings
from mcp_backfill.sidecar.upstreams import UpstreamRequest
from mcp_backfill.transports.base import MessageChannel

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def unreachable(request: UpstreamRequest) -> AsyncIterator[MessageChannel]:
    raise UpstreamStartError(f"no upstream for {request.label}")
    yield  # pragma: no cover


def no_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
    raise AssertionError("no upstream, no relay")


async def test_an_ended_session_is_not_held_by_its_idle_timer() -> None:
    """The session's end closes its router, which notes activity; a timer armed then would hold the
    ended session, its buffered messages and all, for the whole `--session-idle-timeout`."""
    session = HttpSession("s" * 32, SessionSettings(idle_timeout=3600, stop_timeout=1), lambda _: None, "c")
    ended = weakref.ref(session)
    with anyio.fail_after(5):
        await session.run(unreachable, no_relay, {})
    assert session.ended.is_set()
    del session
    gc.collect()
    assert ended() is None
