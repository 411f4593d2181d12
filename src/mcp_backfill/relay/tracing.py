"""The relay's spans: one per request it relays in either direction, or answers itself.

A client request's span starts when the relay receives it and ends when the client gets its final
answer (after any `input_required` rounds the proxy drove), an error, or cancels it; a server
request's span (elicitation, roots, sampling passed through) ends with the client's response. The
span's trace context goes into the `_meta` of the forwarded request, so the next hop's spans are
its children. The relay calls none of this unless tracing is on (`enabled`).
"""

from __future__ import annotations

from typing import Any

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.telemetry import RequestSpan, Telemetry

TRACESTATE = "tracestate"


def with_trace_context(message: dict[str, Any], span: RequestSpan) -> dict[str, Any]:
    """A copy of the request `message` whose `params._meta` carries `span`'s trace context.

    Positional `params` (an array) have no `_meta`: such a request goes on as it came. The incoming
    `tracestate` goes: the span's own (its parent's, when it has one) is written in its place, and
    with no valid parent the old one belongs to no trace (W3C Trace Context drops it then).
    """
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        return message
    params = dict(params) if isinstance(params, dict) else {}
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta.pop(TRACESTATE, None)
    span.inject(meta)
    params["_meta"] = meta
    return {**message, "params": params}


def _declared_version(method: str, params: Any) -> Any:
    """The revision a request names: `initialize`'s, or a 2026-07-28 request's `_meta` envelope."""
    if not isinstance(params, dict):
        return None
    if method == protocol.INITIALIZE:
        return params.get("protocolVersion")
    meta = params.get("_meta")
    return meta.get(protocol.META_PROTOCOL_VERSION) if isinstance(meta, dict) else None


def _is_tool_error(response: dict[str, Any]) -> bool:
    result = response.get("result")
    return isinstance(result, dict) and result.get("isError") is True


class RequestTraces:
    """Open request spans of one session, by the id their sender gave them."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.enabled = telemetry.enabled
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._client: dict[jsonrpc.IdKey, RequestSpan] = {}
        self._server: dict[jsonrpc.IdKey, RequestSpan] = {}

    def start(self, message: dict[str, Any], *, sender: str) -> RequestSpan:
        """A span for the request `message` received from `sender` ("client" or "server"), ended
        by the response that goes back to it."""
        span = self.answering(message, sender=sender)
        table = self._client if sender == "client" else self._server
        table[jsonrpc.id_key(message["id"])] = span
        return span

    def answering(self, message: dict[str, Any], *, sender: str = "server") -> RequestSpan:
        """A span for a request the proxy answers itself; whoever answers ends it."""
        params = message.get("params")
        version = self.protocol_version or _declared_version(message["method"], params)
        return self.telemetry.request(
            message["method"],
            message.get("id"),
            params,
            sender=sender,
            protocol_version=version if isinstance(version, str) else None,
            session_id=self.session_id,
        )

    def relayed(self, message: dict[str, Any], *, sender: str) -> dict[str, Any]:
        """Start the span of a request being forwarded; returns the request with its trace context."""
        return with_trace_context(message, self.start(message, sender=sender))

    def client_span(self, request_id: Any) -> RequestSpan | None:
        return self._client.get(jsonrpc.id_key(request_id))

    def answered(self, response: Any, *, by: str) -> None:
        """A response (or a batch holding some) is on its way to the peer that sent the request:
        `by` is who answered it ("server": the client's request; "client": the server's)."""
        for item in response if isinstance(response, list) else (response,):
            if not isinstance(item, dict) or "method" in item or "id" not in item:
                continue
            table = self._client if by == "server" else self._server
            span = table.pop(jsonrpc.id_key(item["id"]), None)
            if span is not None:
                error = item.get("error")
                span.end(error if isinstance(error, dict) else None, tool_error=_is_tool_error(item))

    def answered_raw(self, raw: bytes) -> None:
        """As `answered`, for a message the relay forwards as bytes (decoded only when a client
        request is waiting for its answer)."""
        if not self._client:
            return
        try:
            message = jsonrpc.decode(raw)
        except ValueError:
            return
        self.answered(message, by="server")

    def ended_without_answer(self, request_id: Any, *, sender: str = "client") -> None:
        """The request's sender (`"client"` or `"server"`) cancelled it: no answer is coming."""
        table = self._client if sender == "client" else self._server
        span = table.pop(jsonrpc.id_key(request_id), None)
        if span is not None:
            span.cancel()

    def close(self) -> None:
        """The session ended: the spans still open end unanswered."""
        for span in (*self._client.values(), *self._server.values()):
            span.cancel()
        self._client.clear()
        self._server.clear()
