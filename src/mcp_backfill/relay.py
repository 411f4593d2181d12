"""The protocol-aware relay between one client session and one upstream session.

It forwards every message unchanged (the original bytes) except for its interceptions, which
depend on the protocol era:

* handshake era (2024-11-05 … 2025-11-25): the client's `initialize` gets `sampling: {tools: {}}`
  merged into its capabilities, and the server's `sampling/createMessage` requests that the client
  cannot answer are answered here by the `Sampler`;
* 2026-07-28: every request's `_meta` capabilities get the same merge, and `input_required`
  results of `tools/call`, `prompts/get` and `resources/read` are driven here: the proxy answers the
  sampling questions, re-sends the request under its own id, and gives the client the final result
  (or a reduced round holding only the questions the client answers itself).

It knows the protocol, not the transport: both sides are `MessageChannel`s.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import input_required as ir
from mcp_backfill import jsonrpc, protocol
from mcp_backfill.config import Era, Mode
from mcp_backfill.errors import MessageTooLarge, SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.progress import progress_notifier
from mcp_backfill.sampling.provider import ProgressCallback
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import SamplingSession
from mcp_backfill.transports.base import MessageChannel

log = get_logger("relay")

BACKFILLED_SAMPLING: dict[str, Any] = {"tools": {}}
# Upstream responses this large are routed by the id at their head, without decoding them.
LARGE_MESSAGE = 64 * 1024
# Ids the proxy gives its own re-sent requests; a string prefix no SDK counter produces.
OWN_ID_PREFIX = "mcp-backfill:"


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
    """What the client declared about sampling (in `initialize`, or in a 2026 request's `_meta`)."""

    sampling: dict[str, Any] | None = None

    @classmethod
    def from_capabilities(cls, capabilities: Any) -> ClientProfile:
        sampling = capabilities.get("sampling") if isinstance(capabilities, dict) else None
        return cls(sampling=sampling if isinstance(sampling, dict) else None)

    def can_sample(self, params: dict[str, Any]) -> bool:
        if self.sampling is None:
            return False
        return not wants_tools(params) or isinstance(self.sampling.get("tools"), dict)

    def samples_with_tools(self) -> bool:
        return self.sampling is not None and isinstance(self.sampling.get("tools"), dict)


def proxy_answers(mode: Mode, client: ClientProfile, params: dict[str, Any]) -> bool:
    """Does the proxy answer this sampling request, rather than the client?"""
    if mode == "off":
        return False
    return mode == "always" or not client.can_sample(params)


@dataclass(frozen=True)
class RelayOptions:
    mode: Mode = "fallback"
    era: Era = "auto"
    # Rounds of `input_required` the proxy drives for one client request before giving up.
    max_input_rounds: int = 10
    # How long the proxy keeps its answers to a mixed round while the client answers its part.
    input_stash_ttl: float = 300.0
    # Pause before re-sending a state-only ("retry later") round, as SDK clients do.
    state_only_backoff: tuple[float, float] = (0.05, 0.25)


@dataclass
class InputChain:
    """A 2026 request whose `input_required` rounds the proxy may drive on the client's behalf."""

    method: str
    base_params: dict[str, Any]
    client: ClientProfile
    rounds: int = 0
    # While the proxy samples for a round there is no upstream request in flight.
    upstream_id: Any = None
    scope: anyio.CancelScope | None = None


@dataclass
class PendingRequest:
    """A client request waiting for the upstream, keyed by the id it has upstream."""

    method: str
    request_id: Any  # the client's own id
    chain: InputChain | None = None


@dataclass
class RelayState:
    """Per-session protocol state; ids are tracked per direction because the two id spaces overlap."""

    client: ClientProfile = field(default_factory=ClientProfile)
    protocol_version: str | None = None
    client_requests: dict[jsonrpc.IdKey, PendingRequest] = field(default_factory=dict)
    answering: dict[jsonrpc.IdKey, anyio.CancelScope] = field(default_factory=dict)
    # Client requests whose input_required rounds the proxy is driving, by the client's id.
    driving: dict[jsonrpc.IdKey, PendingRequest] = field(default_factory=dict)
    warned_versions: set[str] = field(default_factory=set)


class Relay:
    """Moves messages between `client` and `upstream` until the upstream side ends."""

    def __init__(
        self,
        options: RelayOptions,
        sampler: Sampler,
        client: MessageChannel,
        upstream: MessageChannel,
        *,
        session: SamplingSession | None = None,
    ) -> None:
        self.options = options
        self.mode = options.mode
        self.sampler = sampler
        self.session = session
        self.client = client
        self.upstream = upstream
        self.state = RelayState()
        self.stash = ir.Stash(ttl=options.input_stash_ttl)
        self._own_ids = itertools.count(1)
        self._tg: TaskGroup | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, on_client_closed: Callable[[], Awaitable[None]]) -> None:
        """Relay until the upstream closes; `on_client_closed` runs when the client side ends first."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._pump_client, on_client_closed)
            await self._pump_upstream()
            tg.cancel_scope.cancel()

    async def fail_pending(self, reason: str) -> None:
        """Answer every client request still waiting for the upstream (or for the proxy) with an error."""
        waiting = {jsonrpc.id_key(p.request_id): p for p in self.state.client_requests.values()}
        waiting.update(self.state.driving)
        self.state.client_requests.clear()
        self.state.driving.clear()
        for request in waiting.values():
            if request.chain is not None and request.chain.scope is not None:
                request.chain.scope.cancel()
            await self._reply_error(request.request_id, protocol.INTERNAL_ERROR, reason)

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
            del raw  # do not hold a large message while waiting for the next one

    async def _pump_upstream(self) -> None:
        while True:
            try:
                raw, origin = await self.upstream.receive_with_origin()
            except anyio.EndOfStream:
                return
            except MessageTooLarge as exc:
                await self._too_large(exc, from_client=False)
                continue
            await self._from_upstream(raw, origin)
            del raw  # do not hold a large message while waiting for the next one

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
            reply = jsonrpc.encode(jsonrpc.error_response(request_id, protocol.INVALID_REQUEST, hint))
            await (self._send_client(reply) if from_client else self._send_upstream(reply))
        elif found and from_client:
            await self._send_upstream(
                jsonrpc.encode(jsonrpc.error_response(request_id, protocol.INTERNAL_ERROR, hint))
            )
        elif found:
            pending = self.state.client_requests.pop(jsonrpc.id_key(request_id), None)
            if pending is not None:
                self._end_chain(pending)
                await self._reply_error(pending.request_id, protocol.INTERNAL_ERROR, hint)

    # -- client -> upstream ----------------------------------------------------------------------

    async def _from_client(self, raw: bytes) -> None:
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from client", extra={"error": str(exc), "line": jsonrpc.preview(raw)}
            )
            await self._send_client(
                jsonrpc.encode(jsonrpc.error_response(None, protocol.PARSE_ERROR, f"Parse error: {exc}"))
            )
            return
        replies: list[dict[str, Any]] = []
        if isinstance(message, list):
            items = [self._client_item(item, replies) for item in message]
            kept = [item for item in items if item is not None]
            if len(kept) != len(message) or any(a is not b for a, b in zip(items, message, strict=True)):
                raw = jsonrpc.encode(kept) if kept else b""
        else:
            item = self._client_item(message, replies)
            if item is not message:
                raw = jsonrpc.encode(item) if item is not None else b""
        if raw:
            await self._send_upstream(raw)
        for reply in replies:
            await self._send_client(jsonrpc.encode(reply))

    def _client_item(self, message: Any, replies: list[dict[str, Any]]) -> Any:
        """Track one client message; return it, a rewritten copy, or None when the proxy consumed it.

        Answers the proxy gives the client itself are appended to `replies`.
        """
        if not isinstance(message, dict):
            return message
        method = message.get("method")
        if "id" in message and isinstance(method, str):
            if method == protocol.DISCOVER and self.options.era == "handshake":
                replies.append(
                    jsonrpc.error_response(
                        message["id"],
                        protocol.METHOD_NOT_FOUND,
                        "Method not found: server/discover (mcp-backfill runs with --era handshake; "
                        "use initialize)",
                    )
                )
                return None
            pending = PendingRequest(method, message["id"])
            if method == protocol.INITIALIZE:
                self.state.client_requests[jsonrpc.id_key(message["id"])] = pending
                return self._rewrite_initialize(message)
            rewritten = self._rewrite_modern_request(message, pending, replies)
            if rewritten is not None:
                self.state.client_requests[jsonrpc.id_key(message["id"])] = pending
            return rewritten
        if method == protocol.CANCELLED:
            return self._client_cancelled(message)
        return message

    def _rewrite_initialize(self, message: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        capabilities = params.get("capabilities")
        self.state.client = ClientProfile.from_capabilities(capabilities)
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

    def _rewrite_modern_request(
        self, message: dict[str, Any], pending: PendingRequest, replies: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """A 2026 request: capabilities merged; input_required methods set up for driving.

        Returns the message to send upstream, or None when the proxy answered it itself.
        """
        meta = ir.envelope(message.get("params"))
        if meta is None or pending.method == protocol.DISCOVER:
            return message
        version = meta[protocol.META_PROTOCOL_VERSION]
        self._check_version(version)
        if version != protocol.STATELESS_VERSION:
            return message  # an unknown revision passes through untouched
        declared = ir.declared_capabilities(meta)
        merged = backfill_capabilities(declared, self.mode)
        if merged is None:
            return message  # nothing to backfill: every round goes to the client untouched
        rewritten = ir.with_capabilities(message, merged)
        if pending.method not in protocol.INPUT_REQUIRED_METHODS:
            return rewritten
        params: dict[str, Any] = rewritten["params"]
        rounds = 0
        token = ir.stash_token(params)
        if token is not None:
            stashed = self.stash.take(token)
            if stashed is None:
                replies.append(
                    jsonrpc.error_response(
                        message["id"],
                        protocol.INVALID_PARAMS,
                        "requestState expired or unknown: mcp-backfill keeps its answers to a round "
                        f"for {self.options.input_stash_ttl:g} s; retry the request from the start",
                    )
                )
                return None
            params = ir.restore_params(params, stashed)
            rewritten = {**rewritten, "params": params}
            rounds = stashed.rounds
        client = ClientProfile.from_capabilities(declared)
        pending.chain = InputChain(pending.method, ir.base_params(params), client, rounds, message["id"])
        return rewritten

    def _client_cancelled(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The client gave up on a request: stop driving it, and cancel it upstream under its upstream id."""
        params = message.get("params")
        if not isinstance(params, dict) or "requestId" not in params:
            return message
        key = jsonrpc.id_key(params["requestId"])
        driven = self.state.driving.pop(key, None)
        if driven is None:
            self.state.client_requests.pop(key, None)
            return message
        chain = driven.chain
        assert chain is not None
        log.info("client cancelled a request the proxy is driving", extra={"request_id": driven.request_id})
        if chain.scope is not None:
            chain.scope.cancel()
        if chain.upstream_id is None:
            return None  # between rounds: nothing is in flight upstream
        self.state.client_requests.pop(jsonrpc.id_key(chain.upstream_id), None)
        if jsonrpc.id_key(chain.upstream_id) == key:
            return message
        return {**message, "params": {**params, "requestId": chain.upstream_id}}

    def _check_version(self, version: str) -> None:
        if version in protocol.SUPPORTED_VERSIONS or version in self.state.warned_versions:
            return
        self.state.warned_versions.add(version)
        log.warning(
            "protocol revision not supported by this proxy version; its traffic passes through untouched",
            extra={"protocol_version": version},
        )

    # -- upstream -> client ----------------------------------------------------------------------

    async def _from_upstream(self, raw: bytes, origin: Any = None) -> None:
        """`origin`: the upstream-side id of the request whose response stream carried `raw`."""
        related = self._client_id_for(origin)
        if len(raw) >= LARGE_MESSAGE and self._plain_response(raw):
            await self._send_client(raw, related)
            return
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from upstream; dropped",
                extra={"error": str(exc), "line": jsonrpc.preview(raw)},
            )
            return
        if isinstance(message, list):
            items = [self._upstream_item(item) for item in message]
            kept = [item for item in items if item is not None]
            if len(kept) != len(message) or any(a is not b for a, b in zip(items, message, strict=True)):
                if not kept:
                    return
                raw = jsonrpc.encode(kept)
        else:
            item = self._upstream_item(message)
            if item is None:
                return
            if item is not message:
                raw = jsonrpc.encode(item)
        await self._send_client(raw, related)

    def _plain_response(self, raw: bytes) -> bool:
        """Is `raw` a response the relay forwards untouched? Then it need not be decoded.

        Large tool results are the bulk of the bytes a session moves; decoding one only to find
        its id costs more than all the rest of the relay's work. The id is read from the head
        of the message; requests the relay rewrites answers to (initialize, 2026 rounds it may
        drive, re-sent rounds) are not taken this way.
        """
        found, upstream_id = jsonrpc.response_head_id(raw)
        if not found:
            return False
        key = jsonrpc.id_key(upstream_id)
        pending = self.state.client_requests.get(key)
        if pending is None or pending.chain is not None or pending.method == protocol.INITIALIZE:
            return False
        if jsonrpc.id_key(pending.request_id) != key:
            return False
        del self.state.client_requests[key]
        return True

    def _client_id_for(self, upstream_id: Any) -> Any:
        """The client's id for a request known upstream as `upstream_id` (None stays None)."""
        if upstream_id is None:
            return None
        pending = self.state.client_requests.get(jsonrpc.id_key(upstream_id))
        return pending.request_id if pending is not None else upstream_id

    def _upstream_item(self, message: Any) -> Any:
        """Track one upstream message; return it, a rewritten copy, or None when the proxy consumed it."""
        if not isinstance(message, dict):
            return message
        method = message.get("method")
        if method is None:
            return self._upstream_response(message)
        if method == protocol.SAMPLING and "id" in message:
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if proxy_answers(self.mode, self.state.client, params):
                self._start_sampling(message["id"], params)
                return None
            return message
        if method == protocol.CANCELLED:
            params = message.get("params")
            if isinstance(params, dict):
                scope = self.state.answering.get(jsonrpc.id_key(params.get("requestId")))
                if scope is not None:
                    log.info(
                        "upstream cancelled a sampling request", extra={"request_id": params.get("requestId")}
                    )
                    scope.cancel()
                    return None
        return message

    def _upstream_response(self, message: dict[str, Any]) -> Any:
        upstream_id = message.get("id")
        pending = self.state.client_requests.pop(jsonrpc.id_key(upstream_id), None)
        if pending is None:
            if isinstance(upstream_id, str) and upstream_id.startswith(OWN_ID_PREFIX):
                log.debug("response to a request the client cancelled; dropped", extra={"id": upstream_id})
                return None
            return message
        if pending.method == protocol.INITIALIZE:
            self._note_initialized(message)
        chain = pending.chain
        if chain is not None:
            result = message.get("result")
            if ir.is_input_required(result):
                return self._input_required(pending, chain, result)
            self._end_chain(pending)
        if upstream_id is pending.request_id:
            return message
        return {**message, "id": pending.request_id}

    def _note_initialized(self, message: dict[str, Any]) -> None:
        result = message.get("result")
        if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
            self.state.protocol_version = result["protocolVersion"]
            self._check_version(self.state.protocol_version)
            log.info("session initialized", extra={"protocol_version": self.state.protocol_version})

    # -- 2026-07-28: driving input_required rounds -------------------------------------------------

    def _input_required(
        self, pending: PendingRequest, chain: InputChain, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Take a round over when it holds questions for the proxy; otherwise hand it to the client."""
        current = ir.split_round(result, lambda params: proxy_answers(self.mode, chain.client, params))
        if not current.mine and not current.state_only:
            self._end_chain(pending)
            return jsonrpc.result_response(pending.request_id, result)
        chain.upstream_id = None
        chain.scope = anyio.CancelScope()
        self.state.driving[jsonrpc.id_key(pending.request_id)] = pending
        assert self._tg is not None
        self._tg.start_soon(self._drive_round, pending, chain, result, current)
        return None

    async def _drive_round(
        self, pending: PendingRequest, chain: InputChain, result: dict[str, Any], current: ir.Round
    ) -> None:
        """Answer the proxy's questions of a round, then re-send the request or hand the rest over."""
        if chain.rounds >= self.options.max_input_rounds:
            self._end_chain(pending)
            await self._reply_error(
                pending.request_id,
                protocol.INTERNAL_ERROR,
                f"The server asked for input more than {self.options.max_input_rounds} times for one "
                "request; raise --max-input-rounds to allow more rounds",
                {"rounds": chain.rounds},
            )
            return
        answers: dict[str, Any] = {}
        assert chain.scope is not None
        with chain.scope:
            try:
                answers = await self._answer_round(pending.request_id, current.mine)
                if current.state_only:
                    await anyio.sleep(random.uniform(*self.options.state_only_backoff))
            except SamplingError as exc:
                self._end_chain(pending)
                await self._reply_error(pending.request_id, exc.code, exc.message, exc.data)
                return
        chain.scope = None
        if jsonrpc.id_key(pending.request_id) not in self.state.driving:
            return  # cancelled by the client, or failed by a dying upstream: it expects nothing more
        if current.theirs:
            self._end_chain(pending)
            token = self.stash.put(answers, current.has_state, current.state, chain.rounds)
            log.info(
                "mixed input round: the client answers the rest",
                extra={
                    "request_id": pending.request_id,
                    "proxy_keys": list(answers),
                    "client_keys": list(current.theirs),
                },
            )
            await self._send_client(
                jsonrpc.encode(
                    jsonrpc.result_response(
                        pending.request_id, ir.reduced_result(result, current.theirs, token)
                    )
                )
            )
            return
        chain.rounds += 1
        upstream_id = f"{OWN_ID_PREFIX}{next(self._own_ids)}"
        chain.upstream_id = upstream_id
        self.state.client_requests[jsonrpc.id_key(upstream_id)] = pending
        params = ir.retry_params(chain.base_params, answers, current.has_state, current.state)
        log.info(
            "input round answered; request re-sent",
            extra={"request_id": pending.request_id, "upstream_id": upstream_id, "round": chain.rounds},
        )
        await self._send_upstream(
            jsonrpc.encode({"jsonrpc": "2.0", "id": upstream_id, "method": chain.method, "params": params})
        )

    async def _answer_round(self, request_id: Any, questions: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Answer a round's sampling questions concurrently; the first failure fails the round."""
        answers: dict[str, Any] = {}
        failures: list[SamplingError] = []

        async def answer(key: str, params: dict[str, Any], tg: TaskGroup) -> None:
            try:
                answers[key] = await self._sample(params, f"{request_id}/{key}")
            except SamplingError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for key, params in questions.items():
                tg.start_soon(answer, key, params, tg)
        if failures:
            raise failures[0]
        return answers

    def _end_chain(self, pending: PendingRequest) -> None:
        self.state.driving.pop(jsonrpc.id_key(pending.request_id), None)

    # -- sampling --------------------------------------------------------------------------------

    def _start_sampling(self, request_id: Any, params: dict[str, Any]) -> None:
        scope = anyio.CancelScope()
        self.state.answering[jsonrpc.id_key(request_id)] = scope
        assert self._tg is not None
        self._tg.start_soon(self._answer_sampling, request_id, params, scope)

    async def _answer_sampling(
        self, request_id: Any, params: dict[str, Any], scope: anyio.CancelScope
    ) -> None:
        response: dict[str, Any] | None = None
        try:
            with scope:
                try:
                    response = jsonrpc.result_response(
                        request_id,
                        await self._sample(
                            params, request_id, progress_notifier(params, self._send_upstream)
                        ),
                    )
                except SamplingError as exc:
                    response = jsonrpc.error_response(request_id, exc.code, exc.message, exc.data)
        finally:
            self.state.answering.pop(jsonrpc.id_key(request_id), None)
        if response is not None:  # None: cancelled by the server, which expects no answer
            await self._send_upstream(jsonrpc.encode(response))

    async def _sample(
        self, params: dict[str, Any], request_id: Any, progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """The sampler's answer; an unexpected failure becomes an internal `SamplingError`."""
        try:
            return await self.sampler.sample(
                params, request_id=request_id, session=self.session, progress=progress
            )
        except SamplingError:
            raise
        except Exception:
            log.exception("sampling failed unexpectedly", extra={"request_id": request_id})
            raise SamplingError(
                protocol.INTERNAL_ERROR, "Internal error in mcp-backfill while sampling"
            ) from None

    # -- writing ---------------------------------------------------------------------------------

    async def _reply_error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        await self._send_client(jsonrpc.encode(jsonrpc.error_response(request_id, code, message, data)))

    async def _send_client(self, raw: bytes, related: Any = None) -> None:
        try:
            await self.client.send(raw, related)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.debug("client is gone; message dropped", extra={"line": jsonrpc.preview(raw)})

    async def _send_upstream(self, raw: bytes) -> None:
        try:
            await self.upstream.send(raw)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.warning("upstream is gone; message dropped", extra={"line": jsonrpc.preview(raw)})
