"""The client side of one handshake-era streamable-HTTP session, as the relay's `MessageChannel`.

`receive()` yields what the client POSTed, in order. `send()` puts each message on the right SSE
stream (see `SessionRouter.route`); the HTTP handlers write those streams to the client.

Where a server-to-client message goes, first match wins:

1. a response: the stream of the POST that carried the request with its id (a batch holding
   responses goes with them, split when they answer requests of several POSTs; the ids of the
   server's own requests in it name none of the client's);
2. the stream of `related` (the client's request the message belongs to, when the upstream said so),
   if that request is still waiting for its response;
3. the stream of the request whose `progressToken` the message carries (`params.progressToken`, as
   in `notifications/progress`, or `params._meta.progressToken`);
4. the only request in flight, when there is exactly one (a stdio upstream never says which request
   a message belongs to, and a tool call's log messages and sampling requests are the common case);
5. the standalone GET stream, buffered (last `replay_limit` messages) until the client opens it.

An upstream array goes on as one only to a client that reads batches (a session at 2025-03-26 or
before, or a POST that was one); for any other, each of its messages is routed as if it came alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import DuplicateRequestId, TooManyPosts
from mcp_backfill.logs import get_logger
from mcp_backfill.transports.event_stream import SESSION_REPLAY_BYTES, EventStream, ReplayBudget
from mcp_backfill.transports.queue import MessageQueue

log = get_logger("http")

GET_STREAM_KEY = "g"
# Finished POST streams kept for a client that reconnects to read the end of one (those not handed
# out whole are the last to go).
FINISHED_STREAMS_KEPT = 8
# POSTs of one session waiting for their answers, at most: each keeps its stream (and what it buffers
# for replay) after its client has gone, until its requests are answered.
MAX_OPEN_POSTS = 256
# Ids of requests the client cancelled, remembered so that a late response is not misrouted.
CANCELLED_IDS_KEPT = 256


@dataclass
class InFlight:
    request_id: Any
    method: str
    stream: EventStream
    token: jsonrpc.IdKey | None = None


@dataclass
class PostStream:
    """The SSE stream of one POST and the requests it waits for."""

    stream: EventStream
    waiting: set[jsonrpc.IdKey]
    batch: bool = False  # the client sent its requests in a JSON array (so it reads one back)


class SessionRouter:
    """Which SSE stream each server message goes to; see the module docstring.

    Long because the streams opened, the requests in flight on them (by id and by progress token)
    and the streams finished and kept for replay are one state, which every message routed, stream
    opened and answer written ahead (`answer_ahead`) reads and changes together."""

    def __init__(
        self,
        replay_limit: int,
        on_change: Callable[[], None] = lambda: None,
        replay_bytes: int = SESSION_REPLAY_BYTES,
    ) -> None:
        self._replay_limit = replay_limit
        self._on_change = on_change
        self.budget = ReplayBudget(replay_bytes)  # what every stream of the session keeps for replay
        self.get_stream = EventStream(GET_STREAM_KEY, replay_limit, budget=self.budget)
        self.budget.add(self.get_stream)
        self._streams: dict[str, EventStream] = {GET_STREAM_KEY: self.get_stream}
        self._posts: dict[str, PostStream] = {}
        self._finished: deque[str] = deque()
        self._requests: dict[jsonrpc.IdKey, InFlight] = {}
        self._tokens: dict[jsonrpc.IdKey, jsonrpc.IdKey] = {}
        self._cancelled: deque[jsonrpc.IdKey] = deque(maxlen=CANCELLED_IDS_KEPT)
        self._counter = 0
        self.protocol_version: str | None = None
        self.closed = False
        self.last_target: EventStream | None = None  # the stream `route` put its last notification on

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def buffered_bytes(self) -> int:
        """Bytes kept for replay by every stream of the session."""
        return self.budget.total

    def stream(self, key: str) -> EventStream | None:
        return self._streams.get(key)

    # -- client -> upstream ----------------------------------------------------------------------

    def may_open(self, request: dict[str, Any]) -> bool:
        """Would `open_post([request])` open a stream now? (Routing answers only closes streams: it
        still would after that.)"""
        return len(self._posts) < MAX_OPEN_POSTS and jsonrpc.id_key(request["id"]) not in self._requests

    def open_post(self, requests: list[dict[str, Any]], batch: bool = False) -> EventStream:
        """A stream for a POST carrying these requests (`batch`: in a JSON array, as several requests
        always are); raises `DuplicateRequestId`, and `TooManyPosts` when `MAX_OPEN_POSTS` are
        waiting for their answers."""
        if len(self._posts) >= MAX_OPEN_POSTS:
            raise TooManyPosts
        keys = [jsonrpc.id_key(request["id"]) for request in requests]
        if len(set(keys)) != len(keys) or any(key in self._requests for key in keys):
            raise DuplicateRequestId
        self._counter += 1
        stream = EventStream(f"s{self._counter}", self._replay_limit, budget=self.budget)
        self.budget.add(stream)
        self._streams[stream.key] = stream
        self._posts[stream.key] = PostStream(stream, set(keys), batch or len(requests) > 1)
        for key, request in zip(keys, requests, strict=True):
            token = protocol.progress_token(request.get("params"))
            token_key = jsonrpc.id_key(token) if token is not None else None
            if token_key is not None:
                self._tokens[token_key] = key
            self._requests[key] = InFlight(request["id"], str(request.get("method")), stream, token_key)
            if key in self._cancelled:
                self._cancelled.remove(key)
        self._on_change()
        return stream

    def client_cancelled(self, request_id: Any, reason: Any = None) -> None:
        """The client gave up on a request: answer its stream as the SDK does (-32800), now."""
        key = jsonrpc.id_key(request_id)
        if key not in self._requests:
            return
        self._cancelled.append(key)
        message = "Request cancelled" + (f": {reason}" if isinstance(reason, str) and reason else "")
        self._respond(
            key, jsonrpc.encode(jsonrpc.error_response(request_id, protocol.REQUEST_CANCELLED, message))
        )

    # -- upstream -> client ----------------------------------------------------------------------

    def route(self, raw: bytes, related: Any = None) -> EventStream | None:
        """Put a server message on its stream; returns the POST stream it completed, if it did."""
        if self.closed:
            log.debug("message for a closed session dropped", extra={"line": jsonrpc.preview(raw)})
            return None
        try:
            message = jsonrpc.decode(raw)
        except ValueError:
            message = None
        if isinstance(message, dict) and "method" not in message and "id" in message:
            key = jsonrpc.id_key(message["id"])
            request = self._requests.get(key)
            if request is not None:  # the usual answer, alone: to its POST (the general case below)
                self._note_response(message)
                stream = request.stream
                lane = stream.lane if stream.lane is not None and self._completes(stream) else None
                if lane is not None and not _told(lane.answer_first, raw):
                    lane = None
                self._respond_all([key], raw, stream)
                if lane is not None:  # it answered the client already: nobody else is to
                    _told(lane.answered)
                    return None
                return stream if stream.finished else None
        items = message if isinstance(message, list) else [message]
        # Only an answer names a client request: a request of the server's in a batch has an id of
        # the server's own, which may equal one of the client's.
        answers = [item for item in items if _is_answer(item)]
        if isinstance(message, list) and not self._reads_batches(answers):
            return self._route_singly(message, related)
        if answers:
            return self._route_response(raw, items, answers)
        first = items[0] if items else None
        params = first.get("params") if isinstance(first, dict) else None
        target = self._target(related, params)
        target.append(raw)
        self.last_target = target
        return None

    def answer_ahead(self, raw: bytes, response: dict[str, Any]) -> Callable[[], None] | None:
        """`AnswersAhead`: `response` written by the lane of the stream it completes, which `route`
        then finds written (`LaneWatch.answer_ahead`)."""
        request = None if self.closed else self._requests.get(jsonrpc.id_key(response["id"]))
        if request is None or request.stream.lane is None or not self._completes(request.stream):
            return None
        return request.stream.lane.answer_ahead(raw)

    def _reads_batches(self, answers: list[Any]) -> bool:
        """May an upstream array reach the client as one? Only at a revision that has batches, or
        when it answers requests the client itself sent in one (`open_post(..., batch=True)`)."""
        if not protocol.defines(self.protocol_version, protocol.NO_BATCHES_SINCE):
            return True
        for answer in answers:
            request = self._requests.get(jsonrpc.id_key(answer.get("id")))
            post = self._posts.get(request.stream.key) if request is not None else None
            if post is not None and post.batch:
                return True
        return False

    def _route_singly(self, items: list[Any], related: Any) -> EventStream | None:
        """An upstream array for a client that reads none (2025-06-18 on): each of its messages is
        routed on its own, as if it had come alone (a stdio upstream may write one whatever the
        revision; sent on as it came, the client's SDK could not read it, nor the answer in it)."""
        if not items:
            log.debug("an empty array from the upstream dropped")
            return None
        completed = None
        last = None
        for item in items:
            self.last_target = None
            done = self.route(jsonrpc.encode(item), related)
            completed = completed or done
            last = self.last_target or last
        self.last_target = last
        return completed

    def _route_response(
        self, raw: bytes, items: list[Any], answers: list[dict[str, Any]]
    ) -> EventStream | None:
        """A message holding answers goes to the POST of the requests it answers. A batch answering
        requests of several POSTs is split: each gets its answers, the first the rest of the batch."""
        keys = [jsonrpc.id_key(answer.get("id")) for answer in answers]
        owned: dict[str, list[jsonrpc.IdKey]] = {}
        for key in keys:
            request = self._requests.get(key)
            if request is not None and key not in owned.get(request.stream.key, ()):
                owned.setdefault(request.stream.key, []).append(key)
        if not owned:
            if all(key in self._cancelled for key in keys):
                log.debug("response to a request the client cancelled; dropped", extra={"keys": keys})
                others = [item for item in items if not _is_answer(item)]  # the server's own, kept
                if others:
                    first = others[0]
                    target = self._target(None, first.get("params") if isinstance(first, dict) else None)
                    target.append(jsonrpc.encode(others))
                    self.last_target = target
                return None
            self.get_stream.append(raw)  # an error with a null id, or a response nobody waits for
            return None
        for answer in answers:
            if jsonrpc.id_key(answer.get("id")) in self._requests:
                self._note_response(answer)
        groups = [(self._requests[owners[0]].stream, owners) for owners in owned.values()]
        if len(groups) == 1:
            stream = groups[0][0]
            self._respond_all(owned[stream.key], raw, stream)
            return stream if stream.finished else None
        elsewhere = {key: stream for stream, owners in groups[1:] for key in owners}
        parts: dict[str, list[Any]] = {stream.key: [] for stream, _ in groups}
        for item in items:
            other = elsewhere.get(jsonrpc.id_key(item.get("id"))) if _is_answer(item) else None
            parts[(other or groups[0][0]).key].append(item)
        completed = None
        for stream, owners in groups:
            self._respond_all(owners, jsonrpc.encode(parts[stream.key]), stream)
            if completed is None and stream.finished:
                completed = stream
        return completed

    def _completes(self, stream: EventStream) -> bool:
        """Will the answer routed to `stream` now be its one message? (Its lane may then write it
        before the stream keeps it: `LaneWatch.answer_first`.)"""
        post = self._posts.get(stream.key) if stream.empty else None
        return post is not None and len(post.waiting) == 1  # (the answer's request among them)

    def _note_response(self, response: dict[str, Any]) -> None:
        request = self._requests[jsonrpc.id_key(response.get("id"))]
        result = response.get("result")
        if request.method == protocol.INITIALIZE and isinstance(result, dict):
            version = result.get("protocolVersion")
            self.protocol_version = version if isinstance(version, str) else None

    def _respond(self, key: jsonrpc.IdKey, raw: bytes) -> None:
        request = self._requests.get(key)
        if request is not None:
            self._respond_all([key], raw, request.stream)

    def _respond_all(self, keys: list[jsonrpc.IdKey], raw: bytes, stream: EventStream) -> None:
        stream.append(raw)
        post = self._posts.get(stream.key)
        for key in keys:
            request = self._requests.pop(key, None)
            if request is None:
                continue
            if request.token is not None and self._tokens.get(request.token) == key:
                del self._tokens[request.token]
            if post is not None:
                post.waiting.discard(key)
        if post is not None and not post.waiting:
            self._finish_post(stream.key)
        self._on_change()

    def _finish_post(self, key: str) -> None:
        post = self._posts.pop(key)
        post.stream.finish()
        if not post.stream.resumable:  # its client left with no event id: nobody can resume it
            del self._streams[key]
            self.budget.remove(post.stream)
            return
        self._finished.append(key)
        while len(self._finished) > FINISHED_STREAMS_KEPT:
            # The oldest stream handed out whole goes first: one its client dropped before the end
            # is kept for it to resume, however many other requests finish meanwhile.
            # Then one whose whole answer is being written to its client, then the oldest.
            read = next((k for k in self._finished if self._handed_out_whole(k)), None)
            if read is None:
                written = (k for k in self._finished if self._handed_out_whole(k, ended=False))
                read = next(written, self._finished[0])
            self._finished.remove(read)
            stream = self._streams.pop(read, None)
            if stream is not None:
                self.budget.remove(stream)

    def forget(self, stream: EventStream) -> None:
        """A POST stream nobody can resume (answered as JSON, or left by its client before any event
        of it was sent: the client has no event id of it) is not kept among the finished ones: a
        session would hold its last eight answers, however large, after the client had read them,
        and streams that can be resumed were pushed out for those that cannot."""
        stream.resumable = False  # when it finishes later, it is let go then (`_finish_post`)
        if stream.finished and self._streams.get(stream.key) is stream and stream.key in self._finished:
            self._finished.remove(stream.key)
            del self._streams[stream.key]
            self.budget.remove(stream)

    @property
    def over_budget(self) -> bool:
        """Does the session keep more for replay than it may (see `relieve`)?"""
        return self.budget.total > self.budget.limit

    async def relieve(self) -> None:
        """While the session keeps more for replay than it may because live readers have yet to
        write it, wait for them (each for at most `STALL_SECONDS` without writing): what they have
        not written is not let go, and the upstream is held up meanwhile."""
        while not self.closed and (stream := self.budget.holding_up()) is not None:
            await stream.progress()

    def _handed_out_whole(self, key: str, *, ended: bool = True) -> bool:
        """Was the stream written whole by a response that has ended (`ended`: else, that is still
        ending)? One still being written, its last events maybe still on their way, may yet be lost
        with its client's connection."""
        stream = self._streams.get(key)
        if stream is None:
            return True
        return not (ended and stream.responding) and stream.complete_after(stream.delivered)

    def _target(self, related: Any, params: Any) -> EventStream:
        if related is not None:
            request = self._requests.get(jsonrpc.id_key(related))
            if request is not None:
                return request.stream
        # A server message names a request's token directly in its params (notifications/progress).
        token = params.get("progressToken") if isinstance(params, dict) else None
        if token is not None:
            key = self._tokens.get(jsonrpc.id_key(token))
            if key is not None and key in self._requests:
                return self._requests[key].stream
        if len(self._requests) == 1:
            return next(iter(self._requests.values())).stream
        return self.get_stream

    # -- end -------------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """The session ended: requests still waiting get an error, and every stream ends."""
        for key, request in list(self._requests.items()):
            error = jsonrpc.error_response(request.request_id, protocol.INTERNAL_ERROR, reason)
            self._respond_all([key], jsonrpc.encode(error), request.stream)
        self.closed = True
        for stream in self._streams.values():
            stream.finish()
        self._on_change()


def _is_answer(message: Any) -> bool:
    """Is one message (of a batch) a response or an error, under an id?"""
    return isinstance(message, dict) and "method" not in message and "id" in message


def _told(call: Callable[..., bool | None], *args: Any) -> bool:
    """Tell a stream's lane (`LaneWatch`); its failure costs the client its answer, not the relay
    its routing (False then)."""
    try:
        return call(*args) is not False
    except Exception:
        log.exception("writing an answer to the client failed")
        return False


class InboxChannel:
    """The receiving half of an HTTP front's client channel: POSTed messages, queued by the
    handlers, come out of `inbox`; `on_message` counts each message either way (for metrics)."""

    def __init__(
        self,
        inbox: MessageQueue[bytes],
        on_message: Callable[[str], None] = lambda direction: None,
    ) -> None:
        self._inbox = inbox
        self._on_message = on_message

    async def receive(self) -> bytes:
        message = await self._inbox.receive()
        self._on_message("from_client")
        return message

    @property
    def idle(self) -> bool:
        """Is the relay waiting for the client's next message, with none queued?"""
        return self._inbox.waiting

    def took(self) -> None:
        """A message of the client's handed to the relay directly (`sidecar/lane.py`): counted."""
        self._on_message("from_client")

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        return await self.receive(), None


class SessionChannel(InboxChannel):
    """The relay's client side for one HTTP session: POSTed messages in, routed messages out."""

    def __init__(
        self,
        router: SessionRouter,
        inbox: MessageQueue[bytes],
        on_message: Callable[[str], None] = lambda direction: None,
    ) -> None:
        super().__init__(inbox, on_message)
        self.router = router

    def _route(self, message: bytes, related: Any) -> Callable[[], Awaitable[None]] | None:
        """Route `message`; a stream it completed is answered at once by its lane, or its handler's
        quick answer is returned to be written."""
        self._on_message("to_client")
        router = self.router
        router.last_target = None
        completed = router.route(message, related)
        if completed is None:
            return None
        if completed.lane is not None:
            try:
                completed.lane.answer()
            except Exception:  # the client's answer failed; the relay goes on
                log.exception("writing an answer to the client failed")
            return None
        return completed.answer_now

    async def _answer(self, answer_now: Callable[[], Awaitable[None]]) -> None:
        try:
            await answer_now()
        except Exception:  # the client's answer failed; the relay goes on
            log.exception("writing an answer to the client failed")

    def can_send_now(self) -> bool:
        """`SendsAtOnce`: unless a live reader is behind, or the session keeps more than it may."""
        router = self.router
        target = router.last_target
        budget = router.budget  # (`over_budget`, without a property's call on every message)
        return budget.total <= budget.limit and not (target is not None and target.behind)

    def send_now(self, message: bytes, related: Any = None) -> None:
        self._route(message, related)  # (a handler waiting for a quick answer, woken, writes it)

    def answer_ahead(self, message: bytes, response: dict[str, Any]) -> Callable[[], None] | None:
        """`AnswersAhead`: see `SessionRouter.answer_ahead`."""
        return self.router.answer_ahead(message, response)

    async def send(self, message: bytes, related: Any = None) -> None:
        answer_now = self._route(message, related)
        if answer_now is not None:
            await self._answer(answer_now)
        router = self.router
        target = router.last_target
        if target is not None and target.behind:
            await target.catch_up()  # a burst its live reader has yet to write: held up, not dropped
        if router.over_budget:
            await router.relieve()  # what live readers have yet to write: held up, not dropped


INBOX_SIZE = 64
"""Messages a front's handlers may queue for the relay before the next one waits."""
