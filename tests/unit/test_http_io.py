"""The sidecar's request plumbing: header lookup, and waiting for an SSE stream to change."""

from __future__ import annotations

import anyio
import pytest

from mcp_backfill.sidecar.http_io import HttpCall, accepts, upstream_headers
from mcp_backfill.sidecar.security import AccessPolicy
from mcp_backfill.transports.event_stream import EventStream

pytestmark = pytest.mark.anyio


async def _never() -> dict[str, object]:
    raise AssertionError("not read")


async def _discard(message: object) -> None:
    pass


def call_with(*headers: tuple[bytes, bytes]) -> HttpCall:
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": list(headers)}
    return HttpCall(scope, _never, _discard)


def test_a_header_is_found_by_its_lowercase_name_and_the_first_of_repeated_lines_wins() -> None:
    call = call_with(
        (b"host", b"127.0.0.1:8080"),
        (b"accept", b"application/json, text/event-stream"),
        (b"host", b"evil.example"),
    )
    assert call.headers.get("host") == "127.0.0.1:8080"
    assert call.headers.get("origin") is None
    assert accepts(call.headers) == (True, True)
    assert call.header_items()[-1] == ("host", "evil.example")  # every line is still there


async def test_waiting_for_a_stream_ends_when_a_message_arrives_or_it_finishes() -> None:
    stream = EventStream("s1", 8)
    woken: list[str] = []

    async def wait(name: str) -> None:
        await stream.changed()
        woken.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "first")
        tg.start_soon(wait, "second")
        await anyio.wait_all_tasks_blocked()
        stream.append(b"{}")
    assert sorted(woken) == ["first", "second"]
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "third")
        await anyio.wait_all_tasks_blocked()
        stream.finish()
    assert woken[-1] == "third"


def test_the_forwarded_authorization_is_the_one_the_identity_comes_from() -> None:
    """With `--forward-authorization` the identity (budgets, rate limits, session binding) is a digest
    of the first `Authorization` line, but the upstream used to get the last: a client could put a
    fresh value first on every request, and be a new client each time with its real credential."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"authorization", b"Bearer fresh-identity-7f3a"),
            (b"authorization", b"Bearer the-real-token"),
        ],
    }
    call = HttpCall(scope, _never, _discard)
    policy = AccessPolicy(allowed_hosts=("*",), allowed_origins=(), forward_authorization=True)
    forwarded = upstream_headers(call, strip_authorization=False)["authorization"]
    assert forwarded == "Bearer fresh-identity-7f3a"
    assert policy.identify(call.headers.get("authorization")) == policy.identify(forwarded)
