"""Plain ASGI plumbing for the sidecar: reading bodies with a limit, JSON and SSE responses.

The handlers speak raw ASGI rather than a framework's request/response objects because their
responses are long-lived streams fed from the relay, and they need to see a client disconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import ClientGone
from mcp_backfill.options import named
from mcp_backfill.transports.event_stream import SSE_PING, EventStream, sse_event

# An SSE comment this often keeps idle streams open through proxies with read timeouts.
KEEPALIVE_SECONDS = 15.0
# A request answered within this time, with nothing sent before its response, gets a JSON body;
# anything longer or chattier gets an SSE stream (as the MCP SDK's 2026-07-28 server does).
JSON_WINDOW_SECONDS = 15.0
# A single request answered within this time gets its JSON body without a task watching for the
# client going away (most are, and the task costs about 2% of the sidecar's CPU per tool call);
# a client that leaves while its answer takes longer is noticed from then on.
QUICK_ANSWER_SECONDS = 0.05
CLOSED_BEFORE_ANSWER = "client closed a POST before its answer; no id to resume"
"""Logged (debug) for a POST whose client left before any of its answer went out, whichever of the
app and the lane was answering it."""

RawHeaders = Sequence[tuple[bytes, bytes]]
# The scope extension (set by `connections`, for the requests it serves) that tells whether a
# response was cut off: a callable answering True once the connection was lost before the response's
# end was written. uvicorn drops what the application sends then without a word, so an SSE stream
# whose client left while its last events were written looked delivered whole.
CUT_OFF = "mcp_backfill.cut_off"


@dataclass
class FrontSettings:
    """What the `/mcp` handlers of both eras share."""

    max_body: int
    body_timeout: float = 30.0
    max_batch: int = 1000  # messages in one POSTed batch (--max-batch-messages)
    json_window: float = JSON_WINDOW_SECONDS
    keepalive: float = KEEPALIVE_SECONDS
    draining: bool = False  # shutting down: no new sessions or requests


@dataclass
class HttpCall:
    """One HTTP request being answered."""

    scope: Scope
    receive: Receive
    send: Send
    headers: Mapping[str, str] = field(init=False)
    """Each header's first value by its lowercase name (`header_items` has every line); `accept`
    holds every line of it, joined with commas (one list in HTTP, however many lines it takes)."""
    started: bool = False
    finished: bool = False  # the whole response has been handed to the server
    response_headers: RawHeaders = ()
    """Headers every response to this request carries (CORS, for a browser's page: see `cors`)."""

    def __post_init__(self) -> None:
        self.headers = header_map(self.scope["headers"])

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def cut_off(self) -> bool:
        """Was the connection lost before the response's end was written (`CUT_OFF`; False when the
        server does not say)? What went to it then may never have reached the client."""
        cut_off = self.scope.get("extensions", {}).get(CUT_OFF)
        return bool(cut_off()) if callable(cut_off) else False

    def header_items(self) -> list[tuple[str, str]]:
        """Every header line as sent (lowercase names), duplicates included."""
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]]

    async def start(self, status: int, content_type: str | None, headers: RawHeaders = ()) -> None:
        raw = [(b"content-type", content_type.encode())] if content_type else []
        all_headers = [*raw, *headers, *self.response_headers]
        await self.send({"type": "http.response.start", "status": status, "headers": all_headers})
        self.started = True

    async def body(self, data: bytes, more: bool = False) -> None:
        self.finished = not more  # before sending: the server may wake the watcher while it sends
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(
        self,
        status: int,
        data: bytes = b"",
        content_type: str | None = protocol.JSON_TYPE,
        headers: RawHeaders = (),
    ) -> None:
        length = [(b"content-length", str(len(data)).encode())]
        await self.start(status, content_type if data else None, [*length, *headers])
        await self.body(data)

    async def respond_error(
        self, status: int, code: int, message: str, request_id: Any = None, headers: RawHeaders = ()
    ) -> None:
        """An HTTP error whose body is a JSON-RPC error, as MCP clients can show it to the user."""
        body = jsonrpc.encode(jsonrpc.error_response(request_id, code, message))
        await self.respond(status, body, protocol.JSON_TYPE, headers)

    def declares_more_than(self, limit: int) -> bool:
        """Does the request's `Content-Length` say its body is larger than `limit` bytes?"""
        declared = self.headers.get("content-length")
        return declared is not None and declared.isdigit() and int(declared) > limit

    async def read_body(self, limit: int) -> bytes | None:
        """The whole request body, or None when it turns out larger than `limit` bytes (the rest is
        left unread: the server drops it once the response is out, `connections.DRAIN_LIMIT`).
        Raises `TimeoutError` when the caller's deadline passes first."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def read_json_body(self, limit: int, body_timeout: float) -> bytes | None:
        """The body of a JSON POST; None when it was refused here (415 not JSON, 413 too large,
        408 not received within `body_timeout` seconds)."""
        if not is_json_body(self.headers):
            await self.respond_error(
                415, protocol.INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json"
            )
            return None
        body = None
        try:
            if not self.declares_more_than(limit):  # a declared oversize is refused at once
                # asyncio's own timeout: a third of the CPU of anyio's cancel scope, on every POST.
                async with asyncio.timeout(body_timeout):
                    body = await self.read_body(limit)
        except TimeoutError:
            await self.respond_error(
                408,
                protocol.INVALID_REQUEST,
                f"Request Timeout: the body did not arrive within {body_timeout:g} s "
                f"({named('--body-timeout')})",
                headers=[(b"connection", b"close")],
            )
            return None
        if body is None:
            # The connection stays open: closing it while the client still sends would make the
            # client's kernel answer it with a reset, which it would get instead of this 413.
            await self.respond_error(
                413,
                protocol.INVALID_REQUEST,
                f"Request body too large: the limit is {limit} bytes ({named('--max-message-bytes')})",
            )
        return body

    async def watch_disconnect(self, scope: anyio.CancelScope) -> None:
        """Cancel `scope` when the client goes away (call once the body has been read).

        Returns quietly once the response is complete: uvicorn then wakes a waiting `receive()` with
        `http.disconnect` (as ASGI says `receive()` answers after a response), so the handler need
        not cancel this task, which costs anyio a task repr (about 60 µs) per request.
        """
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.finished:
            scope.cancel()


UpstreamHeaders = Callable[[], dict[str, str]]
"""The client's request headers as an upstream factory sees them, built when asked for."""


def header_map(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Each header's first value by its lowercase name; `accept` holds every line of it, joined
    with commas (see `HttpCall.headers`)."""
    # Reversed, so that the first line of a repeated header wins, as in starlette's `Headers`;
    # one dict for the ten or so lookups a request makes, instead of a scan of the list each.
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(raw)}
    accept = [value for name, value in raw if name == b"accept"]
    if len(accept) > 1:  # as Go's `Header.Add` sends a list, one value a line
        headers["accept"] = b", ".join(accept).decode("latin-1")
    return headers


def upstream_headers(call: HttpCall, strip_authorization: bool) -> dict[str, str]:
    """The client's request headers as an upstream factory sees them (lowercase names)."""
    forwarded: dict[str, str] = {}
    for name, value in call.header_items():
        if not (strip_authorization and name == "authorization"):
            # A repeated header's first line, as `HttpCall.headers` has it: with
            # `--forward-authorization` the client's identity is the first `Authorization`, and the
            # credential the upstream gets must be that one, not a later line of the client's choice.
            forwarded.setdefault(name, value)
    return forwarded


def accepts(headers: Mapping[str, str]) -> tuple[bool, bool]:
    """Does the Accept header allow (JSON, SSE)? Wildcards count, as in the MCP SDK."""
    kinds = {part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")}
    anything = "*/*" in kinds
    return (
        anything or protocol.JSON_TYPE in kinds or "application/*" in kinds,
        anything or protocol.SSE_TYPE in kinds or "text/*" in kinds,
    )


def is_json_body(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == protocol.JSON_TYPE


def sse_headers(extra: RawHeaders = ()) -> RawHeaders:
    return [(b"cache-control", b"no-cache, no-transform"), (b"x-accel-buffering", b"no"), *extra]


async def wait_for_events(stream: EventStream, window: float) -> None:
    """Until the stream has something to write or is finished, at most `window` seconds."""
    try:
        async with asyncio.timeout(window):  # asyncio's own: cheaper than anyio's cancel scope
            while not stream.after(stream.delivered) and not stream.finished:
                await stream.changed()
    except TimeoutError:
        pass


async def quick_answer(stream: EventStream, window: float) -> bytes | None:
    """The stream's single answer if it is complete with it within `QUICK_ANSWER_SECONDS` (at most
    `window`); else None, and the caller watches for a disconnect while it waits on."""
    await wait_for_events(stream, min(window, QUICK_ANSWER_SECONDS))
    return single_answer(stream)


async def respond_single(
    call: HttpCall, stream: EventStream, answer: bytes, status: int = 200, headers: RawHeaders = ()
) -> None:
    """Write the stream's single answer as a JSON response (see `single_answer`)."""
    stream.handed_out(1)
    stream.answered_as_json = True
    await call.respond(status, answer, protocol.JSON_TYPE, headers)


def single_answer(stream: EventStream) -> bytes | None:
    """The stream's only message when it is complete with exactly one: a JSON response will do."""
    events = stream.after(0)
    if stream.finished and len(events) == 1 and stream.first_kept() == 1:
        return events[0][1]
    return None


async def pump_sse(
    call: HttpCall, stream: EventStream, after: int, *, with_ids: bool, keepalive: float = KEEPALIVE_SECONDS
) -> None:
    """Write the stream's events after `after` until it is finished, or another response takes it over.

    The caller has started the SSE response. Idle periods get a comment line every `keepalive`
    seconds. Returns without ending the HTTP response body.
    """
    generation = stream.attach()
    if after > stream.delivered:  # a resumption: the client has those (a dropped write is not known)
        stream.handed_out(after)
    else:  # a resumption from an earlier event: what came after it is to be delivered again
        stream.rewind(after)
    try:
        cursor = after
        while stream.is_writer(generation):
            events = stream.after(cursor)
            for seq, data in events:
                await call.body(sse_event(data, stream.event_id(seq) if with_ids else None), more=True)
                if not stream.is_writer(generation):
                    return  # another response took the stream over meanwhile, from its own event
                cursor = seq
                stream.handed_out(seq)
            if events:
                continue  # what came while those were written is not waited for again
            if stream.complete_after(cursor):
                return
            with anyio.move_on_after(keepalive) as idle:
                await stream.changed()
            if idle.cancelled_caught:
                await call.body(SSE_PING, more=True)
    finally:
        stream.detach(generation)


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
