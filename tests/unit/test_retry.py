"""The retry wrapper: which failures are retried, how long it waits, and where it stops.

Time is simulated (an injected clock that `sleep` advances), so the policy's numbers are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import ProviderError, SamplingError
from mcp_backfill.protocol import INVALID_PARAMS
from mcp_backfill.providers.retry import RetryingProvider
from mcp_backfill.sampling.provider import ProgressCallback, StreamProgress, UsageMeter, one_deadline
from tests.defaults import RETRY

pytestmark = pytest.mark.anyio

MESSAGE: dict[str, Any] = {"id": "msg_1", "content": [{"type": "text", "text": "hi"}]}


def overloaded(retry_after: float | None = None) -> ProviderError:
    data = {"provider": "fake", "status": 529, "type": "overloaded_error", "request_id": "req_1"}
    message = "Claude API error (529 overloaded_error): Overloaded"
    return ProviderError(message, data, retryable=True, retry_after=retry_after)


Outcome = dict[str, Any] | Exception | Callable[[], Any]


class Scripted:
    """A provider that plays back outcomes, one per call, advancing the simulated clock."""

    name = "fake"

    def __init__(self, clock: SimulatedTime, outcomes: list[Outcome], call_seconds: float = 1.0) -> None:
        self.clock = clock
        self.outcomes = outcomes
        self.call_seconds = call_seconds
        self.calls = 0

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        outcome = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        self.clock.now += self.call_seconds
        if on_progress is not None:
            await on_progress(StreamProgress(characters=10 * self.calls))
        if isinstance(outcome, Exception):
            raise outcome
        if callable(outcome):
            return dict(await outcome())
        return outcome

    async def aclose(self) -> None:
        return None


class SimulatedTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def wrap(inner: Scripted, time: SimulatedTime, rand: float = 0.5, **policy: Any) -> RetryingProvider:
    return RetryingProvider(
        inner, replace(RETRY, **policy), sleep=time.sleep, clock=time.clock, rand=lambda: rand
    )


async def test_transient_failures_are_retried_with_growing_jittered_waits() -> None:
    time = SimulatedTime()
    inner = Scripted(time, [overloaded(), overloaded(), overloaded(), MESSAGE])
    provider = wrap(inner, time, rand=0.0, base_delay=0.5, max_delay=10.0)
    assert await provider.create_message({}) == MESSAGE
    assert inner.calls == 4
    assert time.slept == [0.25, 0.5, 1.0]  # 50 % of 0.5, 1, 2 with rand = 0


def test_backoff_bounds() -> None:
    policy = replace(RETRY, base_delay=0.5, max_delay=3.0)
    assert [policy.delay(n, None, 0.0) for n in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 1.5, 1.5]
    assert [policy.delay(n, None, 0.999999) for n in (1, 2, 3)] == pytest.approx([0.5, 1.0, 2.0])
    assert policy.delay(1, 3600.0, 0.5) == 3.0  # retry-after honoured only up to the cap
    assert policy.delay(4, 0.2, 0.5) == 0.2  # and exactly below it
    assert policy.delay(10_000, None, 0.5) == 2.25  # no overflow on absurd counts


async def test_retry_after_is_capped() -> None:
    time = SimulatedTime()
    inner = Scripted(time, [overloaded(retry_after=3600), overloaded(retry_after=0.2), MESSAGE])
    provider = wrap(inner, time, max_delay=5.0)
    assert await provider.create_message({}) == MESSAGE
    assert time.slept == [5.0, 0.2]


async def test_request_faults_are_not_retried() -> None:
    time = SimulatedTime()
    data = {"provider": "fake", "status": 400, "type": "invalid_request_error"}
    bad = ProviderError("Claude API error (400 invalid_request_error): too long", data, code=INVALID_PARAMS)
    inner = Scripted(time, [bad, MESSAGE])
    with pytest.raises(ProviderError) as caught:
        await wrap(inner, time).create_message({})
    assert inner.calls == 1
    assert time.slept == []
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {**data, "attempts": 1}


async def test_other_sampling_errors_pass_through_untouched() -> None:
    time = SimulatedTime()
    error = SamplingError(INVALID_PARAMS, "messages must be a non-empty list")
    inner = Scripted(time, [error])
    with pytest.raises(SamplingError) as caught:
        await wrap(inner, time).create_message({})
    assert caught.value is error


async def test_attempts_run_out() -> None:
    time = SimulatedTime()
    inner = Scripted(time, [overloaded()])
    with pytest.raises(ProviderError) as caught:
        await wrap(inner, time, max_attempts=3, deadline=None).create_message({})
    assert inner.calls == 3
    assert len(time.slept) == 2
    data = caught.value.data
    assert data == {
        "provider": "fake",
        "status": 529,
        "type": "overloaded_error",
        "request_id": "req_1",
        "attempts": 3,
        "gave_up": "retries_exhausted",
    }
    assert "3 attempts" in caught.value.message


async def test_deadline_stops_retries_before_a_wait_would_overrun_it() -> None:
    """529 for a long stretch: attempts continue until the next wait would end past the deadline."""
    time = SimulatedTime()
    start = time.now
    inner = Scripted(time, [overloaded()], call_seconds=1.0)
    provider = wrap(inner, time, rand=0.0, base_delay=1.0, max_delay=4.0, max_attempts=100, deadline=20.0)
    with pytest.raises(ProviderError) as caught:
        await provider.create_message({})
    # Each call takes 1 s; the waits are 0.5, 1, then 2 (50 % of the 4 s cap) every time. After the
    # 8th call (at 19.5 s) another 2 s wait would end past 20 s: stop there, without waiting.
    assert inner.calls == 8
    assert time.slept == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert time.now - start == 19.5
    data = caught.value.data
    assert data is not None
    assert (data["status"], data["type"], data["attempts"], data["gave_up"]) == (
        529,
        "overloaded_error",
        8,
        "deadline",
    )
    assert "--sampling-timeout 20s, MCP_BACKFILL_SAMPLING_TIMEOUT" in caught.value.message


async def test_an_attempt_still_running_at_the_deadline_is_cancelled() -> None:
    cancelled = anyio.Event()

    async def hang() -> Any:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    class Hanging:
        name = "fake"

        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            return dict(await hang())

        async def aclose(self) -> None:
            return None

    provider = RetryingProvider(Hanging(), replace(RETRY, deadline=0.05))
    with pytest.raises(ProviderError) as caught:
        await provider.create_message({})
    assert cancelled.is_set()
    assert caught.value.data == {"provider": "fake", "type": "timeout", "attempts": 1, "gave_up": "deadline"}


async def test_the_callers_cancellation_is_not_turned_into_an_error() -> None:
    time = SimulatedTime()
    calls: list[str] = []

    async def forever() -> Any:
        calls.append("started")
        await anyio.sleep_forever()

    inner = Scripted(time, [forever])
    with anyio.move_on_after(0.05) as scope:
        await wrap(inner, time, deadline=None).create_message({})
    assert scope.cancelled_caught
    assert calls == ["started"]


async def test_progress_reports_carry_the_attempt_number() -> None:
    time = SimulatedTime()
    inner = Scripted(time, [overloaded(), MESSAGE])
    seen: list[StreamProgress] = []

    async def record(progress: StreamProgress) -> None:
        seen.append(progress)

    await wrap(inner, time).create_message({}, on_progress=record)
    assert [(p.attempt, p.characters) for p in seen] == [(1, 10), (2, 20)]


class Attempts:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    def attempt_done(self, *, provider: str, outcome: str, error_type: str | None) -> None:
        assert provider == "fake"
        self.seen.append((outcome, error_type))


async def test_every_attempt_is_reported_to_the_observer() -> None:
    time = SimulatedTime()
    attempts = Attempts()
    provider = wrap(Scripted(time, [overloaded(), overloaded(), MESSAGE]), time)
    provider.observer = attempts
    assert await provider.create_message({}) == MESSAGE
    assert attempts.seen == [("retried", "overloaded_error"), ("retried", "overloaded_error"), ("ok", None)]

    attempts.seen.clear()
    provider = wrap(Scripted(time, [overloaded()]), time, max_attempts=2)
    provider.observer = attempts
    with pytest.raises(ProviderError):
        await provider.create_message({})
    assert attempts.seen == [("retried", "overloaded_error"), ("failed", "overloaded_error")]


async def test_the_calls_of_one_request_share_its_deadline() -> None:
    """A paused turn's continuation is another call of the same sampling request: it gets what is
    left of the request's deadline (it got a whole one of its own, so a request could run four
    times `--sampling-timeout`), and none is made once the deadline is over."""
    time = SimulatedTime()
    start = time.now
    inner = Scripted(time, [overloaded(), MESSAGE, overloaded()], call_seconds=6.0)
    provider = wrap(inner, time, rand=0.0, base_delay=4.0, max_attempts=100, deadline=20.0)
    with one_deadline():
        assert await provider.create_message({}) == MESSAGE  # 6 + 2 + 6 s of the 20
        with pytest.raises(ProviderError) as caught:
            await provider.create_message({})  # 6 s more: a 2 s wait would end past 20 s
        assert time.now - start == 20.0
        assert caught.value.data is not None
        assert caught.value.data["gave_up"] == "deadline"
        calls = inner.calls
        with pytest.raises(ProviderError) as late:
            await provider.create_message({})
        assert inner.calls == calls  # nothing sent: nothing to charge
        assert late.value.data is not None
        assert (late.value.data["attempts"], late.value.data["gave_up"]) == (0, "deadline")
        assert "No time was left within --sampling-timeout / MCP_BACKFILL_SAMPLING_TIMEOUT (20s)" in (
            late.value.message
        )
    with pytest.raises(ProviderError):  # a new request has a deadline of its own
        await provider.create_message({})
    assert inner.calls == calls + 3
