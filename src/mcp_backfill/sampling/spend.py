"""What the proxy may spend on a server's behalf: token budgets, a rate limit and a concurrency cap.

One `Spend` per process holds the process-wide budget, the requests-per-minute window and the
concurrency slots; each client session gets a `SamplingSession` with its own budget. Budgets are
checked before a request is sent and charged with the usage Claude reports afterwards, so the
request that crosses a budget completes (its cost is unknown beforehand) and the ones after it are
refused. `Spend.snapshot()` is what a `/metrics` endpoint reads.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from mcp_backfill.errors import SamplingError, internal_error
from mcp_backfill.options import env_var

__all__ = [
    "USAGE_KEYS",
    "RateLimiter",
    "SamplingSession",
    "Spend",
    "SpendSettings",
    "TokenBudget",
    "normalize_usage",
]

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The usage counters Claude reports; all of them count against a budget."""

RATE_WINDOW_SECONDS = 60.0


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
    """The operator's spending controls (built from `Config` by `assembly`); 0 means "no limit" for
    each but `max_concurrent`."""

    rate_limit: int
    max_concurrent: int
    budget_tokens: int
    session_budget_tokens: int


@dataclass
class TokenBudget:
    """Tokens charged against an optional limit (None: count, never refuse)."""

    limit: int | None
    name: str
    """How errors and logs call it, e.g. "process token budget"."""
    option: str
    """The flag that raises it."""
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    exchanges: int = 0

    @property
    def used(self) -> int:
        """Input (including cache writes and reads) plus output tokens charged so far."""
        return sum(self.tokens.values())

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    def check(self) -> None:
        """Refuse (-32603) once the budget is used up."""
        if self.limit is not None and self.exhausted:
            raise internal_error(
                f"The {self.name} is exhausted: {self.used} of {self.limit} tokens used; raise it with "
                f"{self.option} (or {env_var(self.option)})",
                limit=self.option.lstrip("-").replace("-", "_"),
                option=self.option,
                max=self.limit,
                used=self.used,
                remaining=0,
            )

    def charge(self, usage: Mapping[str, int]) -> None:
        for key in USAGE_KEYS:
            self.tokens[key] += usage.get(key, 0)
        self.exchanges += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "used": self.used,
            "remaining": self.remaining,
            "exchanges": self.exchanges,
            **self.tokens,
        }


class RateLimiter:
    """At most `per_minute` admissions in any sliding 60-second window; excess is refused at once.

    Refusing rather than queueing keeps the server's own request timeout meaningful and tells a
    runaway server immediately (with `retryAfterSeconds`) instead of piling up waiting requests.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._admitted: deque[float] = deque()

    def acquire(self) -> None:
        if self.per_minute <= 0:
            return
        now = self._clock()
        self._expire(now)
        if len(self._admitted) >= self.per_minute:
            retry_after = max(1, math.ceil(self._admitted[0] + RATE_WINDOW_SECONDS - now))
            raise internal_error(
                f"Sampling rate limit reached: at most {self.per_minute} sampling requests per minute; "
                f"retry in {retry_after} s, or raise the limit with --rate-limit "
                f"(or {env_var('--rate-limit')})",
                limit="rate_limit",
                option="--rate-limit",
                max=self.per_minute,
                retryAfterSeconds=retry_after,
            )
        self._admitted.append(now)

    def in_window(self) -> int:
        self._expire(self._clock())
        return len(self._admitted)

    def _expire(self, now: float) -> None:
        while self._admitted and self._admitted[0] <= now - RATE_WINDOW_SECONDS:
            self._admitted.popleft()


@dataclass
class SamplingSession:
    """One client session as the sampler sees it: a label for logs, its own budget, and the client
    identity it belongs to (whose budgets, rate limit and slots it shares with the client's other
    sessions)."""

    label: str
    budget: TokenBudget
    client: str = "process"

    def snapshot(self) -> dict[str, Any]:
        return {"session": self.label, "budget": self.budget.snapshot()}


class Spend:
    """The process-wide spending state shared by every session of this process."""

    def __init__(self, settings: SpendSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.budget = TokenBudget(settings.budget_tokens or None, "process token budget", "--budget-tokens")
        self.rate = RateLimiter(settings.rate_limit, clock)
        self._slots = anyio.CapacityLimiter(settings.max_concurrent)
        self.refused: dict[str, int] = {}

    def new_session(self, label: str, client: str = "process") -> SamplingSession:
        """A session of the client `client` (stdio: the process; serve: the identity that
        authenticated it)."""
        budget = TokenBudget(
            self.settings.session_budget_tokens or None, "session token budget", "--session-budget-tokens"
        )
        return SamplingSession(label, budget, client)

    @asynccontextmanager
    async def admit(self, session: SamplingSession | None) -> AsyncIterator[None]:
        """Hold a Claude-call slot for the body, if the budgets and the rate limit allow the call.

        Waiting for a slot has no timeout of its own: the server's request timeout (or its cancel)
        ends the wait. Budgets are checked again after the wait, since they may have run out meanwhile.
        """
        self._check_budgets(session)
        self.rate.acquire()
        async with self._slots:
            self._check_budgets(session)
            yield

    def charge(self, usage: Mapping[str, int], session: SamplingSession | None) -> None:
        self.budget.charge(usage)
        if session is not None:
            session.budget.charge(usage)

    def note_refusal(self, error: SamplingError) -> None:
        """Count a request refused by one of the limits (for metrics), keyed by the limit's name."""
        limit = error.data.get("limit") if isinstance(error.data, dict) else None
        if isinstance(limit, str):
            self.refused[limit] = self.refused.get(limit, 0) + 1

    def _check_budgets(self, session: SamplingSession | None) -> None:
        self.budget.check()
        if session is not None:
            session.budget.check()

    def snapshot(self) -> dict[str, Any]:
        statistics = self._slots.statistics()
        return {
            "budget": self.budget.snapshot(),
            "rate_limit": {"per_minute": self.rate.per_minute, "in_window": self.rate.in_window()},
            "concurrency": {
                "limit": self.settings.max_concurrent,
                "in_flight": statistics.borrowed_tokens,
                "waiting": statistics.tasks_waiting,
            },
            "refused": dict(self.refused),
        }
