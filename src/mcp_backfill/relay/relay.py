"""The protocol-aware relay between one client session and one upstream session.

It forwards every message unchanged (the original bytes) except for its interceptions, which
depend on the protocol era:

* handshake era (2024-11-05 … 2025-11-25): the client's `initialize` gets `sampling: {tools: {}}`
  merged into its capabilities, and the server's `sampling/createMessage` requests that the client
  cannot answer are answered by the `Answerer`;
* 2026-07-28: every request's `_meta` capabilities get the same merge, and `input_required`
  results of `tools/call`, `prompts/get` and `resources/read` are driven by the `RoundDriver`: the
  proxy answers the sampling questions, re-sends the request under its own id, and gives the client
  the final result (or a reduced round holding only the questions the client answers itself).

The relay itself routes: it tracks requests in each direction (the two id spaces overlap), maps
ids back, answers for messages too large or too malformed to relay (from the id at one of their
ends), and hands large responses on undecoded. It knows the protocol, not the transport: both
sides are `MessageChannel`s.

Routing a message is synchronous work that ends in a list of sends (`_Send`); only the sends wait.
So when both sides can also send without waiting (`SendsAtOnce`: the stdio pipes), a message can be
relayed straight from the transport's read callback (`from_client_now`, `from_upstream_now`),
without a task switch per message; otherwise, or when a send would have to wait, the pump tasks
relay it, as they relay everything else. A side that can also write a message before the relay has
kept its books of it (`PostsAhead`, `AnswersAhead`: the sidecar's lane and its HTTP upstream) is
let do so for one the relay forwards as it came (`post_ahead`, `answer_ahead`); the books of an
answer written so are kept before anything else the relay does (`settle`, `ahead.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol, telemetry
from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.logs import get_logger
from mcp_backfill.options import env_var, named
from mcp_backfill.relay import input_required as ir
from mcp_backfill.relay.ahead import Owed
from mcp_backfill.relay.answering import Answerer
from mcp_backfill.relay.approval import Approver
from mcp_backfill.relay.capabilities import (
    ClientProfile,
    backfill_capabilities,
    proxy_answers,
    with_sampling_tasks,
)
from mcp_backfill.relay.rounds import RoundDriver
from mcp_backfill.relay.state import PendingRequest, RelayOptions, RelayState
from mcp_backfill.relay.task_book import TaskBook
from mcp_backfill.relay.tasks import SamplingTasks
from mcp_backfill.relay.tracing import RequestTraces
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import SamplingSession
from mcp_backfill.transports.base import AnswersAhead, MessageChannel, PostsAhead, SendsAtOnce

log = get_logger("relay")

# Upstream responses this large are routed by the id at their head, without decoding them.
LARGE_MESSAGE = 64 * 1024
# Ids of requests the client cancelled that a session remembers, for the late answers to them.
CANCELLED_KEPT = 256

DUPLICATE_ID = (
    "Invalid Request: a request under this id is already in flight (mcp-backfill is still answering "
    "it); a request's id must not be reused while its answer is awaited"
)

_Send = tuple[bool, bytes, Any]
"""One message to write: (to the upstream? else to the client, the bytes, the related request id)."""


def rewrite_each(message: Any, rewrite: Callable[[Any], Any]) -> Any:
    """`rewrite` applied to one message, or to each item of a batch.

    `rewrite` returns its item, a rewritten copy, or None when the proxy consumed it. The result is
    `message` itself when nothing changed (so its original bytes can be forwarded), None when
    nothing is left to forward, else what to encode and forward. A JSON `null` is no message the
    relay tracks, nor one it consumed: it is kept, for the receiver to refuse (the result is then
    `message` itself, even when that is `null`).
    """
    if message is None:
        return message
    if not isinstance(message, list):
        return rewrite(message)
    items = [item if item is None else rewrite(item) for item in message]
    kept = [item for item, was in zip(items, message, strict=True) if item is not None or was is None]
    if len(kept) == len(message) and all(a is b for a, b in zip(items, message, strict=True)):
        return message
    return kept or None


def trace_message(direction: str, message: Any, size: int) -> None:
    """A debug line for each message of `message` (a batch shares its size)."""
    for item in message if isinstance(message, list) else [message]:
        if isinstance(item, dict):
            kind = ("request" if "id" in item else "notification") if "method" in item else "response"
            extra = {"direction": direction, "kind": kind, "method": item.get("method"), "id": item.get("id")}
            log.debug("message", extra={**extra, "bytes": size, "error": "error" in item})


class Relay:
    """Moves messages between `client` and `upstream` until the upstream side ends.

    Long because it is the one place where both directions meet: which id belongs to whom, and who
    answers a message, is decided here for every message (the work itself — sampling, rounds, tasks,
    approval — is delegated to the classes it holds), and every point where a request starts or
    ends is here, so the trace spans (`RequestTraces`, a guarded line at each) are told here too.
    """

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
        self.traces = RequestTraces(telemetry.current())
        self.client = client
        self.upstream = upstream
        self.state = RelayState()
        approve, timeout = options.approve, options.approve_timeout
        self.approver = Approver(approve, timeout, sampler.preview, self.state, self._send_client)
        self.answerer = Answerer(
            sampler, session, self._send_upstream, self.approver.approve, lambda: self.state.protocol_version
        )
        book = TaskBook(ttl_max_ms=round(options.task_ttl_max * 1000))
        self.tasks = SamplingTasks(
            book, self.answerer.sample_approved, self._send_upstream, hand=self.answerer.hand
        )
        self._tg: TaskGroup | None = None
        # `--log-level debug`: one line per message (direction, method, id, size; never contents).
        self._trace_messages = log.isEnabledFor(logging.DEBUG)
        # The proxy's own answers to items of a client batch whose other requests went upstream, by
        # the id key of one of those: they go in the array that answers it (see `_client_sends`).
        self._held: dict[jsonrpc.IdKey, list[dict[str, Any]]] = {}
        # Upstream ids of requests the client cancelled lately: their late answers are expected.
        self._cancelled: dict[jsonrpc.IdKey, None] = {}
        self._at_once = (
            (client, upstream)
            if isinstance(client, SendsAtOnce) and isinstance(upstream, SendsAtOnce)
            else None
        )
        # The sides that write first and leave the books for after (`ahead.py`), and what is owed.
        self._answers_ahead = client if self._at_once and isinstance(client, AnswersAhead) else None
        self._posts_ahead = upstream if self._at_once and isinstance(upstream, PostsAhead) else None
        self._owed = Owed(self.settle)
        self._warmed = not options.warm_up
        self._initialized = False  # the client has sent `initialize` (a second one begins a new session)
        sample, scope = self.answerer.sample, session.client if session is not None else ""
        self.rounds = RoundDriver(
            options,
            self.state,
            sample,
            self._send_client_answer,
            self._send_upstream,
            scope,
            traces=self.traces,
            approver=self.approver,
            claim=sampler.spend.claim_once,
            refused=self.answerer.refused,
            notify_client=self._send_client,
            cancelled=self.answerer.abandoned,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, on_client_closed: Callable[[], Awaitable[None]]) -> None:
        """Relay until the upstream closes; `on_client_closed` runs when the client side ends first."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self.answerer.start(tg)
                self.approver.start(tg)
                self.tasks.start(tg)
                self.rounds.start(tg)
                tg.start_soon(self._pump_client, on_client_closed)
                await self._pump_upstream()
                tg.cancel_scope.cancel()
        except BaseException:
            self.traces.close()
            raise

    def drives_rounds(self) -> bool:
        """Does the proxy drive a client request's rounds (its Claude call, or the request sent
        again and not answered yet)? Between two POSTs such a request is in flight all the same."""
        return bool(self.state.driving)

    def from_client_now(self, raw: bytes, *, ahead: bool = False) -> bool:
        """Relay a client message at once, outside the pump (from a read callback), when every send
        it leads to can be made without waiting; False leaves it to the pump. `ahead`: its POST
        went out already (`post_ahead`), and it is relayed now whatever."""
        self.settle()
        sides = self._at_once if ahead else self._sides_now()
        if sides is None:
            return False
        for send in self._client_sends(raw):
            self._send_now(sides, send)
        return True

    def takes_client_now(self) -> bool:
        """Would `from_client_now` relay a message now?"""
        return self._sides_now() is not None

    def takes_upstream_now(self) -> bool:
        """Would `from_upstream_now` relay a message now?"""
        return not self.answerer.hand.full and self._sides_now() is not None  # else the pump waits for room

    def from_upstream_now(self, raw: bytes, origin: Any = None) -> bool:
        """`from_client_now` for a message from the upstream (`origin`: see `_from_upstream`)."""
        self.settle()
        sides = self._sides_now()
        if sides is None or self.answerer.hand.full:  # the pump waits for room first
            return False
        for send in self._upstream_sends(raw, origin):
            self._send_now(sides, send)
        return True

    # -- written first, booked after (`ahead.py`) ----------------------------------------------

    def post_ahead(self, raw: bytes, request: dict[str, Any]) -> bool:
        """POST a lone client request (`request`, decoded; the relay takes it now) before the relay
        keeps its books of it, when the relay forwards it as it came. The books follow in the same
        callback, with `from_client_now(raw, ahead=True)`, which finds it written."""
        upstream = self._posts_ahead
        method = request["method"]
        if (
            upstream is None
            or self.traces.enabled
            or self._held
            or method == protocol.INITIALIZE
            or (method == protocol.DISCOVER and self.options.era == "handshake")
            or ir.envelope(request.get("params")) is not None  # (a 2026-07-28 request: rewritten)
        ):
            return False
        return upstream.post_ahead(raw, request)

    def answer_ahead(self, raw: bytes, response: Any, origin: Any) -> bool:
        """Have the client side write an upstream message (`response`, decoded) now, routed later
        (`settle`), when it is the answer a client request is waiting for and the relay would hand
        it on as it came. Asked only right after `takes_upstream_now`."""
        self.settle()
        client = self._answers_ahead
        if (
            client is None
            or self.traces.enabled
            or self._held
            or len(raw) >= LARGE_MESSAGE
            or not isinstance(response, dict)
            or "method" in response
            or "id" not in response
        ):
            return False
        if self._answered_as_it_came(response["id"]) is None:
            return False
        done = client.answer_ahead(raw, response)
        if done is None:
            return False
        self._owed.owe(raw, origin, done)
        return True

    def settle(self) -> None:
        """Route the answer written ahead, if one is owed: before anything else the relay does, so
        that it does everything in the order it came."""
        if self._owed.answer is None:
            return
        owed = self._owed.take()
        sides = self._at_once
        if owed is None or sides is None:  # (`answer_ahead` owes one only with both sides at once)
            return
        raw, origin, done = owed
        try:
            for send in self._upstream_sends(raw, origin):
                self._send_now(sides, send)
        finally:
            done()

    def crowded(self) -> bool:
        """Are several client requests waiting for their answers? (A pipe's writes may then go
        through a thread of their own: `transports/pipe_writer.py`.)"""
        return len(self.state.client_requests) > 1

    async def fail_pending(self, reason: str, rounds_reason: str | None = None) -> None:
        """Answer every client request still waiting for the upstream (or for the proxy) with an error
        (`rounds_reason`, if given, for those whose rounds the proxy drives); the session's trace
        spans still open end with it."""
        self.settle()
        waiting = {jsonrpc.id_key(p.request_id): p for p in self.state.client_requests.values()}
        waiting.update(self.state.driving)
        driven = set(self.state.driving) if rounds_reason is not None else set()
        self.state.client_requests.clear()
        self.state.driving.clear()
        for send in self._release_held():
            await self._send(send)
        for key, request in waiting.items():
            if request.chain is not None and request.chain.scope is not None:
                request.chain.scope.cancel()
            told = rounds_reason if rounds_reason is not None and key in driven else reason
            await self._reply_error(request.request_id, protocol.INTERNAL_ERROR, told)
        self.traces.close()

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
                self.settle()
                return
            except MessageTooLarge as exc:
                await self._too_large(exc, from_client=False)
                continue
            if self.answerer.hand.full and not self._answered_at_once(raw):
                await self.answerer.hand.room()  # the upstream's next requests wait: nothing piles up here
            await self._from_upstream(raw, origin)
            del raw  # do not hold a large message while waiting for the next one

    def _answered_at_once(self, raw: bytes) -> bool:
        """Does `raw` add nothing to the requests in hand: an answer or a notification (a cancel
        makes room), or a `tasks/get`, `tasks/list` or `tasks/cancel` about the proxy's own tasks,
        answered at once? Read on while the most are in hand (a server polls, or cancels, tasks
        whose Claude calls may run for minutes); as what it leads to is sent before the next
        message is read, the upstream is read no faster than its messages are passed on."""
        try:
            message = jsonrpc.decode(raw)
        except ValueError:
            return False
        if not isinstance(message, dict):
            return False
        method, params = message.get("method"), message.get("params")
        if method is None or "id" not in message:
            return True
        return (
            self.state.declares_tasks
            and method in protocol.TASK_METHODS
            and SamplingTasks.answers_at_once(
                method, params if isinstance(params, dict) else {}, self.state.client
            )
            and not self._answering(message["id"])  # else refused as a duplicate, in hand
            and not self.state.with_the_client(message["id"])
        )

    async def _too_large(self, exc: MessageTooLarge, *, from_client: bool) -> None:
        """A message was too large to relay: answer for it so that no request waits forever."""
        sender = "client" if from_client else "upstream"
        batch = not from_client and jsonrpc.is_batch(exc.head)
        salvage = jsonrpc.salvage_batch if batch else jsonrpc.salvage_envelope
        found, request_id, is_request = salvage(exc.head, exc.tail)
        log.warning(
            f"message from the {sender} too large; dropped",
            extra={"size": exc.size, "limit": exc.limit, "request_id": request_id if found else None},
        )
        hint = f"Message too large: {exc}; raise {named('--max-message-bytes')} to allow it"
        salvaged = (found, request_id, is_request)
        refusal = (protocol.INVALID_REQUEST, hint)
        for send in self._answer_for(salvaged, from_client, refusal, hint, batch=batch):
            await self._send(send)

    def _answer_for(
        self,
        salvaged: tuple[bool, jsonrpc.Id, bool],
        from_client: bool,
        refusal: tuple[int, str],
        failure: str,
        *,
        batch: bool = False,
    ) -> list[_Send]:
        """The answers for a message the relay could not relay (too large, or not JSON), from what
        `jsonrpc.salvage_envelope` read at its ends, so that no request waits forever.

        A request is refused to its sender with `refusal` (code, message), as is a client message
        whose id cannot be read; a response becomes the error `failure` for the side waiting for it.
        An upstream `batch` of responses fails every request still waiting of the client's batch
        that the one whose id was read came in: a batch is answered as one array.
        """
        found, request_id, is_request = salvaged
        if is_request or (from_client and not found):
            reply = jsonrpc.error_response(request_id, *refusal)
            return [(not from_client, jsonrpc.encode(reply), None)]
        if not found:
            return []
        error = jsonrpc.error_response(request_id, protocol.INTERNAL_ERROR, failure)
        if from_client:
            if self.approver.take(error):
                return []  # the answer to the proxy's own approval question: it fails, as asked
            self.state.client_done(request_id)
            return [(True, jsonrpc.encode(error), None)]
        key = jsonrpc.id_key(request_id)
        pending = self.state.client_requests.pop(key, None)
        lost = [] if pending is None else [pending]
        group = pending.batch if pending is not None else None
        if batch and pending is None:
            # The request whose id was read is no longer waiting (the client cancelled it): the
            # rest of its batch, answered in the same array, still is.
            group = next(
                (p.batch for p in self.state.client_requests.values() if p.batch and key in p.batch), None
            )
        if batch and group is not None:
            for mate_key in group:
                mate = self.state.client_requests.get(mate_key)
                if mate is not None and mate.batch is group:
                    lost.append(self.state.client_requests.pop(mate_key))
        for request in lost:
            self.rounds.end(request)
        return [self._error_to_client(r.request_id, protocol.INTERNAL_ERROR, failure) for r in lost]

    # -- client -> upstream ----------------------------------------------------------------------

    async def _from_client(self, raw: bytes) -> None:
        self.settle()
        for send in self._client_sends(raw):
            await self._send(send)

    def _client_sends(self, raw: bytes) -> list[_Send]:
        """Route one client message: what to send where, in order."""
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from client", extra={"error": str(exc), "line": jsonrpc.preview(raw)}
            )
            problem = f"Parse error: {exc}"
            salvaged = jsonrpc.salvage_unparsed(raw)
            return self._answer_for(salvaged, True, (protocol.PARSE_ERROR, problem), problem)
        if type(message) is list and len(message) > self.options.max_batch_messages:
            return [self._batch_refused(len(message))]
        if self._trace_messages:
            trace_message("from client", message, len(raw))
        replies: list[dict[str, Any]] = []
        forwarded = rewrite_each(message, lambda item: self._client_item(item, replies))
        if isinstance(message, list):
            self._note_batch(message)
        sends: list[_Send] = []
        if forwarded is message:
            sends.append((True, raw, None))
        elif forwarded is not None:
            sends.append((True, jsonrpc.encode(forwarded), None))
        if self.traces.enabled:
            for reply in replies:
                self.traces.answered(reply, by="server")
        if replies and isinstance(message, list):
            # A batch is answered with one array: the proxy's answers wait for the server's array
            # when some of the batch's requests went upstream, else are that array themselves.
            waiting = self._waiting_in(forwarded)
            if waiting is not None:
                self._held.setdefault(waiting, []).extend(replies)
            else:
                sends.append((False, jsonrpc.encode(replies), None))
        else:
            sends.extend((False, jsonrpc.encode(reply), None) for reply in replies)
        return sends + self._release_held()

    def _waiting_in(self, forwarded: Any) -> jsonrpc.IdKey | None:
        """The id key of a request of `forwarded` (a batch sent upstream) now waiting for its answer."""
        if not isinstance(forwarded, list):
            return None
        for item in forwarded:
            if isinstance(item, dict) and "method" in item and "id" in item:
                key = jsonrpc.id_key(item["id"])
                if key in self.state.client_requests:
                    return key
        return None

    def _merge_held(self, forwarded: Any) -> Any:
        """`forwarded` (relayed to the client) with the proxy's answers held for a request it answers."""
        items = forwarded if isinstance(forwarded, list) else [forwarded]
        merged: list[Any] = []
        for item in items:
            if isinstance(item, dict) and "method" not in item and "id" in item:
                merged += self._held.pop(jsonrpc.id_key(item["id"]), [])
        return [*items, *merged] if merged else forwarded

    def _release_held(self) -> list[_Send]:
        """The held answers whose request left without its answer being relayed (cancelled, failed,
        relayed whole without being read): sent now, one array each, rather than lost."""
        if not self._held:
            return []
        gone = [key for key in self._held if key not in self.state.client_requests]
        return [(False, jsonrpc.encode(self._held.pop(key)), None) for key in gone]

    def _batch_refused(self, count: int) -> _Send:
        """A client batch over `--max-batch-messages`, refused as a whole before any of it is relayed:
        going through a batch of 300,000 messages held the event loop (every session) for seconds."""
        limit = self.options.max_batch_messages
        log.warning("client batch over the limit; refused", extra={"messages": count, "limit": limit})
        message = protocol.batch_too_large(count, limit)
        return (False, jsonrpc.encode(jsonrpc.error_response(None, protocol.INVALID_REQUEST, message)), None)

    def _note_batch(self, batch: list[Any]) -> None:
        """Each request of a client's batch now waiting for the upstream knows its batch: an answer
        to the batch (one array) that is lost fails them all."""
        requests = self.state.client_requests
        keys = (jsonrpc.id_key(m["id"]) for m in batch if isinstance(m, dict) and "method" in m and "id" in m)
        group = frozenset(key for key in keys if key in requests)
        if len(group) > 1:
            for key in group:
                requests[key].batch = group

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
                        "Method not found: server/discover (mcp-backfill runs with --era handshake, "
                        f"{env_var('--era')}=handshake; use initialize)",
                    )
                )
                return None
            if self.traces.enabled:
                message = self.traces.relayed(message, sender="client")
            pending = PendingRequest(method, message["id"])
            if self.state.cut:  # the id is the client's again: not the cancelled request's any more
                self.state.cut.pop(jsonrpc.id_key(message["id"]), None)
            if self._cancelled:
                self._cancelled.pop(jsonrpc.id_key(message["id"]), None)
            if method == protocol.INITIALIZE:
                self.state.client_requests[jsonrpc.id_key(message["id"])] = pending
                return self._rewrite_initialize(message)
            rewritten = self.rounds.rewrite_request(message, pending, replies)
            if rewritten is not message:
                self._warm_up()  # the proxy backfilled sampling for this 2026 client
            if rewritten is not None:
                self.state.client_requests[jsonrpc.id_key(message["id"])] = pending
            return rewritten
        if method == protocol.CANCELLED:
            return self._client_cancelled(message)
        if method is None and self.approver.take(message):
            return None  # the user's answer to the proxy's own approval question
        if method is None and "id" in message:
            self.state.client_done(message["id"])
        if method is None and self.traces.enabled:
            self.traces.answered(message, by="client")
        if method is None and self.state.declares_tasks:
            return self.tasks.merge_list(message)
        return message

    def _rewrite_initialize(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._initialized:  # a new session of the client's: the tasks of the last one end
            self.tasks.end_session()
        self._initialized = True
        self.state.declares_tasks = False  # until declared for this session (not the last one's)
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        capabilities = params.get("capabilities")
        self.state.client = ClientProfile.from_capabilities(capabilities)
        version = params.get("protocolVersion")
        if isinstance(version, str):
            self.state.check_version(version)
        merged = backfill_capabilities(capabilities, self.mode)
        if merged is not None or self.mode == "always":
            # Tasks arrived in 2025-11-25. The server has not chosen the revision yet: the one the
            # client asks for decides (a server answering with an older one does not use tasks).
            if protocol.defines(version if isinstance(version, str) else None, protocol.TASKS_SINCE):
                merged = with_sampling_tasks(merged if merged is not None else dict(capabilities or {}))
                self.state.declares_tasks = True
            self._warm_up()  # the proxy answers this session's sampling: build while the upstream starts
        self.approver.check_client()
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

    def _client_cancelled(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The client gave up on a request: stop driving it, and cancel it upstream under its upstream id."""
        params = message.get("params")
        if not isinstance(params, dict) or "requestId" not in params:
            return message
        key = jsonrpc.id_key(params["requestId"])
        if self.traces.enabled:
            self.traces.ended_without_answer(params["requestId"])
        if key in self.state.driving:
            return self.rounds.client_cancelled(message, params)
        pending = self.state.client_requests.pop(key, None)
        if pending is not None:
            jsonrpc.remember(self._cancelled, key, None, CANCELLED_KEPT)
            self._cut_sampling_for(pending)
        return message

    def _cut_sampling_for(self, cancelled: PendingRequest) -> None:
        """The client cancelled `cancelled`: the sampling requests the server made for it stop, and
        later ones are refused, charged nothing more (a server may go on after a cancel). Which
        ones were made for it is known only from the response stream they came on (an HTTP
        upstream's; a pipe tells nothing): a stream carrying a client batch belongs to several
        requests, so a request sent in one is not tied to any."""
        if cancelled.batch is not None or cancelled.request_id is None:
            return
        refusal = protocol.cancelled_by_client(cancelled.request_id)
        self.state.cut_off(cancelled.request_id, refusal)
        self.answerer.cut_for_client(cancelled.request_id, refusal)
        self.tasks.cut_for_client(cancelled.request_id, refusal)

    # -- upstream -> client ----------------------------------------------------------------------

    async def _from_upstream(self, raw: bytes, origin: Any = None) -> None:
        """`origin`: the upstream-side id of the request whose response stream carried `raw`."""
        self.settle()
        for send in self._upstream_sends(raw, origin):
            await self._send(send)

    def _upstream_sends(self, raw: bytes, origin: Any) -> list[_Send]:
        """Route one upstream message (see `_from_upstream`): what to send where, in order."""
        related = self._client_id_for(origin)
        if len(raw) >= LARGE_MESSAGE and is_utf8(raw) and self._plain_response(raw):
            if self._trace_messages:
                log.debug(
                    "message", extra={"direction": "from upstream", "kind": "response", "bytes": len(raw)}
                )
            return [(False, raw, related), *self._release_held()]
        try:
            message = jsonrpc.decode(raw)
        except ValueError as exc:
            log.warning(
                "malformed message from upstream; dropped",
                extra={"error": str(exc), "line": jsonrpc.preview(raw)},
            )
            failure = f"Upstream MCP server sent an answer that is not valid JSON ({exc}); it was dropped"
            batch = jsonrpc.is_batch(raw[:1024])
            salvaged = jsonrpc.salvage_unparsed(raw, batch=batch)  # the HTTP upstream leaves it to this too
            refusal = (protocol.PARSE_ERROR, f"Parse error: {exc}")
            return self._answer_for(salvaged, False, refusal, failure, batch=batch)
        if type(message) is list and len(message) > self.options.max_batch_messages:
            return self._upstream_batch_refused(message)
        if self._trace_messages:
            trace_message("from upstream", message, len(raw))
        forwarded = rewrite_each(message, lambda item: self._upstream_item(item, related))
        sends: list[_Send] = []
        if forwarded is not None or message is None:
            if self.traces.enabled:
                self.traces.answered(forwarded, by="server")
            if self._held:
                forwarded = self._merge_held(forwarded)
            sends.append((False, raw if forwarded is message else jsonrpc.encode(forwarded), related))
        if self.tasks.replies_ready:  # the proxy's answers to the server's tasks/* it just read
            sends.extend((True, reply, None) for reply in self.tasks.take_replies())
        return sends + self._release_held()

    def _upstream_batch_refused(self, batch: list[Any]) -> list[_Send]:
        """An upstream batch over `--max-batch-messages`, dropped as a whole (going through 300,000
        messages held the event loop, every session's, for seconds): each client request it answers
        gets an error under its own id, and each of the server's requests in it an error back (in
        one array, as a batch is answered); its notifications are lost."""
        limit = self.options.max_batch_messages
        log.warning("upstream batch over the limit; dropped", extra={"messages": len(batch), "limit": limit})
        problem = protocol.upstream_batch_too_large(len(batch), limit)
        sends: list[_Send] = []
        refusals: list[dict[str, Any]] = []
        requests = self.state.client_requests
        for item in batch:
            if not isinstance(item, dict) or "id" not in item:
                continue
            if "method" in item:
                refusals.append(jsonrpc.error_response(item["id"], protocol.INVALID_REQUEST, problem))
                continue
            pending = requests.pop(jsonrpc.id_key(item["id"]), None)
            if pending is not None:
                self.rounds.end(pending)
                sends.append(self._error_to_client(pending.request_id, protocol.INTERNAL_ERROR, problem))
        if refusals:
            sends.append((True, jsonrpc.encode(refusals), None))
        return sends

    def _plain_response(self, raw: bytes) -> bool:
        """Is `raw` a response the relay forwards untouched? Then it need not be decoded.

        Large tool results are the bulk of the bytes a session moves; decoding one only to find
        its id costs more than all the rest of the relay's work. The id is read from the head
        of the message; requests the relay rewrites answers to (initialize, 2026 rounds it may
        drive, re-sent rounds) are not taken this way.
        """
        found, upstream_id = jsonrpc.response_head_id(raw)
        if not found or self._head_may_mislead():
            return False
        pending = self._answered_as_it_came(upstream_id)
        if pending is None:
            return False
        del self.state.client_requests[jsonrpc.id_key(upstream_id)]
        if self.traces.enabled:
            self.traces.answered({"id": pending.request_id}, by="server")
        return True

    def _answered_as_it_came(self, upstream_id: Any) -> PendingRequest | None:
        """The client request a response under `upstream_id` answers, when the relay hands that
        response on untouched: no round or `initialize` of it to read, no proxy's answers to the rest
        of its batch to go in the same array, and the client's own id (not `1` for `1.0`)."""
        key = jsonrpc.id_key(upstream_id)
        pending = self.state.client_requests.get(key)
        if (
            pending is None
            or pending.chain is not None
            or pending.method == protocol.INITIALIZE
            or key in self._held
            or not _same_id(upstream_id, pending.request_id)
        ):
            return None
        return pending

    def _head_may_mislead(self) -> bool:
        """Could a response routed by the id at its head be read as another message, with a
        consequence? Every common parser (orjson, `json`, pydantic's, `JSON.parse`) keeps the last
        of duplicate members and takes a message with a `method` for a request: a response whose
        head names one request may repeat `"id"` after its result, or carry a `"method"` there. That
        matters (1) while a request the relay reads or drives (`initialize`, a 2026-07-28 round) is
        waiting: its answer would reach the client unread; (2) under `--mode always` with a client
        able to sample, which must never see a sampling request: its model would answer (and bill)
        one the proxy must. Scanning the bytes for such members (or their `\\u` spellings) costs
        about as much as decoding them, so the normal path is taken then. Otherwise what the client
        misreads is the upstream's answer to its own request, or a request the client could be sent
        anyway (`--mode auto` gives a client that samples what it can sample)."""
        for pending in self.state.client_requests.values():
            if pending.chain is not None or pending.method == protocol.INITIALIZE:
                return True
        return self.mode == "always" and self.state.client.sampling is not None

    def _client_id_for(self, upstream_id: Any) -> Any:
        """The client's id for a request known upstream as `upstream_id` (None stays None)."""
        if upstream_id is None:
            return None
        pending = self.state.client_requests.get(jsonrpc.id_key(upstream_id))
        return pending.request_id if pending is not None else upstream_id

    def _upstream_item(self, message: Any, related: Any = None) -> Any:
        """Track one upstream message; return it, a rewritten copy, or None when the proxy consumed it.

        `related`: the client's id for the request whose response stream carried it.
        """
        if not isinstance(message, dict):
            return message
        method = message.get("method")
        if method is None:
            return self._upstream_response(message)
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        tasked = isinstance(params.get("task"), dict) and self.state.declares_tasks
        if (
            method == protocol.SAMPLING
            and "id" in message
            # A task the proxy declared it runs, for a client that runs none: the proxy's to answer.
            and (
                proxy_answers(self.mode, self.state.client, params)
                or (tasked and not self.state.client.runs_sampling_tasks())
            )
        ):
            self.state.took(message["id"])
            refusal = self.state.cut.get(jsonrpc.id_key(related)) if self.state.cut else None
            if self._refused_as_duplicate(message):
                pass
            elif refusal is not None and related is not None:
                log.info(
                    "sampling request for a request the client cancelled; refused",
                    extra={"request_id": message["id"], "related": related},
                )
                span = self.traces.answering(message) if self.traces.enabled else None
                self.answerer.refuse(
                    message["id"], protocol.REQUEST_CANCELLED, refusal, span, sampling=params
                )
            elif tasked:
                self.tasks.create(message["id"], params, related)
            else:
                span = self.traces.answering(message) if self.traces.enabled else None
                self.answerer.answer_request(message["id"], params, related, span)
            return None
        tasks = method in protocol.TASK_METHODS and "id" in message and self.state.declares_tasks
        if (
            tasks
            and SamplingTasks.answers(method, params, self.state.client)
            and self._refused_as_duplicate(message)
        ):
            self.state.took(message["id"])
            return None
        if tasks and self.tasks.take_request(message, method, params, self.state.client) is None:
            self.state.took(message["id"])
            return None  # the proxy answers it
        if method == protocol.PROGRESS and "id" not in message:
            return self.rounds.upstream_progress(message, params)
        if "id" in message:
            if self._answering(message["id"]):  # for the client, under the id of one the proxy answers
                self._refused_as_duplicate(message)
                return None
            self.state.relayed(message["id"])
        if self.traces.enabled and "id" in message:
            return self.traces.relayed(message, sender="server")
        if method == protocol.CANCELLED:
            request_id = params.get("requestId")
            taken = self.state.was_taken(request_id)  # answered by the proxy, or being answered
            self.state.client_done(request_id)
            if self.answerer.cancel(request_id) or self.tasks.cancel_waiting(request_id):
                return None
            if taken:  # the client never saw that id (it may be one of its own requests' ids)
                log.debug("server cancelled a request the proxy answered; dropped", extra={"id": request_id})
                return None
            self.tasks.list_cancelled(request_id)
            if self.traces.enabled and "requestId" in params:  # the client will not answer it
                self.traces.ended_without_answer(request_id, sender="server")
        return message

    def _refused_as_duplicate(self, message: dict[str, Any]) -> bool:
        """A server request the proxy answers, under the id of one it or the client is still
        answering, is refused: the two answers could not be told apart, nor could a cancel of that id."""
        request_id = message["id"]
        if not (self._answering(request_id) or self.state.with_the_client(request_id)):
            return False
        log.warning("upstream reused the id of a request in flight; refused", extra={"id": request_id})
        span = self.traces.answering(message) if self.traces.enabled else None
        params = message.get("params") if message.get("method") == protocol.SAMPLING else None
        sampling = params if isinstance(params, dict) else None
        self.answerer.refuse(request_id, protocol.INVALID_REQUEST, DUPLICATE_ID, span, sampling=sampling)
        return True

    def _answering(self, request_id: Any) -> bool:
        """Is the proxy still answering the server's request `request_id` (its sampling, a `tasks/result`)?"""
        return self.answerer.answering(request_id) or self.tasks.waiting(request_id)

    def _upstream_response(self, message: dict[str, Any]) -> Any:
        upstream_id = message.get("id")
        pending = self.state.client_requests.pop(jsonrpc.id_key(upstream_id), None)
        if pending is None:
            if RoundDriver.is_own_id(upstream_id):
                log.debug("response to a request the client cancelled; dropped", extra={"id": upstream_id})
                return None
            if upstream_id is None:
                return message  # an error about a message the server could not read: the client's
            if self._cancelled and jsonrpc.id_key(upstream_id) in self._cancelled:
                # The late answer to a request the client cancelled goes on as it always did (the
                # client ignores it, as MCP has it); a second one no more than any other.
                del self._cancelled[jsonrpc.id_key(upstream_id)]
                return message
            # JSON-RPC has one response per request: a second one (a server that answers twice), or
            # one for an id never sent, reached a client that no longer waits for it (the SDKs report
            # it as an error, or took it for the answer to a later request of the same id).
            log.warning(
                "a response from the upstream to no request waiting for one (answered already); dropped",
                extra={"id": upstream_id},
            )
            return None
        if pending.method == protocol.INITIALIZE:
            self._note_initialized(message)
        chain = pending.chain
        if chain is not None:
            result = message.get("result")
            if ir.is_input_required(result):
                return self.rounds.take_round(pending, chain, result)
            self.rounds.end(pending)
        if _same_id(upstream_id, pending.request_id):
            return message  # as it came: forwarded as the bytes it came in (an `is` test failed
            # for all but small integers, and re-encoded the rest: a float's digits, `1e400`)
        return {**message, "id": pending.request_id}

    def _note_initialized(self, message: dict[str, Any]) -> None:
        result = message.get("result")
        info = result.get("serverInfo") if isinstance(result, dict) else None
        if isinstance(info, dict) and isinstance(info.get("name"), str):
            self.state.server_name = info["name"]
        if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
            self.state.protocol_version = result["protocolVersion"]
            self.traces.protocol_version = self.state.protocol_version
            self.state.check_version(self.state.protocol_version)
            log.info("session initialized", extra={"protocol_version": self.state.protocol_version})
            if not protocol.defines(self.state.protocol_version, protocol.TASKS_SINCE):
                # Declared for a client asking for 2025-11-25, but the server chose a revision
                # without tasks: `task` in its requests means nothing, `tasks/*` are not the proxy's.
                self.state.declares_tasks = False

    def _warm_up(self) -> None:
        """Once per session, get the provider ready in the background (`--no-warm-up`: not at all)."""
        if not self._warmed and self._tg is not None:
            self._warmed = True
            self._tg.start_soon(self.answerer.sampler.warm_up)

    # -- writing ---------------------------------------------------------------------------------

    async def _reply_error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        await self._send(self._error_to_client(request_id, code, message, data))

    def _error_to_client(self, request_id: Any, code: int, message: str, data: Any = None) -> _Send:
        """The proxy's error answer to a client request (its trace told), as a send."""
        reply = jsonrpc.error_response(request_id, code, message, data)
        if self.traces.enabled:
            self.traces.answered(reply, by="server")
        return (False, jsonrpc.encode(reply), None)

    async def _send_client_answer(self, raw: bytes, related: Any = None) -> None:
        """The proxy's own final answer to a client request (from the round driver)."""
        if self.traces.enabled:
            self.traces.answered_raw(raw)
        await self._send_client(raw, related)

    async def _send(self, send: _Send) -> None:
        to_upstream, raw, related = send
        await (self._send_upstream(raw) if to_upstream else self._send_client(raw, related))

    def _sides_now(self) -> tuple[SendsAtOnce, SendsAtOnce] | None:
        """(client, upstream) when both can take a message at once, else None."""
        sides = self._at_once
        # Only while at most one request is in flight: under load the pumps relay what piled up in
        # one go, with fewer wake-ups (benchmarks/README.md, the tenth round).
        if sides is None or self.crowded() or not (sides[0].can_send_now() and sides[1].can_send_now()):
            return None
        return sides

    def _send_now(self, sides: tuple[SendsAtOnce, SendsAtOnce], send: _Send) -> None:
        to_upstream, raw, related = send
        try:
            sides[to_upstream].send_now(raw, related)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            _dropped(raw, to_upstream=to_upstream)
            if to_upstream and self._tg is not None:
                self._tg.start_soon(self._undelivered, raw)

    async def _send_client(self, raw: bytes, related: Any = None) -> None:
        self.settle()  # (a task's send, e.g. the round driver's answer: the answer owed goes first)
        try:
            await self.client.send(raw, related)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            _dropped(raw, to_upstream=False)

    async def _send_upstream(self, raw: bytes) -> None:
        self.settle()
        try:
            await self.upstream.send(raw)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            _dropped(raw, to_upstream=True)
            await self._undelivered(raw)

    async def _undelivered(self, raw: bytes) -> None:
        """A client request the upstream could not be sent (it closed its input but runs on): answered
        now, not when the upstream exits, which may be never."""
        try:
            message = jsonrpc.decode(raw)
        except ValueError:
            return
        for item in message if isinstance(message, list) else [message]:  # each request of a batch
            if not (isinstance(item, dict) and "method" in item and "id" in item):
                continue
            pending = self.state.client_requests.pop(jsonrpc.id_key(item["id"]), None)
            if pending is not None:
                self.rounds.end(pending)
                await self._reply_error(
                    pending.request_id,
                    protocol.INTERNAL_ERROR,
                    "Upstream MCP server is not reading its input; the request could not be delivered",
                )


class UpstreamAtOnce:
    """The relay as an HTTP upstream's taker of messages at once (`AtOnce` in
    `transports/http_upstream/early.py`): a POST's answer read from the upstream connection's
    callback goes to the relay from there when it can take it, with no task woken on its way;
    `taken()` is told of each message it took so (the sidecar counts them)."""

    def __init__(self, relay: Relay, taken: Callable[[], None] | None = None) -> None:
        self._relay = relay
        self._taken = taken

    def ready(self) -> bool:
        return self._relay.takes_upstream_now()

    def take(self, data: bytes, origin: Any) -> bool:
        if not self._relay.from_upstream_now(data, origin):
            return False
        if self._taken is not None:
            self._taken()
        return True

    def answer_ahead(self, data: bytes, message: Any, origin: Any) -> bool:
        if not self._relay.answer_ahead(data, message, origin):
            return False
        if self._taken is not None:
            self._taken()
        return True


def is_utf8(raw: bytes) -> bool:
    """Is `raw` UTF-8, as every message on the wire must be? (A large answer is forwarded undecoded:
    a bad byte in it would end a client that reads its input as text, as the mcp SDK's does, instead
    of failing the one request.) ASCII, the usual case, is told without a copy."""
    if raw.isascii():
        return True
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _same_id(upstream_id: Any, client_id: Any) -> bool:
    """Is the id an answer came under the client's own, as the client wrote it? (`1` is keyed like
    `1.0`, but an answer to `1.0` must carry `1.0`.)"""
    return type(upstream_id) is type(client_id) and upstream_id == client_id


def _dropped(raw: bytes, *, to_upstream: bool) -> None:
    """A message for a side that is gone: the upstream's loss is worth a warning, a client that
    left is the normal end of a session."""
    if to_upstream:
        log.warning("upstream is gone; message dropped", extra={"line": jsonrpc.preview(raw)})
    else:
        log.debug("client is gone; message dropped", extra={"line": jsonrpc.preview(raw)})
