"""Retries owned by the proxy: jittered exponential backoff inside a per-request deadline.

The SDK's own retry loop honours any `retry-after` (up to ~49 days) and knows nothing of the MCP
caller waiting on the other side, so it is switched off (`max_retries=0`) and every provider is
wrapped in `RetryingProvider` instead:

* retried: what the provider marks `retryable` (429, 529, other 5xx, 408/409, dropped or refused
  connections, timeouts, a mid-stream `overloaded_error`, a malformed or truncated stream, where
  the credentials come from out of reach (Vertex's token endpoint, AWS STS...): nothing was sent,
  nothing is charged). A
  message is only used once it is complete, so an attempt that failed half-way delivered nothing
  and can be repeated as a whole;
* attempt n+1 waits a random time between 50 % and 100 % of min(max_delay, base_delay * 2^(n-1)),
  or the server's `retry-after`, capped at max_delay;
* the whole call, attempts and waits included, stays within `deadline` seconds: a wait that would
  end past it is not started, and an attempt still running at the deadline is cancelled. The calls
  of one sampling request (a paused turn continued) share it (`sampling.provider.one_deadline`): a
  call after the first has what is left, and none is made once it is over.

Every attempt reports to the caller's `UsageMeter` on its own, so a failed or cancelled attempt is
charged as well as the one that succeeds.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio

from mcp_backfill.errors import ProviderError
from mcp_backfill.logs import get_logger
from mcp_backfill.options import env_var, named
from mcp_backfill.sampling.provider import (
    AttemptObserver,
    ProgressCallback,
    Provider,
    StreamProgress,
    UsageMeter,
    shared_deadline,
)

log = get_logger("retry")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry; `deadline` None means no deadline (attempts still bound it).

    Built from `Config` by `assembly`.
    """

    max_attempts: int
    base_delay: float
    max_delay: float
    deadline: float | None

    def delay(self, failed_attempts: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after `failed_attempts` failures; `rand` is uniform in [0, 1)."""
        if retry_after is not None:
            return min(retry_after, self.max_delay)
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** min(failed_attempts - 1, 60))
        return ceiling * (0.5 + rand / 2)


class RetryingProvider:
    """Wraps any `Provider` with the retry policy; the clock, sleep and randomness are injectable."""

    def __init__(
        self,
        inner: Provider,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        observer: AttemptObserver | None = None,
    ) -> None:
        self.inner = inner
        self.observer = observer
        self.policy = policy
        self.name = inner.name
        self._sleep = sleep
        self._clock = clock
        self._rand = rand

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        policy = self.policy
        shared = shared_deadline()
        if shared is not None and shared.at is not None:  # an earlier call of the request set it
            deadline_at = shared.at
            if deadline_at <= self._clock():
                raise self._deadline_error(0, None)  # no call made: nothing sent, nothing to charge
        else:
            deadline_at = self._clock() + policy.deadline if policy.deadline else math.inf
            if shared is not None:
                shared.at = deadline_at
        last: ProviderError | None = None
        attempt = 0
        while True:
            attempt += 1
            with anyio.move_on_after(deadline_at - self._clock()) as scope:
                try:
                    message = await self.inner.create_message(
                        request, on_progress=_numbered(on_progress, attempt), meter=meter
                    )
                    self._note("ok", None)
                    return message
                except ProviderError as exc:
                    if not exc.retryable:
                        self._note("failed", exc)
                        raise _annotated(exc, attempts=attempt) from None
                    last = exc
                except anyio.get_cancelled_exc_class():
                    if not scope.cancel_called:  # not the deadline: the request was cancelled
                        self._note("cancelled", None)  # sent, and maybe billed: still an attempt
                    raise
            if scope.cancelled_caught:
                self._note("failed", "timeout")
                raise self._deadline_error(attempt, None)
            assert last is not None
            if attempt >= policy.max_attempts:
                raise self._give_up(last, attempt, "retries_exhausted", f"gave up after {attempt} attempts")
            delay = policy.delay(attempt, last.retry_after, self._rand())
            if self._clock() + delay >= deadline_at:
                self._note("failed", last)
                raise self._deadline_error(attempt, last)
            try:
                if meter is not None and not await meter.may_retry():
                    raise self._give_up(last, attempt, "budget", _NO_ROOM)
                log.info(
                    "Claude API call failed; retrying",
                    extra={
                        "provider": self.name,
                        "status": (last.data or {}).get("status"),
                        "type": (last.data or {}).get("type"),
                        "attempt": attempt,
                        "delay_s": round(delay, 3),
                    },
                )
                await self._sleep(delay)
            except anyio.get_cancelled_exc_class():
                # The request was cancelled before the retry was made: no attempt follows this one.
                self._note("cancelled", last)
                raise
            self._note("retried", last)  # counted once another attempt is sure to follow

    def _give_up(self, last: ProviderError, attempts: int, why: str, saying: str) -> ProviderError:
        self._note("failed", last)
        return _annotated(last, attempts=attempts, gave_up=why, message=f"{last.message} ({saying})")

    def _note(self, outcome: str, error: ProviderError | str | None) -> None:
        if self.observer is None:
            return
        if isinstance(error, ProviderError):
            data = error.data or {}
            error = str(data.get("type") or data.get("status") or "unknown")
        self.observer.attempt_done(provider=self.name, outcome=outcome, error_type=error)

    def _deadline_error(self, attempts: int, last: ProviderError | None) -> ProviderError:
        limit = f"{self.policy.deadline:g}s"
        if last is None:
            flag = named("--sampling-timeout")
            if attempts:  # the attempt was still running when the deadline came
                message = f"Claude API gave no answer within {flag} ({limit}, {attempts} attempts)"
            else:  # the request's earlier calls took all of its time
                message = f"No time was left within {flag} ({limit}) for another Claude call"
            data: dict[str, Any] = {"provider": self.name, "type": "timeout"}
            return ProviderError(message, {**data, "attempts": attempts, "gave_up": "deadline"})
        message = (
            f"{last.message} (gave up after {attempts} attempts: "
            f"another one would not finish within --sampling-timeout {limit}, "
            f"{env_var('--sampling-timeout')})"
        )
        return _annotated(last, attempts=attempts, gave_up="deadline", message=message)

    async def aclose(self) -> None:
        await self.inner.aclose()


# Why a retry was not made for a budget, with the options (and variables) that raise one: which of
# them had no room is the meter's to know, not this loop's.
_NO_ROOM = (
    "not retried: a token budget has no room for another attempt; raise the one used up: "
    f"{named('--budget-tokens')}, {named('--client-budget-tokens')} or {named('--session-budget-tokens')}"
)


def _annotated(
    error: ProviderError, *, attempts: int, gave_up: str | None = None, message: str | None = None
) -> ProviderError:
    data = {**(error.data or {}), "attempts": attempts}
    if gave_up is not None:
        data["gave_up"] = gave_up
    return ProviderError(
        message or error.message,
        data,
        code=error.code,
        retryable=error.retryable,
        retry_after=error.retry_after,
    )


def _numbered(callback: ProgressCallback | None, attempt: int) -> ProgressCallback | None:
    if callback is None:
        return None

    async def report(progress: StreamProgress) -> None:
        await callback(replace(progress, attempt=attempt))

    return report
