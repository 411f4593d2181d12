"""What the proxy may spend, and on whose behalf: the spend ledger.

Three kinds of payer share one process: the process itself, each client identity (stdio: the
process's one client; `serve`: the identity that authenticated the request), and each client
session. Each has a token `Budget`; the process and each client also have a requests-per-minute
`RateLimiter` and a number of concurrency slots. A session's request must pass all of them.

Every Claude call is charged, however it ends. Before a call, its `Reservation` (the capped
`max_tokens` plus an estimate of the input) is held against every budget of the request; after it,
the reservation is released and what the call may have cost is charged instead (`Charge`):

* a complete message: the usage Claude reported;
* a call that ended early (cancelled, timed out, a broken stream): the input usage the stream
  reported, plus its whole output reservation, since Claude may have generated up to `max_tokens`
  before it noticed; if the stream reported nothing, the whole reservation;
* a call the API refused with an HTTP error status, or that never reached it: nothing.

Each retry, and each continuation of a `pause_turn`, is a call of its own, charged the same way.

A budget admits a request while some of it is neither used nor reserved by calls in flight, so
concurrent requests cannot pile onto the last tokens: a budget is overrun by at most one call.
Budgets may be given for the payer's lifetime and per UTC-aligned window (`options.Allowance`).
`Spend.snapshot()` is what the exit summary and `/metrics` read.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from mcp_backfill.errors import SamplingError, internal_error
from mcp_backfill.options import BUDGET_WINDOWS, Allowance, env_var

__all__ = [
    "USAGE_KEYS",
    "Account",
    "Budget",
    "Charge",
    "RateLimiter",
    "Reservation",
    "SamplingSession",
    "Spend",
    "SpendSettings",
    "Ticket",
    "normalize_usage",
]

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The usage counters Claude reports; all of them count against a budget."""

RATE_WINDOW_SECONDS = 60.0
PROCESS = "process"
"""The client identity of the stdio front's one client."""


def normalize_usage(usage: Any) -> dict[str, int]:
    """Claude's usage object -> the four token counters as ints (missing or null -> 0)."""
    source = usage if isinstance(usage, Mapping) else {}
    counts: dict[str, int] = {}
    for key in USAGE_KEYS:
        value = source.get(key)
        counts[key] = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    return counts


@dataclass(frozen=True)
class SpendSettings:
    """The operator's spending controls (built from `Config` by `assembly`); a rate limit of 0 means
    "no limit", a client's concurrency of 0 "no cap of its own", and no allowances "no budget"."""

    rate_limit: int
    max_concurrent: int
    budget: tuple[Allowance, ...]
    session_budget: tuple[Allowance, ...]
    client_budget: tuple[Allowance, ...] = ()
    client_rate_limit: int = 0
    client_max_concurrent: int = 0


@dataclass(frozen=True)
class Reservation:
    """What one Claude call may cost at most, as far as can be told before making it."""

    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class Budget:
    """Tokens charged to one payer against its allowances, with the reservations of calls in flight.

    `wall_clock` (seconds since the epoch) places charges in windows; a window's count starts again
    at 0 when the next window begins.
    """

    def __init__(
        self,
        allowances: Iterable[Allowance],
        name: str,
        option: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.allowances = tuple(allowances)
        self.name = name
        """How errors and logs call it, e.g. "process token budget"."""
        self.option = option
        """The flag that raises it."""
        self._clock = wall_clock
        self.tokens: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        self.exchanges = 0
        self.reserved = 0
        self._windows: dict[str, tuple[int, int]] = {}  # window name -> (window number, tokens used)

    @property
    def used(self) -> int:
        """Every token charged so far: input (cache writes and reads included) plus output."""
        return sum(self.tokens.values())

    def used_in(self, allowance: Allowance) -> int:
        """Tokens charged in the allowance's current window (its lifetime for a lifetime one)."""
        if allowance.window is None:
            return self.used
        number, used = self._windows.get(allowance.window, (-1, 0))
        return used if number == self._window_number(allowance.window) else 0

    @property
    def remaining(self) -> int | None:
        """The tightest allowance's tokens not used yet; None without allowances."""
        if not self.allowances:
            return None
        return min(max(0, each.tokens - self.used_in(each)) for each in self.allowances)

    def check(self) -> None:
        """Refuse (-32603) while an allowance is used up, or fully reserved by calls in flight."""
        for allowance in self.allowances:
            used = self.used_in(allowance)
            if used + self.reserved >= allowance.tokens:
                raise self._exhausted(allowance, used)

    def has_room(self) -> bool:
        return all(self.used_in(each) + self.reserved < each.tokens for each in self.allowances)

    def charge(self, usage: Mapping[str, int]) -> None:
        total = 0
        for key in USAGE_KEYS:
            self.tokens[key] += usage.get(key, 0)
            total += usage.get(key, 0)
        for allowance in self.allowances:
            if allowance.window is not None:
                number = self._window_number(allowance.window)
                before = self.used_in(allowance)
                self._windows[allowance.window] = (number, before + total)
        self.exchanges += 1

    def _window_number(self, window: str) -> int:
        return int(self._clock() // BUDGET_WINDOWS[window])

    def _exhausted(self, allowance: Allowance, used: int) -> SamplingError:
        flag = self.option
        data: dict[str, Any] = {
            "limit": flag.lstrip("-").replace("-", "_"),
            "option": flag,
            "max": allowance.tokens,
            "used": used,
            "reserved": self.reserved,
            "remaining": max(0, allowance.tokens - used),
        }
        scope = ""
        if allowance.window is not None:
            seconds = BUDGET_WINDOWS[allowance.window]
            resets = (self._window_number(allowance.window) + 1) * seconds
            data["window"] = allowance.window
            data["resetsAt"] = datetime.fromtimestamp(resets, UTC).isoformat().replace("+00:00", "Z")
            data["retryAfterSeconds"] = max(1, math.ceil(resets - self._clock()))
            scope = f" this {allowance.window} (it starts again at {data['resetsAt']})"
        in_flight = f", {self.reserved} more reserved by calls in flight" if self.reserved else ""
        return internal_error(
            f"The {self.name} is exhausted: {used} of {allowance} used{scope}{in_flight}; raise it "
            f"with {flag} (or {env_var(flag)})",
            **data,
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "limits": [str(each) for each in self.allowances],
            "used": self.used,
            "reserved": self.reserved,
            "remaining": self.remaining,
            "exchanges": self.exchanges,
            **self.tokens,
        }


class RateLimiter:
    """At most `per_minute` admissions in any sliding 60-second window; excess is refused at once.

    Refusing rather than queueing keeps the server's own request timeout meaningful and tells a
    runaway server immediately (with `retryAfterSeconds`) instead of piling up waiting requests.
    `check()` and `admit()` are separate so that a request refused by one payer's limiter is not
    counted by another's.
    """

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        option: str = "--rate-limit",
        name: str = "Sampling rate limit",
    ) -> None:
        self.per_minute = per_minute
        self.option = option
        self.name = name
        self._clock = clock
        self._admitted: deque[float] = deque()

    def check(self) -> None:
        if self.per_minute <= 0:
            return
        now = self._clock()
        self._expire(now)
        if len(self._admitted) >= self.per_minute:
            retry_after = max(1, math.ceil(self._admitted[0] + RATE_WINDOW_SECONDS - now))
            raise internal_error(
                f"{self.name} reached: at most {self.per_minute} sampling requests per minute; "
                f"retry in {retry_after} s, or raise the limit with {self.option} "
                f"(or {env_var(self.option)})",
                limit=self.option.lstrip("-").replace("-", "_"),
                option=self.option,
                max=self.per_minute,
                retryAfterSeconds=retry_after,
            )

    def admit(self) -> None:
        if self.per_minute > 0:
            self._admitted.append(self._clock())

    def acquire(self) -> None:
        """`check()`, then `admit()`."""
        self.check()
        self.admit()

    def in_window(self) -> int:
        self._expire(self._clock())
        return len(self._admitted)

    def _expire(self, now: float) -> None:
        while self._admitted and self._admitted[0] <= now - RATE_WINDOW_SECONDS:
            self._admitted.popleft()


class Account:
    """A payer with a budget, a rate limit and concurrency slots: the process, or one client."""

    def __init__(self, budget: Budget, rate: RateLimiter, max_concurrent: int) -> None:
        self.budget = budget
        self.rate = rate
        self.max_concurrent = max_concurrent
        self.slots = anyio.CapacityLimiter(max_concurrent) if max_concurrent > 0 else None

    def snapshot(self) -> dict[str, Any]:
        statistics = self.slots.statistics() if self.slots is not None else None
        return {
            "budget": self.budget.snapshot(),
            "rate_limit": {"per_minute": self.rate.per_minute, "in_window": self.rate.in_window()},
            "concurrency": {
                "limit": self.max_concurrent or None,
                "in_flight": statistics.borrowed_tokens if statistics else None,
                "waiting": statistics.tasks_waiting if statistics else None,
            },
        }


@dataclass
class SamplingSession:
    """One client session as the sampler sees it: a label for logs, its own budget, and the client
    identity it belongs to (whose budget, rate limit and slots it shares with the client's other
    sessions)."""

    label: str
    budget: Budget
    client: str = PROCESS

    def snapshot(self) -> dict[str, Any]:
        return {"session": self.label, "client": self.client, "budget": self.budget.snapshot()}


@dataclass
class _Attempt:
    usage: dict[str, int] | None = None
    final: bool = False
    billed: bool = True


@dataclass
class Charge:
    """One Claude call's entry in the ledger; the `UsageMeter` its provider reports to."""

    reservation: Reservation
    attempts: list[_Attempt] = field(default_factory=list)

    def begin_attempt(self) -> None:
        self.attempts.append(_Attempt())

    def report(self, usage: Mapping[str, int], *, final: bool = False) -> None:
        if self.attempts:
            self.attempts[-1].usage = normalize_usage(usage)
            self.attempts[-1].final = final

    def not_billed(self) -> None:
        if self.attempts:
            self.attempts[-1].billed = False

    def cost(self) -> dict[str, int]:
        """What the call's attempts may have cost, by the rules in the module docstring."""
        total = dict.fromkeys(USAGE_KEYS, 0)
        for attempt in self.attempts:
            for key, value in self._attempt_cost(attempt).items():
                total[key] += value
        return total

    def _attempt_cost(self, attempt: _Attempt) -> dict[str, int]:
        if not attempt.billed:
            return {}
        if attempt.usage is None:
            return {
                "input_tokens": self.reservation.input_tokens,
                "output_tokens": self.reservation.output_tokens,
            }
        if attempt.final:
            return attempt.usage
        output = max(attempt.usage["output_tokens"], self.reservation.output_tokens)
        return {**attempt.usage, "output_tokens": output}


class Ticket:
    """An admitted sampling request: its slots are held; each Claude call for it is a `Charge`."""

    def __init__(self, budgets: tuple[Budget, ...]) -> None:
        self._budgets = budgets
        self.charged: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        self.calls = 0

    @contextmanager
    def call(self, reservation: Reservation) -> Iterator[Charge]:
        """Reserve for one Claude call; on leaving, however the call ended, charge what it cost."""
        for budget in self._budgets:
            budget.reserved += reservation.total
        charge = Charge(reservation)
        try:
            yield charge
        finally:
            cost = charge.cost()
            for budget in self._budgets:
                budget.reserved -= reservation.total
                budget.charge(cost)
            for key, value in cost.items():
                self.charged[key] += value
            self.calls += 1

    def has_room(self) -> bool:
        """May another call be made for this request (e.g. to continue a paused turn)?"""
        return all(budget.has_room() for budget in self._budgets)


class Spend:
    """The ledger of one process: its own account, one per client identity, and session budgets.

    Client accounts are kept for the process's lifetime (their budgets must survive the client's
    sessions); there is one per identity that ever sampled.
    """

    def __init__(
        self,
        settings: SpendSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        self.process = Account(
            Budget(settings.budget, "process token budget", "--budget-tokens", wall_clock),
            RateLimiter(settings.rate_limit, clock),
            settings.max_concurrent,
        )
        self.clients: dict[str, Account] = {}
        self.refused: dict[str, int] = {}

    @property
    def budget(self) -> Budget:
        """The process's budget."""
        return self.process.budget

    def client(self, identity: str) -> Account:
        account = self.clients.get(identity)
        if account is None:
            settings = self.settings
            account = self.clients[identity] = Account(
                Budget(
                    settings.client_budget,
                    f"token budget of client {identity!r}",
                    "--client-budget-tokens",
                    self._wall_clock,
                ),
                RateLimiter(
                    settings.client_rate_limit,
                    self._clock,
                    "--client-rate-limit",
                    f"Sampling rate limit of client {identity!r}",
                ),
                settings.client_max_concurrent,
            )
        return account

    def new_session(self, label: str, client: str = PROCESS) -> SamplingSession:
        """A session of the client `client` (stdio: the process; serve: the identity that
        authenticated it)."""
        budget = Budget(
            self.settings.session_budget, "session token budget", "--session-budget-tokens", self._wall_clock
        )
        return SamplingSession(label, budget, client)

    @asynccontextmanager
    async def admit(self, session: SamplingSession | None) -> AsyncIterator[Ticket]:
        """Hold the request's slots for the body, if its budgets and rate limits allow it.

        Waiting for a slot has no timeout of its own: the server's request timeout (or its cancel)
        ends the wait. The client's slot is taken before the process's, so that a client at its own
        cap does not hold a slot other clients could use; budgets are checked again after the wait.
        """
        client = self.client(session.client) if session is not None else None
        accounts = (client, self.process) if client is not None else (self.process,)
        budgets = tuple(account.budget for account in accounts)
        if session is not None:
            budgets = (session.budget, *budgets)
        for budget in budgets:
            budget.check()
        for account in accounts:
            account.rate.check()
        for account in accounts:
            account.rate.admit()
        async with _holding(account.slots for account in accounts):
            for budget in budgets:
                budget.check()
            yield Ticket(budgets)

    def note_refusal(self, error: SamplingError) -> None:
        """Count a request refused by one of the limits (for metrics), keyed by the limit's name."""
        limit = error.data.get("limit") if isinstance(error.data, dict) else None
        if isinstance(limit, str):
            self.refused[limit] = self.refused.get(limit, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.process.snapshot(),
            "clients": {name: account.snapshot() for name, account in self.clients.items()},
            "refused": dict(self.refused),
        }


@asynccontextmanager
async def _holding(limiters: Iterable[anyio.CapacityLimiter | None]) -> AsyncIterator[None]:
    """Hold one token of each limiter (None: no limit), in order."""
    async with AsyncExitStack() as stack:
        for limiter in limiters:
            if limiter is not None:
                await stack.enter_async_context(limiter)
        yield
