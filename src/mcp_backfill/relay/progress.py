"""`notifications/progress` for sampling requests that carry `_meta.progressToken`.

While Claude streams, the server hears how far the answer has got. The unit is generated
characters (text, tool-input JSON, thinking) summed over attempts and calls, so the value only ever
grows (the spec requires it) even when a failed attempt is retried from scratch or a paused turn is
continued by another call. Notifications are throttled to one per `interval`; the final one, when
the answer is complete (after its last call), counts one more unit so it is always the largest
value, and carries `total` equal to `progress`.

Sending a notification may take a while (to an HTTP upstream each is a POST, read once the server
has acknowledged it): within `beside()` they go out from a task of their own, so Claude's stream is
never held up by them (it was, past `--sampling-timeout`, the call failed and charged). One waits
while another is under way, replaced by any later one; the final one goes out after it, and before
the answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeGuard

import anyio

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.sampling.provider import StreamProgress

log = get_logger("relay")

DEFAULT_INTERVAL = 0.25  # at most four notifications a second per request


class ProgressNotifier:
    """A `ProgressCallback` that sends throttled progress notifications for one request."""

    def __init__(
        self,
        token: str | int,
        send: Callable[[bytes], Awaitable[None]],
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        with_message: bool = True,
    ) -> None:
        self.token = token
        self._with_message = with_message  # `message` arrived in 2025-03-26
        self._send = send
        self._interval = interval
        self._clock = clock
        self._earlier = 0  # characters of finished or abandoned attempts
        self._current = 0  # characters of the running attempt
        self._run = (1, 1)  # the running attempt: (call, attempt)
        self._sent = 0
        self._sent_at = -math.inf
        self._done = False
        self._waiting: bytes | None = None  # the latest notification, while one is under way
        self._wake: anyio.Event | None = None  # set when one waits; None: sent inline
        self._under_way = False
        self._went: anyio.Event | None = None  # set when the one under way went out

    @asynccontextmanager
    async def beside(self) -> AsyncIterator[ProgressNotifier]:
        """Send the notifications from a task of their own while this is open; what waits at the
        end (the answer failed, or was cancelled) is not sent. The answer's failure leaves as it is
        (a task group wraps what its body raises in an `ExceptionGroup`, which the answerer did not
        take for a `SamplingError`: the relay crashed, ending the session)."""
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            self._wake = anyio.Event()
            tg.start_soon(self._sender)
            try:
                yield self
            except Exception as exc:
                failure = exc
            finally:
                self._wake = None
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _sender(self) -> None:
        while self._wake is not None:
            await self._wake.wait()
            self._wake = anyio.Event()
            raw, self._waiting = self._waiting, None
            if raw is None:
                continue
            self._under_way, self._went = True, anyio.Event()
            try:
                await self._send(raw)
            except Exception:  # a notification lost must not fail the answer, nor end the session
                log.warning("progress notification not sent", exc_info=True)
            finally:
                self._under_way = False
                self._went.set()

    async def __call__(self, progress: StreamProgress) -> None:
        if self._done:
            return
        run = (progress.call, progress.attempt)
        if run != self._run or progress.characters < self._current:
            self._earlier += self._current  # a new attempt (or call) starts again from zero
            self._run = run
        self._current = progress.characters
        value = self._earlier + self._current
        if progress.done:
            self._done = True
            tokens = "" if progress.output_tokens is None else f" ({progress.output_tokens} output tokens)"
            await self._notify(value + 1, f"Claude finished{tokens}", total=value + 1)
        elif value > self._sent and self._clock() - self._sent_at >= self._interval:
            retry = f", attempt {progress.attempt}" if progress.attempt > 1 else ""
            await self._notify(value, f"Claude is writing ({value} characters{retry})")

    async def _notify(self, value: int, message: str, total: int | None = None) -> None:
        params: dict[str, Any] = {"progressToken": self.token, "progress": value}
        if total is not None:
            params["total"] = total
        if self._with_message:
            params["message"] = message
        self._sent, self._sent_at = value, self._clock()
        raw = jsonrpc.encode({"jsonrpc": "2.0", "method": protocol.PROGRESS, "params": params})
        if self._wake is None:
            await self._send(raw)
        elif total is None:
            self._waiting = raw  # replaces one still waiting: the latest value is what counts
            self._wake.set()
        else:  # the final one: after the one under way, and before the answer
            self._waiting = None
            while self._under_way and self._went is not None:
                await self._went.wait()
            await self._send(raw)


def progress_notifier(
    params: dict[str, Any], send: Callable[[bytes], Awaitable[None]], version: str | None = None
) -> ProgressNotifier | None:
    """A notifier for this sampling request, or None when it asked for no progress; `version` is the
    session's revision: before 2025-03-26 a notification has no `message`."""
    token = protocol.progress_token(params)
    if token is None:
        return None
    return ProgressNotifier(
        token, send, with_message=protocol.defines(version, protocol.PROGRESS_MESSAGE_SINCE)
    )


ROUND_PROGRESS_INTERVAL = 5.0
"""Seconds between two notifications the proxy sends a 2026-07-28 client while Claude answers a
round's sampling: well within the 60 s an SDK client waits for a request by default (those that
reset their timeout on progress, as the TypeScript SDK's `resetTimeoutOnProgress`, then wait on)."""

Number = int | float


def is_number(value: object) -> TypeGuard[Number]:
    """A progress value the relay can compare: an integer or a float (not a boolean; a number a
    double cannot hold stays the server's, untouched)."""
    return type(value) is int or type(value) is float


def above(value: Number | None) -> Number:
    """The next progress value after `value`: one more (1 for none yet), or the next float up when
    one more is lost in its precision."""
    if value is None:
        return 1
    if value + 1 > value:
        return value + 1
    return math.nextafter(value, math.inf)


class RoundProgress:
    """The progress a 2026-07-28 client hears for a request whose `input_required` rounds the proxy
    drives, under the request's `progressToken`.

    The client sees one request; the server sees one per round, each new to it (the proxy re-sends
    the request under its own id, with the same token), and may count from the start again (an SDK
    handler runs again on each round), while the spec has a token's values increase with each
    notification. So until the proxy drives a round the server's notifications pass as they came;
    afterwards one whose value would not be above the last the client heard is lifted just above it
    (its `total` by as much, its message kept), and so are the later ones of the same re-sent
    request. While Claude answers a round the proxy sends notifications of its own (`beat`), one
    more than the last value each.
    """

    def __init__(self, token: str | int) -> None:
        self.token = token
        self.heard: Number | None = None  # the last value the client was sent
        self._lift: Number = 0  # what the current re-sent request's values are raised by

    def passed(self, value: Number) -> None:
        """A notification of the client's own request, relayed as the server sent it."""
        if self.heard is None or value > self.heard:
            self.heard = value

    def lifted(self, value: Number) -> Number:
        """The value the client is sent for the server's `value`, in a round the proxy drives."""
        shown = value + self._lift
        if self.heard is not None and not shown > self.heard:
            shown = above(self.heard)
            self._lift = shown - value
        self.heard = shown
        return shown

    def resent(self) -> None:
        """The proxy re-sent the request: the server's values are taken as they come again."""
        self._lift = 0

    def beat(self) -> Number:
        """The value of a notification of the proxy's own."""
        self.heard = above(self.heard)
        return self.heard

    def relayed(self, message: dict[str, Any], params: dict[str, Any], driven: bool) -> dict[str, Any]:
        """A server's `notifications/progress` for this token as the client gets it (`message`
        itself when unchanged); `driven`: the proxy drives the request's rounds now."""
        value = params.get("progress")
        if not is_number(value):
            return message
        if not driven:
            self.passed(value)
            return message
        shown = self.lifted(value)
        if shown == value and type(shown) is type(value):
            return message
        changed: dict[str, Any] = {**params, "progress": shown}
        total = params.get("total")
        if is_number(total):
            changed["total"] = total + (shown - value)
        return {**message, "params": changed}

    def notification(self, seconds: float) -> bytes:
        params = {
            "progressToken": self.token,
            "progress": self.beat(),
            "message": f"mcp-backfill: Claude is answering the server's sampling request ({seconds:.0f} s)",
        }
        return jsonrpc.encode({"jsonrpc": "2.0", "method": protocol.PROGRESS, "params": params})
