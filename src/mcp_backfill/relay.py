"""The protocol-aware relay between one client session and one upstream session.

It forwards every message unchanged (the original bytes) except for its two interceptions:
the client's `initialize` gets `sampling: {tools: {}}` merged into its capabilities, and the
server's `sampling/createMessage` requests that the client cannot answer are answered here by the
`Sampler`. It knows the protocol, not the transport: both sides are `MessageChannel`s.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc
from mcp_backfill.config import Mode
from mcp_backfill.logs import get_logger
from mcp_backfill.progress import progress_notifier
from mcp_backfill.sampling.errors import SamplingError
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.transports.base import MessageChannel, MessageTooLarge

log = get_logger("relay")

SAMPLING_METHOD = "sampling/createMessage"
CANCELLED_NOTIFICATION = "notifications/cancelled"
HANDSHAKE_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
BACKFILLED_SAMPLING: dict[str, Any] = {"tools": {}}


def backfill_capabilities(capabilities: Any, mode: Mode) -> dict[str, Any] | None:
    """The client's capabilities with sampling (with tools) merged in, or None if nothing changes.

    Everything the client declared is kept, including `sampling.context` and unknown keys.
    """
    if mode == "off":
        return None
    declared = capabilities if isinstance(capabilities, dict) else {}
    sampling = declared.get("sampling")
    if isinstance(sampling, dict) and isinstance(sampling.get("tools"), dict):
        return None
    merged = dict(declared)
    merged["sampling"] = {
        **(sampling if isinstance(sampling, dict) else {}),
        **copy.deepcopy(BACKFILLED_SAMPLING),
    }
    return merged


def wants_tools(params: dict[str, Any]) -> bool:
    """Does a sampling request use the tools extension (released or draft spelling)?"""
    return any(key in params for key in ("tools", "toolChoice", "tool_choice"))


@dataclass
class ClientProfile:
    """What the client told us about itself in `initialize`."""

    sampling: dict[str, Any] | None = None

    def can_sample(self, params: dict[str, Any]) -> bool:
        if self.sampling is None:
            return False
        return not wants_tools(params) or isinstance(self.sampling.get("tools"), dict)


@dataclass
class PendingRequest:
    method: str
    request_id: Any


@dataclass
class RelayState:
    """Per-session protocol state; ids are tracked per direction because the two id spaces overlap."""

    client: ClientProfile = field(default_factory=ClientProfile)
    protocol_version: str | None = None
    client_requests: dict[jsonrpc.IdKey, PendingRequest] = field(default_factory=dict)
    answering: dict[jsonrpc.IdKey, anyio.CancelScope] = field(default_factory=dict)
    warned_versions: set[str] = field(default_factory=set)


class Relay:
    """Moves messages between `client` and `upstream` until the upstream side ends."""

    def __init__(
        self, mode: Mode, sampler: Sampler, client: MessageChannel, upstream: MessageChannel
    ) -> None:
        self.mode = mode
        self.sampler = sampler
        self.client = client
        self.upstream = upstream
        self.state = RelayState()

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, on_client_closed: Callable[[], Awaitable[None]]) -> None:
        """Relay until the upstream closes; `on_client_closed` runs when the client side ends first."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump_client, on_client_closed)
            await self._pump_upstream(tg)
            tg.cancel_scope.cancel()

    async def fail_pending(self, reason: str) -> None:
        """Answer every client request still waiting for the upstream with an error."""
        pending = list(self.state.client_requests.values())
        self.state.client_requests.clear()
        for request in pending:
            await self._send_client(
                jsonrpc.encode(jsonrpc.error_response(request.request_id, jsonrpc.INTERNAL_ERROR, reason))
            )

    async def _pump_client(self, on_client_closed: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                raw = await self.client.receive()
            except anyio.EndOfStream:
                log.info("client closed its side of the session")
                await on_client_closed()
                return
            except MessageTooLarge as exc:
                await self._too_large(exc, from_client=True)
                continue
            await self._from_client(raw)

    async def _pump_upstream(self, tg: TaskGroup) -> None:
        while True:
            try:
                raw = await self.upstream.receive()
            except anyio.EndOfStream:
                return
            except MessageTooLarge as exc:
                await self._too_large(exc, from_client=False)
                continue
            await self._from_upstream(tg, raw)

    async def _too_large(self, exc: MessageTooLarge, *, from_client: bool) -> None:
        """A message was too large to relay: answer for it so that no request waits forever.

        A dropped request is refused to its sender; a dropped response becomes an error response
        for the side that is waiting for it.
        """
        sender = "client" if from_client else "upstream"
        found, request_id, is_request = jsonrpc.salvage_envelope(exc.head, exc.tail)
        log.warning(
            f"message from the {sender} too large; dropped",
            extra={"size": exc.size, "limit": exc.limit, "request_id": request_id if found else None},
        )
        hint = f"Message too large: {exc}; raise --max-message-bytes to allow it"
        if is_request or (from_client and not found):
            reply = jsonrpc.encode(jsonrpc.error_response(request_id, jsonrpc.INVALID_REQUEST, hint))
            await (self._send_client(reply) if from_client else self._send_upstream(reply))
        elif found and from_client:
            await self._send_upstream(
                jsonrpc.encode(jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, hint))
            )
        elif found and self.state.client_requests.pop(jsonrpc.id_key(request_id), None) is not None:
            await self._send_client(
                jsonrpc.encode(jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, hint))
            )

    # -- client -> upstream ----------------------------------------------------------------------

    async def _from_client(self, raw: bytes) -> None:
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from client", extra={"error": str(exc), "line": jsonrpc.preview(raw)}
            )
            await self._send_client(
                jsonrpc.encode(jsonrpc.error_response(None, jsonrpc.PARSE_ERROR, f"Parse error: {exc}"))
            )
            return
        if isinstance(message, list):
            items = [self._client_item(item) for item in message]
            if any(item is not original for item, original in zip(items, message, strict=True)):
                raw = jsonrpc.encode(items)
        else:
            item = self._client_item(message)
            if item is not message:
                raw = jsonrpc.encode(item)
        await self._send_upstream(raw)

    def _client_item(self, message: Any) -> Any:
        """Track one client message; return it, or a modified copy when it must be rewritten."""
        if not isinstance(message, dict):
            return message
        method = message.get("method")
        if "id" in message and isinstance(method, str):
            key = jsonrpc.id_key(message["id"])
            self.state.client_requests[key] = PendingRequest(method, message["id"])
            if method == "initialize":
                return self._rewrite_initialize(message)
            self._note_modern_envelope(message)
        elif method == CANCELLED_NOTIFICATION:
            params = message.get("params")
            if isinstance(params, dict) and "requestId" in params:
                self.state.client_requests.pop(jsonrpc.id_key(params["requestId"]), None)
        return message

    def _rewrite_initialize(self, message: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        capabilities = params.get("capabilities")
        sampling = capabilities.get("sampling") if isinstance(capabilities, dict) else None
        self.state.client = ClientProfile(sampling=sampling if isinstance(sampling, dict) else None)
        version = params.get("protocolVersion")
        if isinstance(version, str):
            self._check_version(version)
        merged = backfill_capabilities(capabilities, self.mode)
        log.info(
            "client initialize",
            extra={
                "client_sampling": self.state.client.sampling,
                "backfilled": merged is not None,
                "mode": self.mode,
                "protocol_version": version,
            },
        )
        if merged is None:
            return message
        return {**message, "params": {**params, "capabilities": merged}}

    def _note_modern_envelope(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get("io.modelcontextprotocol/protocolVersion") if isinstance(meta, dict) else None
        if isinstance(version, str):
            self._check_version(version)

    def _check_version(self, version: str) -> None:
        if version in HANDSHAKE_VERSIONS or version in self.state.warned_versions:
            return
        self.state.warned_versions.add(version)
        log.warning(
            "protocol revision not supported by this proxy version; its traffic passes through untouched",
            extra={"protocol_version": version},
        )

    # -- upstream -> client ----------------------------------------------------------------------

    async def _from_upstream(self, tg: TaskGroup, raw: bytes) -> None:
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from upstream; dropped",
                extra={"error": str(exc), "line": jsonrpc.preview(raw)},
            )
            return
        if isinstance(message, list):
            kept = [item for item in message if not self._upstream_item(tg, item)]
            if len(kept) != len(message):
                if not kept:
                    return
                raw = jsonrpc.encode(kept)
        elif self._upstream_item(tg, message):
            return
        await self._send_client(raw)

    def _upstream_item(self, tg: TaskGroup, message: Any) -> bool:
        """Track one upstream message; True when the proxy consumed it (not to be forwarded)."""
        if not isinstance(message, dict):
            return False
        method = message.get("method")
        if method is None:
            pending = self.state.client_requests.pop(jsonrpc.id_key(message.get("id")), None)
            if pending is not None and pending.method == "initialize":
                result = message.get("result")
                if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                    self.state.protocol_version = result["protocolVersion"]
                    self._check_version(self.state.protocol_version)
                    log.info("session initialized", extra={"protocol_version": self.state.protocol_version})
            return False
        if method == SAMPLING_METHOD and "id" in message:
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if self._should_answer(params):
                self._start_sampling(tg, message["id"], params)
                return True
            return False
        if method == CANCELLED_NOTIFICATION:
            params = message.get("params")
            if isinstance(params, dict):
                scope = self.state.answering.get(jsonrpc.id_key(params.get("requestId")))
                if scope is not None:
                    log.info(
                        "upstream cancelled a sampling request", extra={"request_id": params.get("requestId")}
                    )
                    scope.cancel()
                    return True
        return False

    def _should_answer(self, params: dict[str, Any]) -> bool:
        if self.mode == "off":
            return False
        if self.mode == "always":
            return True
        return not self.state.client.can_sample(params)

    # -- sampling --------------------------------------------------------------------------------

    def _start_sampling(self, tg: TaskGroup, request_id: Any, params: dict[str, Any]) -> None:
        scope = anyio.CancelScope()
        self.state.answering[jsonrpc.id_key(request_id)] = scope
        tg.start_soon(self._answer_sampling, request_id, params, scope)

    async def _answer_sampling(
        self, request_id: Any, params: dict[str, Any], scope: anyio.CancelScope
    ) -> None:
        response: dict[str, Any] | None = None
        try:
            with scope:
                try:
                    progress = progress_notifier(params, self._send_upstream)
                    result = await self.sampler.sample(params, request_id=request_id, progress=progress)
                    response = jsonrpc.result_response(request_id, result)
                except SamplingError as exc:
                    response = jsonrpc.error_response(request_id, exc.code, exc.message, exc.data)
                except Exception:
                    log.exception("sampling failed unexpectedly", extra={"request_id": request_id})
                    response = jsonrpc.error_response(
                        request_id, jsonrpc.INTERNAL_ERROR, "Internal error in mcp-backfill while sampling"
                    )
        finally:
            self.state.answering.pop(jsonrpc.id_key(request_id), None)
        if response is not None:  # None: cancelled by the server, which expects no answer
            await self._send_upstream(jsonrpc.encode(response))

    # -- writing ---------------------------------------------------------------------------------

    async def _send_client(self, raw: bytes) -> None:
        try:
            await self.client.send(raw)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.debug("client is gone; message dropped", extra={"line": jsonrpc.preview(raw)})

    async def _send_upstream(self, raw: bytes) -> None:
        try:
            await self.upstream.send(raw)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.warning("upstream is gone; message dropped", extra={"line": jsonrpc.preview(raw)})
