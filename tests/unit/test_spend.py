"""The spend ledger: budgets and their windows, reservations, what a call is charged however it
ended, the sliding rate-limit windows and the concurrency slots, per process, client and session."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import SamplingError
from mcp_backfill.options import Allowance, budget
from mcp_backfill.protocol import INTERNAL_ERROR
from mcp_backfill.sampling.spend import (
    Charge,
    Reservation,
    SamplingSession,
    Spend,
    normalize_usage,
)
from mcp_backfill.sampling.store import Limit, MemoryStore, Rate, RateRefusal, Standing
from tests.clock import Clock
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


def spend_with(clock: Clock | None = None, **settings: Any) -> Spend:
    clock = clock or Clock()
    return Spend(replace(SPEND, **{"rate_limit": 0, **settings}), clock=clock, wall_clock=clock)


async def spend_on(spend: Spend, session: SamplingSession | None, cost: dict[str, int]) -> None:
    """One admitted request whose one call Claude answered with usage `cost`."""
    async with spend.admit(session) as ticket, ticket.call(Reservation(0, 0)) as charge:
        charge.begin_attempt()
        charge.report(cost, final=True)


@pytest.mark.anyio
async def test_a_budget_counts_input_cache_and_output_tokens() -> None:
    spend = spend_with(budget=(Allowance(100),))
    await spend_on(spend, None, usage(10, 5, 20, 30))
    assert (spend.budget.used, spend.budget.remaining) == (65, 35)
    await spend_on(spend, None, usage(40))  # crosses the limit: the request that did it is not undone
    assert (spend.budget.used, spend.budget.remaining) == (105, 0)
    with pytest.raises(SamplingError):
        await spend_on(spend, None, usage(1))
    snapshot = spend.budget.snapshot()
    assert snapshot["exchanges"] == 2
    assert snapshot["cache_read_input_tokens"] == 30
    assert snapshot["limits"] == ["100 tokens"]


@pytest.mark.anyio
async def test_an_exhausted_budget_refuses_with_its_option() -> None:
    spend = spend_with(session_budget=(Allowance(10),))
    session = spend.new_session("s")
    await spend_on(spend, session, usage(10))
    with pytest.raises(SamplingError) as caught:
        await spend_on(spend, session, usage(1))
    assert caught.value.code == INTERNAL_ERROR
    assert "session token budget is exhausted: 10 of 10 tokens used" in caught.value.message
    assert "--session-budget-tokens" in caught.value.message
    assert "MCP_BACKFILL_SESSION_BUDGET_TOKENS" in caught.value.message
    assert caught.value.data == {
        "limit": "session_budget_tokens",
        "option": "--session-budget-tokens",
        "max": 10,
        "used": 10,
        "reserved": 0,
        "remaining": 0,
    }


@pytest.mark.anyio
async def test_a_budget_without_allowances_only_counts() -> None:
    spend = spend_with()
    await spend_on(spend, None, usage(10**9))
    await spend_on(spend, None, usage(1))
    assert (spend.budget.remaining, spend.budget.used) == (None, 10**9 + 1)


@pytest.mark.anyio
async def test_reservations_of_calls_in_flight_count_against_a_budget() -> None:
    spend = spend_with(budget=(Allowance(100),), max_concurrent=0)
    await spend_on(spend, None, usage(40))
    async with spend.admit(None) as ticket, ticket.call(Reservation(0, 59)) as charge:
        charge.report(usage(), final=True)
        await spend_on(spend, None, usage())  # one token is neither used nor reserved: one more may start
    async with spend.admit(None) as ticket, ticket.call(Reservation(0, 60)) as charge:
        charge.report(usage(), final=True)
        with pytest.raises(SamplingError) as caught:
            await spend_on(spend, None, usage())
    assert "60 more reserved by calls in flight" in caught.value.message


@pytest.mark.anyio
async def test_a_window_budget_starts_again_in_the_next_utc_window_and_says_when() -> None:
    clock = Clock(86_400 * 20_000 + 3600.0)  # 01:00 UTC
    spend = spend_with(clock, budget=(Allowance(1000), Allowance(100, "day")))
    await spend_on(spend, None, usage(100))
    with pytest.raises(SamplingError) as caught:
        await spend_on(spend, None, usage())
    assert caught.value.data is not None
    assert caught.value.data["window"] == "day"
    assert caught.value.data["retryAfterSeconds"] == 23 * 3600
    assert caught.value.data["resetsAt"].endswith("T00:00:00Z")
    assert "100 of 100 tokens per day used this day" in caught.value.message
    clock.now += 23 * 3600  # midnight UTC: a new day
    await spend_on(spend, None, usage(950))  # the lifetime allowance still counts everything
    with pytest.raises(SamplingError, match="1050 of 1000 tokens used;"):
        await spend_on(spend, None, usage())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", ()),
        ("2000000", (Allowance(2_000_000),)),
        ("100000/day", (Allowance(100_000, "day"),)),
        (
            "2_000_000, 100000/Day,5000/hour",
            (Allowance(2_000_000), Allowance(100_000, "day"), Allowance(5000, "hour")),
        ),
    ],
)
def test_budget_values(raw: str, expected: tuple[Allowance, ...]) -> None:
    assert budget(raw) == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("-1", "expected tokens"),
        ("lots", "expected tokens"),
        ("5/month", "per hour, day, week"),
        ("0/day", "more than 0"),
        ("5/day,6/day", "two budgets per day"),
        ("5,6", "two budgets for the lifetime"),
    ],
)
def test_budget_values_that_are_refused(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        budget(raw)


RESERVATION = Reservation(input_tokens=100, output_tokens=1000)


def charged(*steps: Callable[[Charge], None]) -> dict[str, int]:
    charge = Charge(RESERVATION)
    for step in steps:
        step(charge)
    return charge.cost()


def attempt(charge: Charge) -> None:
    charge.begin_attempt()


def test_a_complete_call_is_charged_what_claude_reported() -> None:
    final = usage(10, 20, 30, 40)
    assert charged(attempt, lambda c: c.report(usage(10, 1)), lambda c: c.report(final, final=True)) == final


def test_a_call_that_ended_early_is_charged_its_input_and_its_whole_output_reservation() -> None:
    assert charged(attempt, lambda c: c.report(usage(10, 1, 5))) == usage(10, 1000, 5)
    # Claude reported more output than was reserved (it cannot, but the report wins if it did).
    assert charged(attempt, lambda c: c.report(usage(10, 1500))) == usage(10, 1500)


def test_a_counter_the_end_of_the_stream_lowers_keeps_its_highest_value() -> None:
    """Claude's counters are cumulative: `message_delta` repeats or raises `message_start`'s. Some
    gateways in front of Claude send `input_tokens: 0` at the end, and the call was charged no input
    at all; a counter now never goes down within an attempt."""
    ended = usage(0, 20, 0, 0)
    assert charged(
        attempt, lambda c: c.report(usage(5000, 1, 30, 40)), lambda c: c.report(ended, final=True)
    ) == (usage(5000, 20, 30, 40))


def test_a_stream_that_reported_no_usage_is_charged_as_one_nothing_was_heard_of() -> None:
    """A stream whose usage says nothing (a gateway that strips it: `usage: {}`) was charged as if
    Claude had read no prompt and, once complete, written nothing: a whole answer for 0 tokens."""
    silent = usage()
    assert charged(attempt, lambda c: c.report(silent)) == usage(100, 1000)  # it broke off
    assert charged(attempt, lambda c: c.report(silent), lambda c: c.report(silent, final=True)) == usage(
        100, 1000
    )
    # The input side unknown, the output reported: the output is taken as reported.
    assert charged(attempt, lambda c: c.report(usage(0, 30), final=True)) == usage(100, 30)


def test_a_call_nothing_was_heard_of_is_charged_its_whole_reservation() -> None:
    assert charged(attempt) == usage(100, 1000)


def test_a_call_the_api_refused_or_never_reached_costs_nothing() -> None:
    assert charged(attempt, lambda c: c.not_billed()) == usage()
    assert charged() == usage()  # no attempt was made at all


def test_every_attempt_is_charged() -> None:
    assert charged(
        attempt,
        lambda c: c.not_billed(),  # a 529
        attempt,
        lambda c: c.report(usage(10, 2)),  # a broken stream
        attempt,  # a timeout before any answer
        attempt,
        lambda c: c.report(usage(10, 50), final=True),
    ) == usage(10 + 100 + 10, 1000 + 1000 + 50)


@pytest.mark.anyio
async def test_the_rate_limit_refuses_beyond_the_window_and_says_when_to_retry() -> None:
    clock = Clock()
    spend = spend_with(clock, rate_limit=3)
    for step in range(3):
        clock.now += 10 * step
        await spend_on(spend, None, usage())  # at t = 0, 10, 30
    clock.now = 1040.0
    with pytest.raises(SamplingError) as caught:
        await spend_on(spend, None, usage())
    assert caught.value.code == INTERNAL_ERROR
    assert "--rate-limit" in caught.value.message
    assert caught.value.data is not None
    assert caught.value.data["retryAfterSeconds"] == 20  # the first admission leaves the window at t=60
    assert spend.process.admitted == 3  # a refusal does not count
    clock.now = 1060.0
    await spend_on(spend, None, usage())
    with pytest.raises(SamplingError):
        await spend_on(spend, None, usage())


@pytest.mark.anyio
async def test_rate_limit_zero_is_off() -> None:
    spend = spend_with(rate_limit=0)
    for _ in range(1000):
        await spend_on(spend, None, usage())


@pytest.mark.anyio
async def test_admission_checks_process_client_and_session_budgets() -> None:
    spend = Spend(
        replace(
            SPEND,
            rate_limit=0,
            budget=(Allowance(100),),
            session_budget=(Allowance(30),),
            client_budget=(Allowance(60),),
        )
    )
    first, second = spend.new_session("a", client="alice"), spend.new_session("b", client="alice")
    await spend_on(spend, first, usage(30))
    with pytest.raises(SamplingError, match="--session-budget-tokens"):
        await spend_on(spend, first, usage(1))
    await spend_on(spend, second, usage(30))  # another session of hers has its own budget...
    with pytest.raises(SamplingError, match="token budget of client 'alice' is exhausted"):
        await spend_on(spend, spend.new_session("c", client="alice"), usage(1))  # ...not a new client's
    await spend_on(spend, spend.new_session("d", client="bob"), usage(40))
    with pytest.raises(SamplingError, match="--budget-tokens"):
        await spend_on(spend, spend.new_session("e", client="carol"), usage(1))
    snapshot = spend.snapshot()
    assert snapshot["budget"]["used"] == 100
    assert {name: each["budget"]["used"] for name, each in snapshot["clients"].items()} == {
        "alice": 60,
        "bob": 40,
        "carol": 0,
    }


@pytest.mark.anyio
async def test_concurrent_requests_cannot_pile_onto_the_last_tokens() -> None:
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=10, budget=(Allowance(1000),)))
    async with spend.admit(None) as ticket, ticket.call(Reservation(100, 900)) as charge:
        charge.begin_attempt()
        assert spend.budget.reserved == 1000
        with pytest.raises(SamplingError, match="1000 more reserved by calls in flight"):
            async with spend.admit(None):
                pass
    assert spend.budget.reserved == 0
    assert spend.budget.used == 1000  # nothing was reported: the whole reservation was charged


@pytest.mark.anyio
async def test_a_call_cancelled_in_flight_is_still_charged() -> None:
    spend = Spend(replace(SPEND, rate_limit=0))
    session = spend.new_session("s")
    with anyio.CancelScope() as scope:
        async with spend.admit(session) as ticket, ticket.call(Reservation(100, 900)) as charge:
            charge.begin_attempt()
            charge.report(usage(70, 1))  # message_start arrived, then the server cancelled
            scope.cancel()
            await anyio.sleep(1)
    assert ticket.charged == usage(70, 900)
    assert (spend.budget.used, session.budget.used, spend.budget.reserved) == (970, 970, 0)


@pytest.mark.anyio
async def test_one_client_cannot_take_every_slot() -> None:
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=4, client_max_concurrent=2))
    alice = spend.new_session("a", client="alice")
    release = anyio.Event()
    entered: list[str] = []

    async def call(session: SamplingSession) -> None:
        async with spend.admit(session):
            entered.append(session.client)
            await release.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(call, alice)
        await anyio.wait_all_tasks_blocked()
        assert entered == ["alice", "alice"]
        tg.start_soon(call, spend.new_session("b", client="bob"))
        await anyio.wait_all_tasks_blocked()
        assert entered == ["alice", "alice", "bob"]
        assert spend.snapshot()["concurrency"] == {"limit": 4, "in_flight": 3, "waiting": 0}
        release.set()
    assert len(entered) == 6


@pytest.mark.anyio
async def test_a_clients_rate_limit_is_its_own_and_a_refusal_counts_nowhere() -> None:
    spend = Spend(replace(SPEND, rate_limit=3, client_rate_limit=2))
    alice, bob = spend.new_session("a", client="alice"), spend.new_session("b", client="bob")
    for _ in range(2):
        async with spend.admit(alice):
            pass
    with pytest.raises(SamplingError, match=r"rate limit of client 'alice' reached.*--client-rate-limit"):
        async with spend.admit(alice):
            pass
    assert spend.process.admitted == 2
    async with spend.admit(bob):
        pass
    with pytest.raises(SamplingError, match="--rate-limit"):
        async with spend.admit(bob):
            pass


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
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=1, budget=(Allowance(10),)))
    refused: list[str] = []
    holding = anyio.Event()
    finish = anyio.Event()

    async def first() -> None:
        async with spend.admit(None) as ticket:
            holding.set()
            await finish.wait()
            async with ticket.call(Reservation(10, 0)) as charge:
                charge.begin_attempt()  # and nothing heard: the reservation is charged

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


class CountingStore(MemoryStore):
    """The memory store, noting each operation the ledger asks of it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        self.ops.append(f"reserve {amount}")
        return await super().reserve(limits, lease, amount)

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        self.ops.append(f"admit {amount}")
        before = len(self.ops)
        answer = await super().admit(limits, rates, member, lease, amount)
        del self.ops[before:]  # its own check is part of it
        return answer

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        self.ops.append(f"settle {tokens}")
        await super().settle(limits, lease, tokens)

    async def held(self) -> int:
        """What reservations hold against the process's budget."""
        return (await MemoryStore.reserve(self, [Limit("process", (Allowance(10**9),))], "", 0)).reserved[0]


def counted_spend(**settings: Any) -> tuple[Spend, CountingStore]:
    store = CountingStore()
    return Spend(replace(SPEND, **{"rate_limit": 0, "budget": (Allowance(1000),), **settings}), store), store


@pytest.mark.anyio
async def test_the_admission_reserves_the_first_call_in_the_same_store_operation() -> None:
    spend, store = counted_spend()
    async with spend.admit(None, Reservation(10, 90)) as ticket:
        assert (store.ops, await store.held()) == (["admit 100"], 100)
        async with ticket.call(Reservation(10, 90)) as charge:
            charge.begin_attempt()
            charge.report(usage(7, 3), final=True)
        async with ticket.call(Reservation(20, 90)) as charge:  # a continuation reserves its own
            charge.begin_attempt()
            charge.report(usage(8, 2), final=True)
    assert store.ops == ["admit 100", "settle 10", "reserve 110", "settle 10"]
    assert (await store.held(), spend.budget.used, spend.budget.reserved) == (0, 20, 0)


@pytest.mark.anyio
async def test_a_reservation_the_admission_held_and_no_call_took_is_given_back() -> None:
    spend, store = counted_spend(session_budget=(Allowance(50),))
    async with spend.admit(None, Reservation(10, 90)):
        pass  # refused before calling Claude (say, by the response limits)
    async with spend.admit(None, Reservation(10, 90)) as ticket, ticket.call(Reservation(5, 90)) as charge:
        charge.begin_attempt()  # a call other than the one it was held for
        charge.report(usage(4, 1), final=True)
    session = spend.new_session("s")

    async def refused_by_the_session() -> None:
        async with spend.admit(session, Reservation(10, 90)) as ticket:
            await session.store.settle([session.budget.limit], "", 50)  # the session spent it meanwhile
            async with ticket.call(Reservation(10, 90)):
                pytest.fail("the session's budget is used up")

    with pytest.raises(SamplingError, match="session token budget is exhausted"):
        await refused_by_the_session()
    assert store.ops == [
        *("admit 100", "settle 0"),
        *("admit 100", "settle 0", "reserve 95", "settle 5"),
        *("admit 100", "settle 0"),
    ]
    assert (await store.held(), spend.budget.used, spend.budget.reserved) == (0, 5, 0)


@pytest.mark.anyio
async def test_a_request_waiting_for_a_slot_holds_no_reservation_meanwhile() -> None:
    """Five requests for one slot, each reserving 300 of a 1000 budget and spending 10: every one is
    served in turn. Were the waiting ones holding their reservations, the fourth would fill the
    budget and the fifth be refused as "reserved by calls in flight"."""
    spend, store = counted_spend(max_concurrent=1)
    served: list[int] = []
    holding: list[int] = []

    async def request(n: int) -> None:
        async with spend.admit(None, Reservation(0, 300)) as ticket:
            holding.append(await store.held())
            async with ticket.call(Reservation(0, 300)) as charge:
                charge.begin_attempt()
                await anyio.sleep(0.01)
                charge.report(usage(0, 10), final=True)
        served.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(request, n)
    assert sorted(served) == list(range(5))
    assert holding == [300, 0, 0, 0, 0]  # the first's own; the others reserve when their call starts
    assert spend.budget.used == 50
    assert await store.held() == 0


@pytest.mark.anyio
async def test_requests_waiting_for_a_slot_are_bounded_and_the_rest_refused_at_once() -> None:
    """An upstream that sends sampling requests faster than they complete, and never cancels one,
    had every one wait for a slot, holding its params, without end: past `max_waiting` a request
    is refused at once naming the option, and it counts against no rate limit."""
    spend = Spend(replace(SPEND, rate_limit=100, max_concurrent=1, max_waiting=2))
    release = anyio.Event()
    refused: list[SamplingError] = []

    async def call() -> None:
        try:
            async with spend.admit(None):
                await release.wait()
        except SamplingError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert spend.snapshot()["concurrency"] == {"limit": 1, "in_flight": 1, "waiting": 2}
        assert len(refused) == 3
        release.set()
    assert spend.snapshot()["rate_limit"]["admitted"] == 3
    error = refused[0]
    assert error.code == INTERNAL_ERROR
    assert "--max-waiting-sampling" in error.message
    assert "MCP_BACKFILL_MAX_WAITING_SAMPLING" in error.message
    assert error.data == {"limit": "max_waiting_sampling", "option": "--max-waiting-sampling", "max": 2}


@pytest.mark.anyio
async def test_a_clients_waiting_requests_are_bounded_by_its_own_count() -> None:
    """One client's flood fills its own waiting line, not the process's: another client still waits."""
    spend = Spend(replace(SPEND, rate_limit=0, max_concurrent=2, client_max_concurrent=1, max_waiting=1))
    alice, bob = spend.new_session("a", "alice"), spend.new_session("b", "bob")
    release = anyio.Event()
    refused: list[str] = []

    async def call(session: SamplingSession, name: str) -> None:
        try:
            async with spend.admit(session):
                await release.wait()
        except SamplingError:
            refused.append(name)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(call, alice, "alice")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, bob, "bob")
        await anyio.wait_all_tasks_blocked()
        assert refused == ["alice", "alice"]
        release.set()
    assert refused == ["alice", "alice"]


@pytest.mark.anyio
async def test_a_call_once_charged_is_freed_without_the_garbage_collector() -> None:
    """Its charge's renewal (for a retry) refers to the charge: a reference cycle, left in place,
    made every sampling call's charge, ticket and reservations garbage only the collector frees."""
    spend = spend_with()
    gc.disable()
    try:
        async with spend.admit(None) as ticket, ticket.call(Reservation(10, 90)) as charge:
            charge.begin_attempt()
            charge.report(usage(10, 5), final=True)
            freed = weakref.ref(charge)
        del charge, ticket
        assert freed() is None
    finally:
        gc.enable()
