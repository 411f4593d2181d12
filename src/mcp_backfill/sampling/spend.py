"""What the proxy may spend, and on whose behalf: the spend ledger.

Three kinds of payer share one process: the process itself, each client identity (stdio: the
process's one client; `serve`: the identity that authenticated the request), and each client
session. Each has a token `Budget`; the process and each client also have a requests-per-minute
rate limit and a number of concurrency slots. A session's request must pass all of them.

Every Claude call is charged, however it ends. Before a call, its `Reservation` (the capped
`max_tokens` plus an estimate of the input) is held against every budget of the request; after it,
the reservation is released and what the call may have cost is charged instead (`Charge`):

* a complete message: the usage Claude reported; counters it left out (a gateway may strip them)
  are taken as for a call nothing was heard of, since no prompt, nor answer, costs 0 tokens;
* a call that ended early (cancelled, timed out, a broken stream): the input usage the stream
  reported, plus its whole output reservation, since Claude may have generated up to `max_tokens`
  before it noticed; if the stream reported nothing, the whole reservation — its input side the
  input an earlier attempt at the same request reported, when that is more than the estimate;
* a call the API refused with an HTTP error status or redirected, or that never reached it: nothing.

Each retry, and each continuation of a `pause_turn`, is a call of its own, charged the same way
and admitted the same way: before a retry the attempts so far are charged and a new reservation is
held, and the retry is not made when a budget has no room for it.

A budget admits a call while some of it is neither used nor reserved by calls in flight, checked
and reserved in one atomic step of the store, so concurrent requests cannot pile onto the last
tokens: a budget is overrun by at most one call. Budgets may be given for the payer's lifetime and
per UTC-aligned window (`options.Allowance`).

The counts of the process and of each client live in a `LedgerStore` (`sampling.store`): this
process's memory, or a store several processes share (`--state-store`), in which case "the
process" means every process using that store, and a client's budget, rate limit and slots hold
across all of them. A session's counts always live with the session. The process's own slots
(`--max-concurrent-sampling`) are this process's, whatever the store.

A client's `Account` is only this process's view of what the store counts (and its local slots), so
the account of an identity gone (a rotated OAuth token under `--forward-authorization`) may be
dropped once nothing uses it: the store still holds what counts, and a budget is never reset by it.
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from mcp_backfill.errors import SamplingError, internal_error
from mcp_backfill.options import BUDGET_WINDOWS, Allowance, env_var
from mcp_backfill.sampling.store import (
    CLOCK_SKEW_SECONDS,
    RATE_WINDOW_SECONDS,
    SWEEP_AT,
    LedgerStore,
    Limit,
    MemoryStore,
    Rate,
    Standing,
    exhausted,
    window_number,
)
from mcp_backfill.sampling.store_link import StoreLink

__all__ = [
    "USAGE_KEYS",
    "Account",
    "Budget",
    "Charge",
    "Reservation",
    "SamplingSession",
    "Spend",
    "SpendSettings",
    "Ticket",
    "normalize_usage",
]

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The usage counters Claude reports; all of them count against a budget."""
INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The counters of what Claude read (the prompt): the same for every attempt at one request."""

PROCESS = "process"
"""The client identity of the stdio front's one client, and the process's own ledger key."""
SLOT_POLL_SECONDS = (0.01, 0.25)
"""Waiting for a slot of a shared store: the first and the longest pause between tries."""
ACCOUNT_IDLE_SECONDS = RATE_WINDOW_SECONDS
"""How long a client's account nothing uses is kept before a sweep may drop it."""


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
    "no limit", a client's concurrency of 0 "no cap of its own", and no allowances "no budget".

    `store_outage` says what happens while a shared store is unavailable: `"refuse"` sampling, or
    fall back to `"local"` counts kept by this process alone.
    """

    rate_limit: int
    max_concurrent: int
    budget: tuple[Allowance, ...]
    session_budget: tuple[Allowance, ...]
    client_budget: tuple[Allowance, ...] = ()
    client_rate_limit: int = 0
    client_max_concurrent: int = 0
    store_outage: str = "refuse"
    max_waiting: int = 100
    """Requests waiting for one payer's slot at most (the process's, each client's); more are
    refused at once (`--max-waiting-sampling`), so that a server never cancelling its requests
    cannot have them pile up without end."""


@dataclass(frozen=True)
class Reservation:
    """What one Claude call may cost at most, as far as can be told before making it."""

    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class Budget:
    """One payer's token budget: its allowances, and what this process charged and holds against it.

    The store decides; the budget remembers what it last saw there (`remaining`) for logs and
    summaries, and turns a refusal into the error a server receives.
    """

    def __init__(
        self, allowances: Iterable[Allowance], name: str, option: str, key: str, *, total: bool = False
    ) -> None:
        self.allowances = tuple(allowances)
        self.name = name
        """How errors and logs call it, e.g. "process token budget"."""
        self.option = option
        """The flag that raises it."""
        self.limit = Limit(key, self.allowances, total)
        self.tokens: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        """What this process charged to it, by counter."""
        self.exchanges = 0
        """Claude calls made against it (a call's retries are part of it, as in the audit log)."""
        self.reserved = 0
        """What this process's calls in flight hold."""
        self._seen: list[int] = [0] * len(self.allowances)

    @property
    def used(self) -> int:
        """Every token this process charged: input (cache writes and reads included) plus output."""
        return sum(self.tokens.values())

    @property
    def remaining(self) -> int | None:
        """The tightest allowance's tokens not used yet, as last seen; None without allowances."""
        if not self.allowances:
            return None
        return min(max(0, each.tokens - seen) for each, seen in zip(self.allowances, self._seen, strict=True))

    def usage(self) -> list[tuple[Allowance, int]]:
        """Each allowance with the tokens used against it (in its current window), as last seen."""
        return list(zip(self.allowances, self._seen, strict=True))

    def saw(self, used: Sequence[int]) -> None:
        self._seen = list(used)

    def charge(self, usage: Mapping[str, int]) -> None:
        for key in USAGE_KEYS:
            self.tokens[key] += usage.get(key, 0)
        self._seen = [seen + sum(usage.values()) for seen in self._seen]

    def exhausted(self, index: int, used: int, reserved: int, now: float) -> SamplingError:
        """The refusal (-32603) for allowance `index`, used up (`used`) or fully `reserved`."""
        allowance = self.allowances[index]
        flag = self.option
        data: dict[str, Any] = {
            "limit": flag.lstrip("-").replace("-", "_"),
            "option": flag,
            "max": allowance.tokens,
            "used": used,
            "reserved": reserved,
            "remaining": max(0, allowance.tokens - used),
        }
        scope = ""
        if allowance.window is not None:
            seconds = BUDGET_WINDOWS[allowance.window]
            resets = (window_number(allowance, now) + 1) * seconds
            data["window"] = allowance.window
            data["resetsAt"] = datetime.fromtimestamp(resets, UTC).isoformat().replace("+00:00", "Z")
            data["retryAfterSeconds"] = max(1, math.ceil(resets - now))
            scope = f" this {allowance.window} (it starts again at {data['resetsAt']})"
        in_flight = f", {reserved} more reserved by calls in flight" if reserved else ""
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


class Account:
    """A payer with a budget, a rate limit and concurrency slots: the process, or one client.

    `slots` is this process's limiter; None when there is no cap, or when a shared store keeps them.
    """

    def __init__(
        self,
        budget: Budget,
        per_minute: int,
        max_concurrent: int,
        *,
        rate_option: str,
        rate_name: str,
        local_slots: bool,
        max_waiting: int = 0,
    ) -> None:
        self.budget = budget
        self.rate = Rate(budget.limit.key, per_minute)
        self.rate_option = rate_option
        self.rate_name = rate_name
        self.max_concurrent = max_concurrent
        self.slots = anyio.CapacityLimiter(max_concurrent) if max_concurrent > 0 and local_slots else None
        self.admitted = 0
        self.in_flight = 0
        self.max_waiting = max_waiting  # 0: no bound
        self.waiting = 0
        self.users = 0
        """Admissions under way that use it (from their first step to their last)."""
        self.last_used = -math.inf
        """When one last began or ended (the ledger's monotonic clock)."""

    @property
    def full(self) -> bool:
        """Would one more request have to wait for a slot, and may none more wait? (A shared store's
        slots are known only by asking it: then only those already waiting are counted.)"""
        if self.max_concurrent <= 0 or self.max_waiting <= 0 or self.waiting < self.max_waiting:
            return False
        return self.slots is None or self.slots.available_tokens < 1

    def too_many_waiting(self) -> SamplingError:
        option = "--max-waiting-sampling"
        return internal_error(
            f"Too many sampling requests waiting for a Claude call slot ({self.max_waiting} wait for "
            f"{self.max_concurrent} calls in flight{self._whose}); retry later, or raise {option} "
            f"(or {env_var(option)})",
            limit="max_waiting_sampling",
            option=option,
            max=self.max_waiting,
        )

    @property
    def _whose(self) -> str:
        key = self.budget.limit.key
        return f" of client {key.removeprefix('client:')!r}" if key.startswith("client:") else ""

    def rate_limited(self, retry_after: float) -> SamplingError:
        seconds = max(1, math.ceil(retry_after))
        option = self.rate_option
        return internal_error(
            f"{self.rate_name} reached: at most {self.rate.per_minute} sampling requests per minute; "
            f"retry in {seconds} s, or raise the limit with {option} (or {env_var(option)})",
            limit=option.lstrip("-").replace("-", "_"),
            option=option,
            max=self.rate.per_minute,
            retryAfterSeconds=seconds,
        )

    def snapshot(self) -> dict[str, Any]:
        statistics = self.slots.statistics() if self.slots is not None else None
        return {
            "budget": self.budget.snapshot(),
            "rate_limit": {"per_minute": self.rate.per_minute, "admitted": self.admitted},
            "concurrency": {
                "limit": self.max_concurrent or None,
                "in_flight": self.in_flight,
                "waiting": statistics.tasks_waiting if statistics else None,
            },
        }


@dataclass
class SamplingSession:
    """One client session as the sampler sees it: a label for logs, its own budget (kept with it),
    and the client identity it belongs to (whose budget, rate limit and slots it shares with the
    client's other sessions)."""

    label: str
    budget: Budget
    client: str = PROCESS
    store: MemoryStore = field(default_factory=MemoryStore)

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
    # Set by `Ticket.call`: charges the attempts so far and holds a new reservation (False: no room).
    renewal: Callable[[], Awaitable[bool]] | None = None
    # The input an attempt reported (what reading the prompt costs), kept across `take_cost`.
    known_input: dict[str, int] = field(default_factory=dict)
    # Attempts begun, and those of them that never left this machine (`not_sent`).
    begun: int = 0
    unsent: int = 0

    @property
    def made(self) -> bool:
        """Was Claude called: did an attempt leave this machine (or may it have)?"""
        return self.begun > self.unsent

    def begin_attempt(self) -> None:
        self.attempts.append(_Attempt())
        self.begun += 1

    async def may_retry(self) -> bool:
        return True if self.renewal is None else await self.renewal()

    def take_cost(self) -> dict[str, int]:
        """What the attempts so far may have cost; they are forgotten (charged by the caller)."""
        cost = self.cost()
        self.attempts.clear()
        return cost

    def report(self, usage: Mapping[str, int], *, final: bool = False) -> None:
        if self.attempts:
            attempt, counts = self.attempts[-1], normalize_usage(usage)
            if attempt.usage is not None:  # cumulative counters: one that went down is not believed
                counts = {key: max(value, attempt.usage[key]) for key, value in counts.items()}
            attempt.usage, attempt.final = counts, final
            if sum(counts[key] for key in INPUT_KEYS) > sum(self.known_input.values()):
                self.known_input = {key: counts[key] for key in INPUT_KEYS}

    def not_billed(self) -> None:
        if self.attempts:
            self.attempts[-1].billed = False

    def not_sent(self) -> None:
        if self.attempts:
            self.attempts[-1].billed = False
            self.unsent += 1

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
        usage = attempt.usage
        if usage is None:  # Claude may have read the whole prompt, and written max_tokens
            return {**self._prompt_read(), "output_tokens": self.reservation.output_tokens}
        if not any(usage[key] for key in INPUT_KEYS):  # no prompt is 0 tokens: the usage was left out
            usage = {**usage, **dict.fromkeys(INPUT_KEYS, 0), **self._prompt_read()}
        if attempt.final and usage["output_tokens"] > 0:
            return usage
        output = max(usage["output_tokens"], self.reservation.output_tokens)
        return {**usage, "output_tokens": output}

    def _prompt_read(self) -> dict[str, int]:
        """What reading the prompt may have cost, when the attempt did not say: the estimate, or
        what an attempt reported reading the same prompt when that is more."""
        if sum(self.known_input.values()) > self.reservation.input_tokens:
            return dict(self.known_input)
        return {"input_tokens": self.reservation.input_tokens}


@dataclass(frozen=True)
class _Stake:
    """Budgets one store answers for together: a session's (its own store), or the client's and the
    process's (the ledger's store)."""

    store: LedgerStore
    budgets: tuple[Budget, ...]

    @property
    def limits(self) -> tuple[Limit, ...]:
        return tuple(budget.limit for budget in self.budgets)


@dataclass
class _Hold:
    """A reservation held for a call: its lease, and the store that holds it for each stake."""

    lease: str
    held: list[tuple[_Stake, LedgerStore]] = field(default_factory=list)


@dataclass(frozen=True)
class _Prepaid:
    """A reservation the admission held on the shared stake for the request's first call."""

    lease: str
    amount: int
    store: LedgerStore


class Ticket:
    """An admitted sampling request: its slots are held; each Claude call for it is a `Charge`.

    The shared stake (the process's and the client's budgets) is the last of `stakes`; the
    admission may have reserved its first call there already (`prepaid`).
    """

    def __init__(self, spend: Spend, stakes: tuple[_Stake, ...], prepaid: _Prepaid | None = None) -> None:
        self._spend = spend
        self._stakes = stakes
        self._prepaid = prepaid
        self.charged: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        self.calls = 0

    @asynccontextmanager
    async def call(self, reservation: Reservation) -> AsyncIterator[Charge]:
        """Reserve for one Claude call if every budget has room (else refuse); on leaving, however
        the call ended, charge what it cost. A retry within the call (`Charge.may_retry`) is admitted
        as a call of its own: what the attempts so far may have cost is charged, and the reservation
        held again, or the retry refused."""
        prepaid, self._prepaid = self._prepaid, None
        if prepaid is not None and prepaid.amount != reservation.total:
            await self._release(prepaid)  # held for another call than this one
            prepaid = None
        hold: _Hold | None = await self._hold(reservation.total, prepaid)
        self._count_reserved(reservation.total)
        charge = Charge(reservation)

        async def renew() -> bool:
            nonlocal hold
            cost = charge.take_cost()
            if not any(cost.values()):
                return True  # nothing billed yet: the reservation held is still whole
            spent, hold = hold, None
            if spent is not None:  # charged before the next reservation is weighed against it
                await self._settle(spent, cost, wait=True)
            try:
                hold = await self._hold(reservation.total, None)
            except SamplingError:
                return False
            return True

        charge.renewal = renew
        try:
            yield charge
        finally:
            charge.renewal = None  # (it holds the charge: a reference cycle the collector would clear)
            self._count_reserved(-reservation.total)
            if hold is not None:
                await self._settle(hold, charge.take_cost())
            if charge.made:  # Claude was called (not only refused by this machine's client)
                self.calls += 1
                for stake in self._stakes:  # one call, however many charges its retries made
                    for budget in stake.budgets:
                        budget.exchanges += 1

    async def _hold(self, amount: int, prepaid: _Prepaid | None) -> _Hold:
        """Reserve `amount` on every stake (the shared one's may be `prepaid` already)."""
        spend = self._spend
        if prepaid is None:
            hold, to_reserve = _Hold(spend.new_lease()), self._stakes
        else:
            hold, to_reserve = _Hold(prepaid.lease), self._stakes[:-1]
            hold.held.append((self._stakes[-1], prepaid.store))
        try:
            for stake in to_reserve:
                hold.held.append((stake, await spend.reserve(stake, hold.lease, amount)))
        except BaseException:
            with anyio.CancelScope(shield=True):
                for stake, store in hold.held:
                    await spend.settle(store, stake, hold.lease, {})
            raise
        return hold

    async def _settle(self, hold: _Hold, cost: dict[str, int], *, wait: bool = False) -> None:
        """Release `hold` and charge `cost`, whatever cancels the caller (`wait`: see `Spend.settle`)."""
        with anyio.CancelScope(shield=True):
            for stake, store in hold.held:
                await self._spend.settle(store, stake, hold.lease, cost, wait=wait)
        for key, value in cost.items():
            self.charged[key] += value

    def _count_reserved(self, amount: int) -> None:
        for stake in self._stakes:
            for budget in stake.budgets:
                budget.reserved += amount

    async def release_prepaid(self) -> None:
        """Give back what the admission reserved, if no call took it."""
        prepaid, self._prepaid = self._prepaid, None
        if prepaid is not None:
            await self._release(prepaid)

    async def _release(self, prepaid: _Prepaid) -> None:
        with anyio.CancelScope(shield=True):
            await self._spend.settle(prepaid.store, self._stakes[-1], prepaid.lease, {})

    async def has_room(self) -> bool:
        """May another call be made for this request (e.g. to continue a paused turn)?"""
        try:
            for stake in self._stakes:
                await self._spend.reserve(stake, "", 0)
        except SamplingError:
            return False
        return True


class Spend:
    """The ledger of one process: its own account, one per client identity, and session budgets.

    A client's account outlives its sessions; what its budget and rate limit count lives in the
    store, which keeps it as long as it counts. An account nothing has used for `ACCOUNT_IDLE_SECONDS`
    (no request admitted, in flight or waiting) is dropped when the accounts are swept, which
    happens when a new identity arrives and `SWEEP_AT` accounts (then twice what the last sweep
    left) exist: identities that come and go leave nothing behind. `upkeep()` must surround the
    use of a shared store: it renews this process's leases and retries settlements the store missed."""

    def __init__(
        self,
        settings: SpendSettings,
        store: LedgerStore | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        self.store: LedgerStore = store or MemoryStore(wall_clock, clock)
        self.link = StoreLink(self.store, settings.store_outage, MemoryStore(wall_clock, clock))
        shared = self.store.shared
        self.process = Account(
            Budget(
                settings.budget,
                "token budget shared through the state store" if shared else "process token budget",
                "--budget-tokens",
                PROCESS,
                total=True,  # what the deployment spent, for operators
            ),
            settings.rate_limit,
            settings.max_concurrent,
            rate_option="--rate-limit",
            rate_name="Sampling rate limit",
            local_slots=True,
            max_waiting=settings.max_waiting,
        )
        self.clients: dict[str, Account] = {}
        self._sweep_clients_at = SWEEP_AT
        self.refused: dict[str, int] = {}
        self._id = secrets.token_hex(6)
        self._serial = itertools.count(1)

    @property
    def budget(self) -> Budget:
        """The process's budget."""
        return self.process.budget

    def new_lease(self) -> str:
        return f"{self._id}.{next(self._serial)}"

    def client(self, identity: str) -> Account:
        account = self.clients.get(identity)
        if account is None:
            if len(self.clients) >= self._sweep_clients_at:
                self._sweep_clients()
            settings = self.settings
            account = self.clients[identity] = Account(
                Budget(
                    settings.client_budget,
                    f"token budget of client {identity!r}",
                    "--client-budget-tokens",
                    f"client:{identity}",
                ),
                settings.client_rate_limit,
                settings.client_max_concurrent,
                rate_option="--client-rate-limit",
                rate_name=f"Sampling rate limit of client {identity!r}",
                local_slots=not self.store.shared,
                max_waiting=settings.max_waiting,
            )
        return account

    def _sweep_clients(self) -> None:
        """Drop the accounts nothing uses nor used in the last `ACCOUNT_IDLE_SECONDS`."""
        idle_since = self._clock() - ACCOUNT_IDLE_SECONDS
        self.clients = {
            name: account
            for name, account in self.clients.items()
            if account.users or account.last_used > idle_since
        }
        self._sweep_clients_at = max(SWEEP_AT, 2 * len(self.clients))

    def new_session(self, label: str, client: str = PROCESS) -> SamplingSession:
        """A session of the client `client` (stdio: the process; serve: the identity that
        authenticated it)."""
        budget = Budget(
            self.settings.session_budget, "session token budget", "--session-budget-tokens", "session"
        )
        return SamplingSession(label, budget, client, MemoryStore(self._wall_clock, self._clock))

    @asynccontextmanager
    async def admit(
        self, session: SamplingSession | None, first: Reservation | None = None
    ) -> AsyncIterator[Ticket]:
        """Hold the request's slots for the body, if its budgets and rate limits allow it.

        Waiting for a slot has no timeout of its own: the server's request timeout (or its cancel)
        ends the wait. The client's slot is taken before the process's, so that a client at its own
        cap does not hold a slot other clients could use; each call checks the budgets again.
        `first`: the first call's reservation, held on the shared stake in the admission's own step
        (one store operation less per request); given back before the request waits for a slot (a
        request waiting holds nothing; its call reserves anew) or when its call does not take it.
        """
        client = self.client(session.client) if session is not None else None
        accounts = (client, self.process) if client is not None else (self.process,)
        for account in accounts:
            account.users += 1
            account.last_used = self._clock()
        try:
            async with self._admitted(session, accounts, first) as ticket:
                yield ticket
        finally:
            for account in accounts:
                account.users -= 1
                account.last_used = self._clock()

    @asynccontextmanager
    async def _admitted(
        self, session: SamplingSession | None, accounts: tuple[Account, ...], first: Reservation | None
    ) -> AsyncIterator[Ticket]:
        shared = _Stake(self.store, tuple(account.budget for account in accounts))
        stakes = (_Stake(session.store, (session.budget,)), shared) if session is not None else (shared,)
        if session is not None:
            await self.reserve(stakes[0], "", 0)
        for account in accounts:
            if account.full:  # refused before the rate window counts it (`_slot` holds the bound)
                raise account.too_many_waiting()
        member, rates, limits = self.new_lease(), [account.rate for account in accounts], shared.limits
        lease, amount = (self.new_lease(), first.total) if first is not None else ("", 0)
        (standing, refusal), store = await self.link.run(
            "admit",
            self.store,
            lambda store: store.admit(limits, rates, member, lease, amount),
            holding=(limits, lease),
        )
        self._saw(shared, standing)
        if refusal is not None:
            account = accounts[refusal.index]
            raise account.rate_limited(refusal.retry_after)
        prepaid = _Prepaid(lease, amount, store) if amount > 0 else None
        if prepaid is not None:
            for limit in limits:
                self.link.hold(store, "reservation", limit.key, lease)
        ticket = Ticket(self, stakes, prepaid)
        try:
            async with AsyncExitStack() as stack:
                waited = False
                for account in accounts:
                    account.admitted += 1
                    slot = self._slot(account, before_waiting=ticket.release_prepaid)
                    waited = await stack.enter_async_context(slot) or waited
                if waited:  # others may have spent meanwhile
                    for stake in stakes:
                        await self.reserve(stake, "", 0)
                yield ticket
        finally:
            await ticket.release_prepaid()

    async def reserve(self, stake: _Stake, lease: str, amount: int) -> LedgerStore:
        """Hold `amount` for `lease` on the stake's budgets, or refuse with the first exhausted one's
        error; returns the store that holds it. An amount of 0 only checks."""
        limits = stake.limits
        standing, store = await self.link.run(
            "reserve",
            stake.store,
            lambda store: store.reserve(limits, lease, amount),
            holding=(limits, lease if amount > 0 else ""),
        )
        self._saw(stake, standing)
        if amount > 0:
            for limit in limits:
                self.link.hold(store, "reservation", limit.key, lease)
        return store

    async def settle(
        self, store: LedgerStore, stake: _Stake, lease: str, cost: Mapping[str, int], *, wait: bool = True
    ) -> None:
        """Release the lease and charge `cost` (its counters) to the stake's budgets (see
        `StoreLink.settle` for `wait`)."""
        if cost:
            for budget in stake.budgets:
                budget.charge(cost)
        await self.link.settle(store, stake.limits, lease, sum(cost.values()), wait=wait)

    def _saw(self, stake: _Stake, standing: Standing) -> None:
        """Note what the store said of the stake's budgets; refuse when it did not admit."""
        for budget, used in zip(stake.budgets, standing.used, strict=True):
            budget.saw(used)
        if not standing.admitted:
            raise self._refusal(stake, standing)

    def _refusal(self, stake: _Stake, standing: Standing) -> SamplingError:
        where = exhausted(stake.limits, standing.used, standing.reserved)
        assert where is not None, "a store refused a reservation no allowance refuses"
        index, allowance = where
        return stake.budgets[index].exhausted(
            allowance, standing.used[index][allowance], standing.reserved[index], standing.now
        )

    @asynccontextmanager
    async def _slot(
        self, account: Account, *, before_waiting: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[bool]:
        """One of the account's slots: this process's limiter, or a lease in the shared store.
        Yields whether it had to wait for it; `before_waiting` runs before a wait."""
        if account.max_concurrent <= 0:
            yield False
            return
        if account.slots is not None:
            waited = account.slots.available_tokens < 1
            if waited:
                self._start_waiting(account)
                try:
                    await before_waiting()
                    await account.slots.acquire()
                finally:
                    account.waiting -= 1
            else:
                await account.slots.acquire()
            account.in_flight += 1
            try:
                yield waited
            finally:
                account.in_flight -= 1
                account.slots.release()
            return
        key, holder = account.budget.limit.key, self.new_lease()
        pause, waited = SLOT_POLL_SECONDS[0], False
        try:
            while True:
                try:
                    got, store = await self.link.run(
                        "acquire_slot",
                        self.store,
                        lambda store: store.acquire_slot(key, account.max_concurrent, holder),
                    )
                except BaseException:
                    # Cancelled, or the reply lost: the store may have given the slot all the same,
                    # and nobody else would give it back (it would be taken until its lease lapsed).
                    await self.link.release_slot(self.store, key, holder)
                    raise
                if got:
                    break
                if not waited:
                    self._start_waiting(account)
                    waited = True
                    await before_waiting()
                await anyio.sleep(pause)
                pause = min(pause * 2, SLOT_POLL_SECONDS[1])
        finally:
            if waited:
                account.waiting -= 1
        self.link.hold(store, "slot", key, holder)
        account.in_flight += 1
        try:
            yield waited
        finally:
            account.in_flight -= 1
            await self.link.release_slot(store, key, holder)

    @staticmethod
    def _start_waiting(account: Account) -> None:
        """Count a request in the account's waiting line, or refuse it when the line is full."""
        if account.max_waiting > 0 and account.waiting >= account.max_waiting:
            raise account.too_many_waiting()
        account.waiting += 1

    async def claim_once(self, key: str, until: float) -> bool:
        """Whether this process is the first to claim `key` (until `until`, wall-clock seconds, and
        `CLOCK_SKEW_SECONDS` past it for the replicas whose clocks are behind) among those sharing
        the store; always True with a store nobody shares (the caller keeps its own memory). Raises
        `SamplingError` while the store is unavailable, unless `--state-store-outage local`."""
        if not self.store.shared:
            return True
        claimant, until = self.new_lease(), until + CLOCK_SKEW_SECONDS  # replicas' clocks differ
        claimed, _ = await self.link.run("claim", self.store, lambda store: store.claim(key, claimant, until))
        return claimed

    def upkeep(self) -> AbstractAsyncContextManager[None]:
        """Must surround the use of a shared store (see `StoreLink.upkeep`)."""
        return self.link.upkeep()

    def note_refusal(self, error: SamplingError) -> None:
        """Count a request a limit refused before any call (metrics, the stdio summary) by the limit's
        name; one failed after its billed call (`--max-tool-calls`) is a failure, not counted here."""
        limit = error.data.get("limit") if isinstance(error.data, dict) else None
        if isinstance(limit, str):
            self.refused[limit] = self.refused.get(limit, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.process.snapshot(),
            "clients": {name: account.snapshot() for name, account in self.clients.items()},
            "refused": dict(self.refused),
            "store": self.store.description,
            "unsettled": self.link.unsettled,
        }
