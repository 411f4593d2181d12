"""The client side of all 2026-07-28 HTTP requests: many POSTs multiplexed onto one relay.

A 2026-07-28 request is self-contained (no session), so every such POST shares one upstream and one
relay. Clients choose their JSON-RPC ids independently, so each POSTed request gets a fresh id of
the mux's own (an integer; the relay's own ids are strings), and its `_meta.progressToken` becomes
that same integer. On the way back the mux restores the client's id in the response, the client's
token in `notifications/progress`, and the client's id in `_meta.subscriptionId` (whose value is
the id of the `subscriptions/listen` request it belongs to). Each message of a batch from the
upstream (which this revision does not have) is routed as if it came alone.

A server message reaches the POST it belongs to by, first match wins: its id (responses), `related`,
its progress token, its subscription id, or the only request in flight when there is exactly one.
Anything else cannot be attributed to a client and is dropped (logged at debug level). The one
guess is the last: a stdio upstream never says which request a log line belongs to, so one written
just after its request ended reaches the request in flight, of the same client identity (a hub
serves one identity; tokenless clients are one).

The mux keeps the input schemas of the upstream's tools from the `tools/list` answers it carries
(`ToolSchemas`), and can send a request of the proxy's own (`own_request`: the front lists the
tools itself when it must check a call to a tool no listing has shown yet); the answers to those go
to no client, and the mux never guesses that a server message belongs to one of them.

A client closing its POST before the answer cancels the request: the mux hands the relay a
`notifications/cancelled` for it, which stops any Claude call and the upstream round.

What a POST's SSE response being written has yet to write is never dropped, however slow its
reader: its stream keeps it, past its own limits, while the streams of the hub's requests hold at
most `HOLD_UP_BYTES` in all (and it is at most `HOLD_UP_EVENTS` events behind). The hub's relay is
shared by every request of one client identity, which may be many users (every caller of a sidecar
without tokens): one reading slowly does not hold up the answers of the others. Only past those
bounds does `send` wait for a writer far behind to catch up (as a handshake session's does), and
one that writes nothing for `STALL_SECONDS` is no longer waited for (its oldest messages are
dropped again).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import anyio

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.event_stream import SESSION_REPLAY_BYTES, EventStream, ReplayBudget
from mcp_backfill.transports.http_server import INBOX_SIZE, InboxChannel
from mcp_backfill.transports.queue import MessageQueue
from mcp_backfill.transports.tool_schemas import ToolSchemas

log = get_logger("http")

# Messages kept for one POST while its response is being written.
EXCHANGE_BUFFER = 1024
# What the response streams of one hub's requests hold in all, and how far one stream's writer is
# behind, before a burst for a writer far behind holds up the hub's relay (see the module docstring):
# under the `HUB_BUFFER_BYTES` (the same 32 MiB) at which the hub refuses new requests.
HOLD_UP_BYTES = SESSION_REPLAY_BYTES // 2
HOLD_UP_EVENTS = 16 * EXCHANGE_BUFFER
# Ids of the proxy's own requests (a client's id is never rewritten to a string).
OWN_ID_PREFIX = "mcp-backfill-own:"


@dataclass
class MuxedRequest:
    """One POSTed request and the messages for it."""

    client_id: Any
    mux_id: int
    method: str
    stream: EventStream
    client_token: Any = None
    has_token: bool = False
    own: bool = False  # a request of the proxy's own (`own_request`), for no client
    cursor: Any = None  # a `tools/list`'s cursor: the page it asked for (see `ToolSchemas.learn`)


class MuxChannel(InboxChannel):
    """The relay's client side for 2026-07-28 HTTP requests; see the module docstring."""

    def __init__(self, on_message: Callable[[str], None] = lambda direction: None) -> None:
        super().__init__(MessageQueue[bytes](INBOX_SIZE), on_message)
        self._ids = itertools.count(1)
        self._exchanges: dict[int, MuxedRequest] = {}
        self._own_in_flight = 0
        # What the streams of the requests `open`ed and not yet `release`d hold, kept as they change
        # (summed at each request, it cost a look at every stream: 1,000 clients sharing one identity).
        self._held = ReplayBudget(sys.maxsize)  # never trimmed: an answer is not dropped for others
        self.closed = False
        self.tools = ToolSchemas()

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    @property
    def buffered_bytes(self) -> int:
        """What the streams of the requests opened and not yet released (waiting for their answer,
        or for their client to read it) hold for their readers, together."""
        return self._held.total

    def release(self, exchange: MuxedRequest) -> None:
        """The HTTP handler of `exchange` is done with its stream."""
        self._held.remove(exchange.stream)

    # -- from the HTTP handlers ------------------------------------------------------------------

    def open(self, request: dict[str, Any], *, own: bool = False) -> tuple[MuxedRequest, bytes]:
        """Register a POSTed request; returns its exchange and the message to relay (ids rewritten)."""
        mux_id = next(self._ids)
        held = None if own else self._held  # the proxy's own last `OWN_LIST_SECONDS` at most
        exchange = MuxedRequest(
            request["id"],
            mux_id,
            str(request.get("method")),
            EventStream(f"m{mux_id}", EXCHANGE_BUFFER, budget=held, replay=False),
            own=own,
        )
        self._own_in_flight += own
        if held is not None:
            held.add(exchange.stream)
        rewritten = {**request, "id": mux_id}
        params = request.get("params")
        if exchange.method == protocol.TOOLS_LIST and isinstance(params, dict):
            exchange.cursor = params.get("cursor")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(params, dict) and isinstance(meta, dict) and "progressToken" in meta:
            exchange.client_token = meta["progressToken"]
            exchange.has_token = True
            rewritten["params"] = {**params, "_meta": {**meta, "progressToken": mux_id}}
        self._exchanges[mux_id] = exchange
        if self.closed:
            self._route_response(
                jsonrpc.error_response(mux_id, protocol.INTERNAL_ERROR, "Upstream MCP server is gone; retry")
            )
        return exchange, jsonrpc.encode(rewritten)

    async def deliver(self, raw: bytes) -> None:
        await self._inbox.send(raw)

    async def own_request(self, method: str, params: dict[str, Any], seconds: float) -> Any:
        """Send a request of the proxy's own through the relay; its `result`, or None when it failed
        or did not come within `seconds` (then it is cancelled)."""
        request_id = f"{OWN_ID_PREFIX}{next(self._ids)}"
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        exchange, raw = self.open(message, own=True)
        with contextlib.suppress(anyio.ClosedResourceError):
            await self.deliver(raw)
        stream = exchange.stream
        with anyio.move_on_after(seconds):
            while not stream.finished:
                await stream.changed()
        if not stream.finished:
            await self.abandon(exchange, f"{method} of mcp-backfill's own timed out")
            return None
        for _, data in stream.after(0):
            answer = jsonrpc.decode(data)
            if "method" not in answer and answer.get("id") == request_id:
                return answer.get("result")
        return None

    async def abandon(self, exchange: MuxedRequest, reason: str) -> None:
        """The client closed its POST before the answer: cancel the request upstream."""
        if self._pop(exchange.mux_id) is None or self.closed:
            return
        exchange.stream.finish()
        log.info(
            "client closed its request; cancelling it",
            extra={"request_id": exchange.client_id, "method": exchange.method},
        )
        with contextlib.suppress(anyio.ClosedResourceError):
            await self._inbox.send(_cancel(exchange, reason))

    def end_listens(self, reason: str) -> None:
        """Shutting down: end the stream of every `subscriptions/listen` (it never ends by itself),
        as the drain ends a handshake session's GET stream, and cancel the subscription upstream."""
        for exchange in [e for e in self._exchanges.values() if e.method == protocol.LISTEN]:
            self._pop(exchange.mux_id)
            exchange.stream.finish()
            if not self.closed:
                self._inbox.send_nowait(_cancel(exchange, reason))  # no waiting: called from a signal

    def close(self, reason: str) -> None:
        """The shared upstream is gone: every request still waiting gets an error."""
        self.closed = True
        for exchange in list(self._exchanges.values()):
            error = jsonrpc.error_response(exchange.mux_id, protocol.INTERNAL_ERROR, reason)
            self._route_response(error)
        self._inbox.close()

    # -- MessageChannel (the relay's side) -------------------------------------------------------

    async def send(self, message: bytes, related: Any = None) -> None:
        """Put a server message on its POST's stream; waits while that stream's live writer is far
        behind and the hub holds too much (see the module docstring), which holds up the hub's relay."""
        self._on_message("to_client")
        try:
            decoded = jsonrpc.decode(message)
        except ValueError:
            log.debug("undecodable message dropped", extra={"line": jsonrpc.preview(message)})
            return
        if isinstance(decoded, list):  # this revision has no batches, but nothing may wait for ever
            for item in decoded:
                if isinstance(item, dict):
                    await self._send_one(item, jsonrpc.encode(item), related)
            return
        if not isinstance(decoded, dict):
            log.debug("message that is no JSON-RPC object dropped", extra={"line": jsonrpc.preview(message)})
            return
        await self._send_one(decoded, message, related)

    async def _send_one(self, decoded: dict[str, Any], message: bytes, related: Any) -> None:
        if "method" not in decoded and "id" in decoded:
            self._route_response(decoded)
            return
        if decoded.get("method") == protocol.TOOLS_CHANGED:
            self.tools.forget()
        exchange = self._owner(decoded, related)
        if exchange is None:
            log.debug(
                "server message that belongs to no open request dropped",
                extra={"line": jsonrpc.preview(message)},
            )
            return
        restored = self._restore(decoded, exchange)
        stream = exchange.stream
        stream.append(message if restored is decoded else jsonrpc.encode(restored))
        # A burst its live reader has yet to write is kept, not dropped; past the hub's bounds the
        # relay is held up for it rather than memory grown.
        while stream.behind and (
            self._held.total > HOLD_UP_BYTES or stream.last_seq - stream.delivered > HOLD_UP_EVENTS
        ):
            await stream.progress()

    def _route_response(self, response: dict[str, Any]) -> None:
        mux_id = response.get("id")
        exchange = self._pop(mux_id) if _is_mux_id(mux_id) else None
        if exchange is None:
            log.debug("response for a closed request dropped", extra={"id": mux_id})
            return
        if exchange.method == protocol.TOOLS_LIST and "result" in response:
            self.tools.learn(response["result"], exchange.cursor)
        exchange.stream.append(jsonrpc.encode({**response, "id": exchange.client_id}))
        exchange.stream.finish()

    def _owner(self, message: dict[str, Any], related: Any) -> MuxedRequest | None:
        if _is_mux_id(related) and related in self._exchanges:
            return self._exchanges[related]
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        candidates = (params.get("progressToken"), _meta(params).get(protocol.META_SUBSCRIPTION_ID))
        for candidate in candidates:
            if _is_mux_id(candidate) and candidate in self._exchanges:
                return self._exchanges[candidate]
        # "The one request in flight" only for a message nothing attributes: one that names a request
        # already gone (its stream, its token, its subscription) may belong to another client.
        attributed = related is not None or any(_is_mux_id(candidate) for candidate in candidates)
        if len(self._exchanges) - self._own_in_flight == 1 and not attributed:
            return next(e for e in self._exchanges.values() if not e.own)
        return None

    def _pop(self, mux_id: int) -> MuxedRequest | None:
        exchange = self._exchanges.pop(mux_id, None)
        if exchange is not None:
            self._own_in_flight -= exchange.own
        return exchange

    def _restore(self, message: dict[str, Any], exchange: MuxedRequest) -> dict[str, Any]:
        """The client's own token and subscription id in a message for its request."""
        params = message.get("params")
        if not isinstance(params, dict):
            return message
        restored = dict(params)
        if _same_id(params.get("progressToken"), exchange.mux_id) and exchange.has_token:
            restored["progressToken"] = exchange.client_token
        meta = _meta(params)
        if _same_id(meta.get(protocol.META_SUBSCRIPTION_ID), exchange.mux_id):
            restored["_meta"] = {**meta, protocol.META_SUBSCRIPTION_ID: exchange.client_id}
        return {**message, "params": restored} if restored != params else message


def _cancel(exchange: MuxedRequest, reason: str) -> bytes:
    params = {"requestId": exchange.mux_id, "reason": reason}
    return jsonrpc.encode({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": params})


def _is_mux_id(value: Any) -> TypeGuard[int]:
    """Whether `value` can be one of the mux's ids: an integer, not `true` nor `1.0` (equal to 1 in
    Python, and so a key of `_exchanges`)."""
    return type(value) is int


def _same_id(value: Any, mux_id: int) -> bool:
    return _is_mux_id(value) and value == mux_id


def _meta(params: dict[str, Any]) -> dict[str, Any]:
    meta = params.get("_meta")
    return meta if isinstance(meta, dict) else {}
