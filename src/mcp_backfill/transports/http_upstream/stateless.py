"""The stateless (2026-07-28) leg: no session; each POST carries the routing headers the server checks.

The headers come from the request itself, plus an `Mcp-Param-*` header for each annotated argument
of a tool call; when the tool was never listed, the proxy lists the tools itself to learn them. A
request is cancelled by closing its stream.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import httpx2

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.http_upstream.exchange import (
    Cursor,
    ExchangeReader,
    Payload,
    PostExchange,
    describe_one_way,
    log_refused,
    media_type,
    read_limited,
)
from mcp_backfill.transports.http_upstream.headers import stateless_headers, unsendable_routing
from mcp_backfill.transports.http_upstream.settings import describe_transport_error
from mcp_backfill.transports.tool_schemas import LIST_PAGE_CAP

log = get_logger("http")

# Ids of the proxy's own requests; never delivered, so they cannot collide with the client's.
OWN_ID_PREFIX = "mcp-backfill-http:"


class StatelessLeg:
    """Carries requests that declare a stateless version, and the stateless era's other messages."""

    def __init__(self, reader: ExchangeReader) -> None:
        self._reader = reader
        # The version the latest request declared; notifications and responses carry it.
        self.version: str = protocol.STATELESS_VERSION
        self._listing = anyio.Lock()
        self._own_ids = itertools.count(1)

    # -- EraLeg --------------------------------------------------------------------------------

    def write_now(self, body: bytes, exchange: PostExchange) -> None:
        if unsendable_routing(exchange.stateless_version or self.version, exchange.method):
            return  # `carry` refuses it
        name = _tool_called(exchange)
        tools = self._reader.tools
        if name is None or tools.knows(name) or tools.complete:  # else `carry` lists the tools first
            self._reader.write_now(body, self._post_headers(exchange), exchange)

    async def carry(self, body: bytes, exchange: PostExchange) -> None:
        refusal = unsendable_routing(exchange.stateless_version or self.version, exchange.method)
        if refusal is not None:
            exchange.failure, exchange.failure_code = refusal, protocol.INVALID_REQUEST
            return
        written = exchange.written
        if written is None:
            name = _tool_called(exchange)
            if name is not None:
                await self._learn_tool(name, exchange.params, exchange.stateless_version or self.version)
        headers = written.headers if written is not None else self._post_headers(exchange)
        await self._reader.post(body, headers, exchange)

    def _post_headers(self, exchange: PostExchange) -> dict[str, str]:
        """The headers of a request's POST: the era's routing headers and the tool's `Mcp-Param-*`."""
        version = exchange.stateless_version or self.version
        params = exchange.params if isinstance(exchange.params, dict) else {}
        name = _tool_called(exchange)
        param_headers = {} if name is None else self._reader.tools.headers_for(name, params.get("arguments"))
        headers = self._reader.post_headers()
        headers.update(stateless_headers(version, exchange.method, params, param_headers))
        return headers

    def cancel(self, exchange: PostExchange | None) -> bool:
        if exchange is not None:
            log.debug("cancelling a request by closing its stream", extra={"request_id": exchange.origin})
            exchange.scope.cancel()
        return True

    def answered(self, method: str, result: dict[str, Any]) -> None:
        pass  # what answers teach here (the tools' header maps) the reader keeps

    async def post_one_way(self, body: bytes, items: list[Any]) -> None:
        what = describe_one_way(items)
        headers = self._reader.post_headers()
        headers[protocol.VERSION_HEADER] = self.version
        if isinstance(items[0], dict) and isinstance(items[0].get("method"), str):
            headers[protocol.METHOD_HEADER] = items[0]["method"]
            if unsendable_routing(self.version, items[0]["method"]):
                log.warning("message not delivered: its method cannot be a header", extra={"sent": what})
                return
        response = await self._reader.post_one_way(body, headers, what)
        if response is not None and not response.is_success:
            log_refused(response, what)

    # -- the proxy's own tools/list ----------------------------------------------------------------

    async def _learn_tool(self, name: str, params: dict[str, Any], version: str) -> None:
        """Make sure the tool's `x-mcp-header` map is known, listing the tools once if it is not.

        A stdio client may call a tool without listing first; the upstream still checks the
        `Mcp-Param-*` headers, so the proxy lists the tools itself (under its own ids, with the
        calling request's envelope) and keeps the answers to itself.
        """
        tools = self._reader.tools
        if tools.knows(name) or tools.complete:
            return
        async with self._listing:
            if tools.knows(name) or tools.complete:
                return
            meta = params.get("_meta")
            envelope = {k: v for k, v in (meta or {}).items() if k.startswith(protocol.ENVELOPE_PREFIX)}
            cursor: str | None = None
            for _ in range(LIST_PAGE_CAP):
                list_params: dict[str, Any] = {"_meta": envelope}
                if cursor is not None:
                    list_params["cursor"] = cursor
                result = await self._own_request(protocol.TOOLS_LIST, list_params, version)
                if result is None:
                    return
                next_cursor = result.get("nextCursor")
                tools.learn(result, last_page=not isinstance(next_cursor, str))
                if tools.knows(name) or not isinstance(next_cursor, str):
                    return
                cursor = next_cursor
            tools.complete = True

    async def _own_request(self, method: str, params: dict[str, Any], version: str) -> dict[str, Any] | None:
        """A request of the proxy's own; its result, or None (logged) when it fails."""
        request_id = f"{OWN_ID_PREFIX}{next(self._own_ids)}"
        body = jsonrpc.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        headers = self._reader.post_headers()
        headers.update(stateless_headers(version, method, params, {}))
        found: list[Any] = []

        async def on_event(data: Payload) -> bool:
            if not isinstance(data, bytes):
                return False
            try:
                message = jsonrpc.decode(data)
            except ValueError:
                return False
            if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
                found.append(message)
                return True
            return False

        reader = self._reader
        try:
            async with reader.http.stream("POST", reader.url, content=body, headers=headers) as response:
                kind = media_type(response)
                if response.is_success and kind == protocol.SSE_TYPE:
                    await reader.read_events(response, Cursor(), on_event)
                elif response.is_success and kind == protocol.JSON_TYPE:
                    payload = await read_limited(response, reader.settings.max_message_bytes)
                    if isinstance(payload, bytes):
                        await on_event(payload)
                else:
                    log.warning(f"the proxy's own {method} failed", extra={"status": response.status_code})
        except httpx2.RequestError as exc:
            log.warning(f"the proxy's own {method} failed", extra={"error": describe_transport_error(exc)})
        result = found[0].get("result") if found else None
        return result if isinstance(result, dict) else None


def _tool_called(exchange: PostExchange) -> str | None:
    """The tool a `tools/call` names (None for any other request)."""
    params = exchange.params
    if exchange.method != protocol.TOOLS_CALL or not isinstance(params, dict):
        return None
    name = params.get("name")
    return name if isinstance(name, str) else None
