"""Budget arithmetic, the sliding rate-limit window and the concurrency slots."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import SamplingError
from mcp_backfill.protocol import INTERNAL_ERROR
from mcp_backfill.sampling.spend import (
    RateLimiter,
    Spend,
    TokenBudget,
    normalize_usage,
)
from tests.defaults import SPEND


def usage(input_tokens: int = 0, output: int = 0, write: int = 0, read: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }


def test_normalize_usage_keeps_the_four_counters_as_ints() -> None:
    raw: dict[str, Any] = {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": None, "x": {}}
    assert normalize_usage(raw) == usage(5, 2, 0, 0)
    assert normalize_usage(None) == usage()
    assert normalize_usage({"input_tokens": True, "output_tokens": -3}) == usage()


def test_a_budget_counts_input_cache_and_output_tokens() -> None:
    budget = TokenBudget(100, "process token budget", "--budget-tokens")
    budget.charge(usage(10, 5, 20, 30))
    assert (budget.used, budget.remaining, budget.exhausted) == (65, 35, False)
    budget.check()
    budget.charge(usage(40))  # crosses the limit: the request that did it is not undone
    assert (budget.used, budget.remaining, budget.exhausted) == (105, 0, True)
    snapshot = budget.snapshot()
    assert snapshot["exchanges"] == 2
    assert snapshot["cache_read_input_tokens"] == 30


def test_an_exhausted_budget_refuses_with_its_option() -> None:
    budget = TokenBudget(10, "session token budget", "--session-budget-tokens")
    budget.charge(usage(10))
    with pytest.raises(SamplingError) as caught:
        budget.check()
    assert caught.value.code == INTERNAL_ERROR
    assert "session token budget is exhausted" in caught.value.message
    assert "--session-budget-tokens" in caught.value.message
    assert "MCP_BACKFILL_SESSION_BUDGET_TOKENS" in caught.value.message
    assert caught.value.data == {
        "limit": "session_budget_tokens",
        "option": "--session-budget-tokens",
        "max": 10,
        "used": 10,
        "remaining": 0,
    }


def test_an_unlimited_budget_only_counts() -> None:
    budget = TokenBudget(None, "process token budget", "--budget-tokens")
    budget.charge(usage(10**9))
    budget.check()
    assert (budget.remaining, budget.exhausted) == (None, False)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_refuses_beyond_the_window_and_says_when_to_retry() -> None:
    clock = Clock()
    limiter = RateLimiter(3, clock)
    for step in range(3):
        clock.now += 10 * step
        limiter.acquire()  # at t = 0, 10, 30
    clock.now = 1040.0
    with pytest.raises(SamplingError) as caught:
        limiter.acquire()
    assert caught.value.code == INTERNAL_ERROR
    assert "--rate-limit" in caught.value.message
    assert caught.value.data is not None
    assert caught.value.data["retryAfterSeconds"] == 20  # the first admission leaves the window at t=60
    assert limiter.in_window() == 3  # a refusal does not count
    clock.now = 1060.0
    limiter.acquire()
    assert limiter.in_window() == 3


def test_rate_limit_zero_is_off() -> None:
    limiter = RateLimiter(0, Clock())
    for _ in range(1000):
        limiter.acquire()


@pytest.mark.anyio
async def test_admission_checks_process_and_session_budgets() -> None:
    spend = Spend(replace(SPEND, rate_limit=0, budget_tokens=100, session_budget_tokens=30))
    first, second = spend.new_session("a"), spend.new_session("b")
    async with spend.admit(first):
        pass
    spend.charge(usage(30), first)
    with pytest.raises(SamplingError, match="--session-budget-tokens"):
        async with spend.admit(first):
            pass
    async with spend.admit(second):  # another session still has its own budget
        pass
    spend.charge(usage(70), second)
    with pytest.raises(SamplingError, match="--budget-tokens"):
        async with spend.admit(spend.new_session("c")):
            pass
    assert spend.snapshot()["budget"]["used"] == 100


@pytest.mark.anyio
async def test_excess_requests_wait_for_a_slot_instead_of_failing() -> None:
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=2))
    inside = 0
    most = 0
    release = anyio.Event()

    async def call() -> None:
        nonlocal inside, most
        async with spend.admit(None):
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert spend.snapshot()["concurrency"] == {"limit": 2, "in_flight": 2, "waiting": 3}
        release.set()
    assert most == 2
    assert spend.snapshot()["concurrency"]["in_flight"] == 0


@pytest.mark.anyio
async def test_a_budget_used_up_while_waiting_refuses_after_the_wait() -> None:
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=1, budget_tokens=10))
    refused: list[str] = []
    holding = anyio.Event()
    finish = anyio.Event()

    async def first() -> None:
        async with spend.admit(None):
            holding.set()
            await finish.wait()
            spend.charge(usage(10), None)

    async def second() -> None:
        try:
            async with spend.admit(None):
                pass
        except SamplingError as exc:
            refused.append(exc.message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await holding.wait()
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        finish.set()
    assert len(refused) == 1
    assert "process token budget is exhausted" in refused[0]


def test_refusals_are_counted_by_limit() -> None:
    spend = Spend(SPEND)
    spend.note_refusal(SamplingError(-32602, "x", {"limit": "max_messages"}))
    spend.note_refusal(SamplingError(-32602, "x", {"limit": "max_messages"}))
    spend.note_refusal(SamplingError(-32603, "api", {"status": 500}))
    assert spend.snapshot()["refused"] == {"max_messages": 2}
