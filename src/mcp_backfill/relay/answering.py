"""Sampling answered by the proxy: the handshake era's server requests, and the questions of rounds.

In the handshake era a server sends `sampling/createMessage` as a request of its own; when the
proxy answers it, the answer goes back under the server's id, with progress notifications while
Claude streams if the request asked for them, and a `notifications/cancelled` from the server stops
the Claude call. A sampling request known to be made for a client request (it came on that
request's response stream) is also stopped when the client cancels that request: the server is
answered `-32800` then (`cut_for_client`). The 2026-07-28 round driver asks the same sampler
through `sample()`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.relay.progress import progress_notifier
from mcp_backfill.sampling.provider import ProgressCallback
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import SamplingSession
from mcp_backfill.telemetry import RequestSpan

log = get_logger("relay")

ANSWERING_LIMIT = 256
"""Server requests one session answers itself at once, answers still being sent included (`InHand`)."""

Approve = Callable[[dict[str, Any], Any], Awaitable[None]]
"""Returns when the user allows a sampling request (`params`, the related client request id), or
raises the refusal."""


async def _always(params: dict[str, Any], related: Any) -> None:
    return None


class InHand:
    """The server's requests a session answers itself (sampling, sampling tasks, their `tasks/result`,
    refusals), each counted from the moment it is read until its answer is sent. (The other
    `tasks/*` about the proxy's tasks are answered at once, in order, and read on past the limit.)

    The relay reads nothing more from the upstream while `ANSWERING_LIMIT` are in hand (`room()`):
    each holds its params, and an upstream writing requests faster than they are answered, or not
    reading the answers, would have them pile up without end.
    """

    def __init__(self, limit: int = ANSWERING_LIMIT) -> None:
        self.limit = limit
        self.running = 0
        self._room: anyio.Event | None = None
        self._held = False

    @property
    def full(self) -> bool:
        return self.running >= self.limit

    def start(self, task_group: TaskGroup, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run `work(*args)` in `task_group`, counted as in hand until it returns."""
        self.running += 1
        task_group.start_soon(self._counted, work, args)

    async def _counted(self, work: Callable[..., Awaitable[None]], args: tuple[Any, ...]) -> None:
        try:
            await work(*args)
        finally:
            self.running -= 1
            if self._room is not None and not self.full:
                self._room.set()
                self._room = None

    async def room(self) -> None:
        """Wait until fewer than the limit are in hand."""
        while self.full:
            if not self._held:
                self._held = True
                log.warning(
                    "upstream sends requests faster than they are answered; reading from it waits",
                    extra={"in_hand": self.running},
                )
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()


@dataclass
class _Answering:
    """One server request being answered."""

    request_id: Any
    scope: anyio.CancelScope
    # The client request it was made for, when known (its id key).
    related: jsonrpc.IdKey | None
    # Set when the client cancelled that request: what the server is answered instead.
    cut: str | None = None


class Answerer:
    """Answers sampling requests with the sampler, charged to one session."""

    def __init__(
        self,
        sampler: Sampler,
        session: SamplingSession | None,
        send_upstream: Callable[[bytes], Awaitable[None]],
        approve: Approve = _always,
        revision: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.sampler = sampler
        self._revision = revision  # the session's negotiated revision (the progress it may be sent)
        self.session = session
        self._send_upstream = send_upstream
        self._approve = approve
        # The server's sampling requests being answered, by their id: cancelling one stops it.
        self._answering: dict[jsonrpc.IdKey, _Answering] = {}
        self._tg: TaskGroup | None = None
        self.hand = InHand()
        """The server's requests this session answers, counted until their answers are sent."""

    def start(self, task_group: TaskGroup) -> None:
        """Requests are answered in tasks of `task_group` (the relay's)."""
        self._tg = task_group

    def answer_request(
        self,
        request_id: Any,
        params: dict[str, Any],
        related: Any = None,
        span: RequestSpan | None = None,
    ) -> None:
        """Answer the server's request `request_id` in the background; `related` is the client
        request it was made for (an approval question travels with it), `span` its trace span,
        which the answer or the server's cancellation ends."""
        entry = _Answering(
            request_id, anyio.CancelScope(), None if related is None else jsonrpc.id_key(related)
        )
        self._answering[jsonrpc.id_key(request_id)] = entry
        assert self._tg is not None
        self.hand.start(self._tg, self._answer, request_id, params, entry, related, span)

    def answering(self, request_id: Any) -> bool:
        """Is the proxy still answering the server's request `request_id`?"""
        return jsonrpc.id_key(request_id) in self._answering

    def refuse(
        self,
        request_id: Any,
        code: int,
        message: str,
        span: RequestSpan | None = None,
        *,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        """Answer the server's request `request_id` with an error, in the background; `span`, its
        trace span, ends with that error. A sampling request's refusal (`sampling`: its params) is
        reported as the sampler reports its own."""
        assert self._tg is not None
        if sampling is not None:
            self.refused(sampling, SamplingError(code, message), request_id)
        refusal = jsonrpc.error_response(request_id, code, message)
        if span is not None:
            span.end(refusal["error"])
        self.hand.start(self._tg, self._send_upstream, jsonrpc.encode(refusal))

    def cancel(self, request_id: Any) -> bool:
        """The server cancelled `request_id`: stop answering it. False if the proxy is not answering it."""
        # Forgotten now: the server expects no answer, and may use the id again while this stops.
        entry = self._answering.pop(jsonrpc.id_key(request_id), None)
        if entry is None:
            return False
        log.info("upstream cancelled a sampling request", extra={"request_id": request_id})
        entry.cut = None  # the server expects no answer, not even the client's refusal
        entry.scope.cancel()
        return True

    def cut_for_client(self, related: Any, refusal: str) -> int:
        """The client cancelled its request `related`: stop answering the sampling requests made
        for it (their Claude calls are charged as any call cut short), each answered with the error
        `refusal` (-32800). Returns how many were cut."""
        key = jsonrpc.id_key(related)
        cut = 0
        for entry in self._answering.values():
            if entry.related == key and entry.cut is None:
                log.info(
                    "client cancelled the request a sampling request was made for; stopping it",
                    extra={"request_id": entry.request_id, "related": related},
                )
                entry.cut = refusal
                entry.scope.cancel()
                cut += 1
        return cut

    async def _answer(
        self,
        request_id: Any,
        params: dict[str, Any],
        entry: _Answering,
        related: Any,
        span: RequestSpan | None,
    ) -> None:
        response: dict[str, Any] | None = None
        approving = True  # until the sampler is asked: then it reports the exchange itself
        try:
            with entry.scope:
                try:
                    await self._approved(params, request_id, related)
                    approving = False
                    progress = progress_notifier(params, self._send_upstream, self._revision())
                    async with progress.beside() if progress is not None else nullcontext():
                        if span is None:
                            result = await self.sample(params, request_id, progress)
                        else:
                            with span.activate():
                                result = await self.sample(params, request_id, progress)
                    response = jsonrpc.result_response(request_id, result)
                except SamplingError as exc:
                    response = jsonrpc.error_response(request_id, exc.code, exc.message, exc.data)
        finally:
            if self._answering.get(jsonrpc.id_key(request_id)) is entry:  # not a later request's
                del self._answering[jsonrpc.id_key(request_id)]
            if response is None and entry.cut is not None:  # the client cancelled what it was for
                response = jsonrpc.error_response(request_id, protocol.REQUEST_CANCELLED, entry.cut)
                if approving:  # refused before the sampler was asked, as one made after the cancel
                    self.refused(params, SamplingError(protocol.REQUEST_CANCELLED, entry.cut), request_id)
            elif response is None and approving:  # the server (or the session's end) cancelled it
                self.abandoned(params, request_id)
            if span is not None:
                if response is None:
                    span.cancel()
                else:
                    span.end(response.get("error"))
        if response is not None:  # None: cancelled by the server (or the session), which expects none
            await self._send_upstream(jsonrpc.encode(response))

    async def sample_approved(
        self,
        params: dict[str, Any],
        request_id: Any,
        related: Any,
        cut: Callable[[], str | None] = lambda: None,
    ) -> dict[str, Any]:
        """`sample()` once the user has allowed the request (a sampling task's way). A task
        cancelled while the user's approval is awaited (`tasks/cancel`, its expiry, the session's
        end) is reported as cancelled, charged nothing; one the client's cancel cut (`cut()`: the
        refusal, -32800) as refused with that error, as a plain sampling request cut then. One
        cancelled before it began (the server cancelled the request before its task was sent) is
        reported so too: asking no user (`--approve off`) has no wait for the cancel to land on."""
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            await self._approved(params, request_id, related)
        except anyio.get_cancelled_exc_class():
            refusal = cut()
            if refusal is None:
                self.abandoned(params, request_id)
            else:
                self.refused(params, SamplingError(protocol.REQUEST_CANCELLED, refusal), request_id)
            raise
        return await self.sample(params, request_id)

    async def _approved(self, params: dict[str, Any], request_id: Any, related: Any) -> None:
        """Return once the user allows the request; a refusal is reported (the log, the audit log,
        the metrics) as the sampler reports its own, then raised."""
        try:
            await self._approve(params, related)
        except SamplingError as exc:
            self.refused(params, exc, request_id)
            raise

    def abandoned(self, params: dict[str, Any], request_id: Any) -> None:
        """Report a sampling request given up before the sampler was asked (cancelled, charged
        nothing), as the sampler reports a cancelled one."""
        self.sampler.abandoned(params, request_id=request_id, session=self.session)

    def refused(self, params: dict[str, Any], error: SamplingError, request_id: Any) -> None:
        """Report a sampling request refused before the sampler was asked (the log, the audit log,
        the metrics), as the sampler reports its own refusals."""
        self.sampler.refused(params, error, request_id=request_id, session=self.session)

    async def sample(
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
