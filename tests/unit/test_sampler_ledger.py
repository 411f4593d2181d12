"""The sampler and the ledger in-process: `pause_turn` continuations, the outcome and charge of an
exchange, and what the observer hears."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill import assembly
from mcp_backfill.errors import ProviderError, SamplingError
from mcp_backfill.options import Allowance
from mcp_backfill.providers.retry import RetryingProvider, RetryPolicy
from mcp_backfill.sampling.convert import META_KEY
from mcp_backfill.sampling.provider import ProgressCallback, Provider, UsageMeter
from mcp_backfill.sampling.sampler import MAX_PAUSE_CONTINUATIONS, Sampler, convert_canned
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.sampling.store import Limit, MemoryStore, Standing
from tests.defaults import CONFIG, SPEND

pytestmark = pytest.mark.anyio

PARAMS = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "search the web"}}],
    "maxTokens": 100,
}


def paused(n: int, stop_reason: str = "pause_turn") -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": f"part {n}. "}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10 * n, "output_tokens": n, "cache_read_input_tokens": 1},
    }


# A retryable failure after Claude's stream reported the input (billed), or with an HTTP error
# status (not billed): script entries of `Scripted`.
BILLED, NOT_BILLED = "billed", "not billed"


class Scripted:
    """Answers with the given messages in turn, reporting each one's usage as final; an exception
    is raised, and `BILLED` or `NOT_BILLED` fail the attempt retryably."""

    name = "scripted"

    def __init__(self, *messages: dict[str, Any] | Exception | str) -> None:
        self.messages = list(messages)
        self.requests: list[dict[str, Any]] = []

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        assert meter is not None
        self.requests.append(request)
        meter.begin_attempt()
        outcome = self.messages.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, str):
            if outcome == BILLED:
                meter.report({"input_tokens": 50, "output_tokens": 1})
            else:
                meter.not_billed()
            raise ProviderError(
                "Claude API error (overloaded_error)", {"provider": "scripted"}, retryable=True
            )
        meter.report(outcome["usage"], final=True)
        return outcome

    async def aclose(self) -> None:
        return None


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, int]]] = []

    def sampling_done(
        self, *, outcome: str, model: str, latency: float | None, tokens: Mapping[str, int], client: str
    ) -> None:
        self.seen.append((outcome, dict(tokens)))


def sampler_for(provider: Provider, **spend: Any) -> tuple[Sampler, Observer]:
    observer = Observer()
    sampler = Sampler(
        provider,
        assembly.sampler_settings(CONFIG),
        spend=Spend(replace(SPEND, rate_limit=0, **spend)),
        observer=observer,
    )
    return sampler, observer


async def test_a_paused_turn_is_continued_merged_and_charged_call_by_call() -> None:
    provider = Scripted(paused(1), paused(2), paused(3, "end_turn"))
    sampler, observer = sampler_for(provider)
    result = await sampler.sample(dict(PARAMS))
    assert result["content"] == {"type": "text", "text": "part 1. part 2. part 3. "}  # one text block
    assert result["stopReason"] == "endTurn"
    # Each continuation hands back the history with Claude's turn so far.
    assert [len(request["messages"]) for request in provider.requests] == [1, 2, 2]
    assert provider.requests[2]["messages"][1]["content"] == [
        {"type": "text", "text": "part 1. "},
        {"type": "text", "text": "part 2."},  # the API refuses final assistant text ending in a space
    ]
    summed = {
        "input_tokens": 60,
        "output_tokens": 6,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 0,
    }
    assert result["_meta"][META_KEY]["usage"] == summed  # every call's usage, added up
    assert observer.seen == [("answered", summed)]
    assert sampler.spend.budget.used == 69
    assert sampler.spend.budget.exchanges == 3  # three calls charged


async def test_continuations_stop_at_the_cap() -> None:
    provider = Scripted(*(paused(n) for n in range(1, MAX_PAUSE_CONTINUATIONS + 3)))
    sampler, _ = sampler_for(provider)
    result = await sampler.sample(dict(PARAMS))
    assert len(provider.requests) == 1 + MAX_PAUSE_CONTINUATIONS
    assert result["stopReason"] == "pauseTurn"  # the server may continue it itself


async def test_a_budget_used_up_by_a_paused_turn_stops_the_continuations() -> None:
    provider = Scripted(paused(5), paused(6, "end_turn"))
    sampler, observer = sampler_for(provider, budget=(Allowance(40),))
    result = await sampler.sample(dict(PARAMS))
    assert len(provider.requests) == 1  # 56 tokens used of 40: no room for another call
    assert result["stopReason"] == "pauseTurn"
    assert observer.seen[0][0] == "answered"
    with pytest.raises(SamplingError, match="process token budget is exhausted"):
        await sampler.sample(dict(PARAMS))
    assert observer.seen[1] == ("refused", {})


class RacedStore(MemoryStore):
    """Another request (or replica) reserves the rest of the budget right after this request found
    room for continuing its paused turn."""

    armed = False

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        await super().settle(limits, lease, tokens)
        self.armed = tokens > 0  # the paused call was charged: `has_room` comes next

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        standing = await super().reserve(limits, lease, amount)
        if self.armed and amount == 0:  # lost between `has_room` and the continuation's reservation
            self.armed = False
            await super().reserve(limits, "another-request", 1_000)
        return standing


async def test_a_paused_turn_whose_continuation_loses_a_budget_race_is_answered_as_paused() -> None:
    """The first call (paid for) paused; the budget had room when checked, none when the
    continuation reserved. The request failed with "budget exhausted" and the paused answer, charged,
    was lost; it is the answer now, as when the budget had no room to begin with."""
    provider = Scripted(paused(1), paused(2, "end_turn"))
    observer = Observer()
    spend = Spend(replace(SPEND, rate_limit=0, budget=(Allowance(1_000),)), RacedStore())
    sampler = Sampler(provider, assembly.sampler_settings(CONFIG), spend=spend, observer=observer)
    result = await sampler.sample(dict(PARAMS))
    assert len(provider.requests) == 1
    assert result["stopReason"] == "pauseTurn"
    assert result["content"] == {"type": "text", "text": "part 1. "}
    charged = {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 1}
    assert observer.seen == [("answered", {"cache_creation_input_tokens": 0, **charged})]
    assert spend.budget.used == 12  # the paused call stays charged


@pytest.mark.parametrize(
    "failure",
    [
        ProviderError("Claude API error (500 api_error): boom", {"provider": "scripted", "status": 500}),
        ProviderError(
            "Claude API call did not succeed within the deadline",
            {"provider": "scripted", "gave_up": "deadline"},
        ),
    ],
    ids=["server-error", "deadline"],
)
async def test_a_paused_turn_whose_continuation_fails_is_answered_as_paused(failure: ProviderError) -> None:
    """The first call (paid for) paused; its continuation was made and failed (a 5xx after the
    retries, the deadline). The error went to the server and the paused turn, charged, was lost; it
    is the answer now, and the failed continuation stays charged."""

    class FailsAfterBilling(Scripted):
        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            if len(self.requests) == 0:
                return await super().create_message(request, on_progress=on_progress, meter=meter)
            assert meter is not None
            self.requests.append(request)
            meter.begin_attempt()
            meter.report({"input_tokens": 20, "output_tokens": 3})  # message_start, then the break
            raise failure

    provider = FailsAfterBilling(paused(1))
    sampler, observer = sampler_for(provider, budget=(Allowance(100_000),))
    result = await sampler.sample(dict(PARAMS))
    assert len(provider.requests) == 2
    assert result["stopReason"] == "pauseTurn"
    assert result["content"] == {"type": "text", "text": "part 1. "}
    outcome, tokens = observer.seen[0]
    assert outcome == "answered"
    # The paused call as reported, and the continuation's input with its whole output reservation.
    assert (tokens["input_tokens"], tokens["output_tokens"]) == (10 + 20, 1 + 100)
    assert sampler.spend.budget.used == sum(tokens.values())
    assert sampler.spend.budget.exchanges == 2
    assert sampler.spend.budget.reserved == 0


async def test_a_failed_call_is_charged_and_reported_as_failed() -> None:
    error = ProviderError("Claude API error (500 api_error): boom", {"provider": "scripted", "status": 500})

    class Broken(Scripted):
        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            assert meter is not None
            meter.begin_attempt()
            meter.report({"input_tokens": 9, "output_tokens": 1})  # message_start, then the break
            raise error

    sampler, observer = sampler_for(Broken())
    with pytest.raises(ProviderError):
        await sampler.sample(dict(PARAMS))
    outcome, tokens = observer.seen[0]
    assert outcome == "failed"
    assert (tokens["input_tokens"], tokens["output_tokens"]) == (9, 100)  # the whole output reservation


async def test_a_cancelled_exchange_is_charged_and_reported_as_cancelled() -> None:
    started = anyio.Event()

    class Hanging(Scripted):
        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            assert meter is not None
            meter.begin_attempt()  # sent; nothing heard back yet
            started.set()
            await anyio.sleep_forever()
            raise AssertionError

    sampler, observer = sampler_for(Hanging())
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.sample, dict(PARAMS))
        await started.wait()
        tg.cancel_scope.cancel()
    outcome, tokens = observer.seen[0]
    assert outcome == "cancelled"
    assert tokens["output_tokens"] == 100
    assert tokens["input_tokens"] > 0  # the estimate: nothing was reported
    assert sampler.spend.budget.reserved == 0


# -- retries, each admitted as a call of its own ------------------------------------------------------


async def _no_sleep(_: float) -> None:
    return None


def retrying(inner: Scripted) -> RetryingProvider:
    return RetryingProvider(
        inner, RetryPolicy(max_attempts=6, base_delay=0, max_delay=0, deadline=None), sleep=_no_sleep
    )


async def test_retries_are_not_made_once_the_budget_has_no_room() -> None:
    """Retries used to be made within the first call's one reservation: six billed attempts charged
    5.5 times a budget that allowed one."""
    inner = Scripted(*[BILLED] * 6)
    sampler, observer = sampler_for(retrying(inner), budget=(Allowance(1000),))
    params = {**PARAMS, "maxTokens": 900}
    with pytest.raises(ProviderError, match="not retried: a token budget has no room") as refused:
        await sampler.sample(params)
    # What raises it, as the first call's refusal by a budget names its option and variable.
    assert "--budget-tokens / MCP_BACKFILL_BUDGET_TOKENS" in refused.value.message, refused.value.message
    assert len(inner.requests) == 2  # the first used the budget up; the one it allows to overrun
    assert sampler.spend.budget.used == 2 * (50 + 900)
    assert observer.seen[0][0] == "failed"


async def test_retries_within_the_budget_are_made_and_each_attempt_charged() -> None:
    inner = Scripted(BILLED, NOT_BILLED, BILLED, paused(1, "end_turn"))
    sampler, _ = sampler_for(retrying(inner), budget=(Allowance(100_000),))
    result = await sampler.sample(dict(PARAMS))
    assert len(inner.requests) == 4
    assert result["stopReason"] == "endTurn"
    assert sampler.spend.budget.used == 2 * (50 + 100) + (10 + 1 + 1)  # two billed, one free, the answer
    assert sampler.spend.budget.reserved == 0


async def test_a_retry_nothing_was_heard_of_is_charged_the_input_the_call_is_known_to_cost() -> None:
    """The first attempt's stream reported the prompt's 5,000 input tokens before it broke; the
    retry, cancelled before Claude's stream began, was charged the estimate (a few tokens) for the
    same prompt, which Claude may have read in full."""
    started = anyio.Event()

    class BreaksThenHangs(Scripted):
        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            assert meter is not None
            self.requests.append(request)
            meter.begin_attempt()
            if len(self.requests) == 1:  # message_start, then an overloaded_error
                meter.report({"input_tokens": 4000, "cache_read_input_tokens": 1000, "output_tokens": 1})
                raise ProviderError("Claude API error (overloaded_error)", {"provider": "s"}, retryable=True)
            started.set()  # sent; nothing heard back yet
            await anyio.sleep_forever()
            raise AssertionError

    sampler, observer = sampler_for(retrying(BreaksThenHangs()), budget=(Allowance(100_000),))
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.sample, dict(PARAMS))
        await started.wait()
        tg.cancel_scope.cancel()
    outcome, tokens = observer.seen[0]
    assert outcome == "cancelled"
    assert tokens["output_tokens"] == 2 * 100
    assert tokens["input_tokens"] + tokens["cache_read_input_tokens"] == 2 * 5000
    assert sampler.spend.budget.used == 2 * 5100


async def test_the_warm_up_converts_a_canned_request_both_ways_and_charges_nothing() -> None:
    provider = Scripted()  # asked for nothing: a call would pop from an empty script
    sampler, observer = sampler_for(provider, budget=(Allowance(100_000),))
    result = convert_canned(sampler.settings)
    # The canned request and answer stay valid as the checks evolve: with tools both ways, so that
    # the warm-up runs what a request with tools runs (else it would warm up nothing, silently).
    assert result["stopReason"] == "toolUse"
    assert [block["type"] for block in result["content"]] == ["text", "tool_use"]
    await sampler.warm_up()
    assert provider.requests == []
    assert observer.seen == []
    assert sampler.spend.budget.used == 0


async def test_a_warm_up_refused_by_the_operators_limits_is_no_error() -> None:
    limits = replace(assembly.sampler_settings(CONFIG).limits, max_tools=0)
    sampler = Sampler(
        Scripted(),
        replace(assembly.sampler_settings(CONFIG), limits=limits),
        spend=Spend(replace(SPEND, rate_limit=0)),
    )
    with pytest.raises(SamplingError):
        convert_canned(sampler.settings)
    await sampler.warm_up()  # the first request meets the limit, as it would have anyway
