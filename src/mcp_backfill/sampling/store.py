"""Where the spend ledger keeps its counts: the `LedgerStore` interface, and the in-memory store.

A store keeps, per payer key (`"process"`, `"client:alice"`…), the tokens charged in each window of
its allowances and the reservations of calls in flight; per rate key, the admissions of the last
minute; per slot key, the slots held. Every operation is atomic with respect to every other process
using the same store, so that two replicas cannot both take a budget's last tokens:

* `reserve` admits while no allowance of any of its limits is used up or fully reserved, and then
  holds the amount on all of them, in one step (an amount of 0 only checks);
* `settle` releases a reservation and charges what the call cost, in one step;
* `admit` checks a request's budgets and, if they have room, admits it against several rate limits
  at once, or against none; an admitted request may hold its first call's reservation in the same
  step (`lease`, `amount`: one round trip to a shared store where a separate `reserve` made two);
* slots and reservations held by a process are leases: a shared store lets them lapse
  `LEASE_SECONDS` after their holder last renewed them, so a replica that died leaks nothing; a
  lapsed reservation is charged whole, since its holder never said what the call cost (should the
  holder settle after all, it is charged only what the call cost beyond that, never twice).
* `claim` takes a key once among all who share the store, until a given time: a sealed approval
  token redeems once whichever replica the retry reaches.

Three stores implement it: `MemoryStore` here (one process; nothing lapses; what it keeps of a key
that no longer counts is dropped, see `MemoryStore`), and in
`mcp_backfill.stores` a SQLite file (several processes on one machine) and Redis (many machines).
A shared store's failures raise `StoreUnavailable`; the ledger decides what that means.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mcp_backfill.errors import StoreUnavailable
from mcp_backfill.options import BUDGET_WINDOWS, Allowance

__all__ = [
    "CLOCK_SKEW_SECONDS",
    "LAPSED_MEMORY_SECONDS",
    "LEASE_SECONDS",
    "RATE_WINDOW_SECONDS",
    "SWEEP_AT",
    "Held",
    "LedgerStore",
    "Limit",
    "MemoryStore",
    "Rate",
    "RateRefusal",
    "Standing",
    "StoreUnavailable",
    "exhausted",
    "window_number",
]

LEASE_SECONDS = 30.0
"""How long a shared store keeps a reservation or slot its holder stopped renewing (it renews them
every third of that while it lives)."""
LAPSED_MEMORY_SECONDS = 86400.0
"""How long a shared store remembers a reservation it charged whole when it lapsed, so that the
holder's settlement, if it comes after all (a slow or cut-off holder, not a dead one), charges only
what the call cost beyond it rather than the call a second time."""
RATE_WINDOW_SECONDS = 60.0
CLOCK_SKEW_SECONDS = 3600.0
"""How long past its time a claim (`LedgerStore.claim`) of a sealed token is remembered: each
replica checks a token's expiry by its own clock, and one whose clock is behind (by up to this
much) still honours a token the claimant's clock saw expire; it must still find it claimed."""
SWEEP_AT = 1024
"""Entries one of `MemoryStore`'s tables holds before it first drops those that no longer count
(then again at twice what was left, so that a sweep costs O(1) per entry added)."""


@dataclass(frozen=True)
class Limit:
    """A payer's key in the store and its allowances."""

    key: str
    allowances: tuple[Allowance, ...]
    total: bool = False
    """Keep a count of every token charged over the payer's lifetime even without a lifetime
    allowance (the process's: what the deployment spent). Else a store keeps only what an allowance
    reads, and forgets a payer once none of that counts any more."""


@dataclass(frozen=True)
class Standing:
    """What a store saw of some limits, at `now` (its clock, seconds since the epoch)."""

    used: tuple[tuple[int, ...], ...]
    """Per limit, per allowance: the tokens charged in the allowance's current window."""
    reserved: tuple[int, ...]
    """Per limit: the tokens reserved by calls in flight."""
    now: float
    admitted: bool


@dataclass(frozen=True)
class Rate:
    """A requests-per-minute limit on a key (0: none)."""

    key: str
    per_minute: int


@dataclass(frozen=True)
class RateRefusal:
    index: int
    """Which of the rates refused."""
    retry_after: float


@dataclass(frozen=True)
class Held:
    """A lease a process holds: a reservation on a budget key, or a slot on a slot key."""

    kind: str  # "reservation" | "slot"
    key: str
    lease: str


def window_number(allowance: Allowance, now: float) -> int:
    """The allowance's current window (0 for a lifetime allowance)."""
    return 0 if allowance.window is None else int(now // BUDGET_WINDOWS[allowance.window])


def exhausted(
    limits: Sequence[Limit], used: Sequence[Sequence[int]], reserved: Sequence[int]
) -> tuple[int, int] | None:
    """(limit, allowance) of the first allowance used up or fully reserved, or None: the rule every
    store applies before it reserves."""
    for i, limit in enumerate(limits):
        for j, allowance in enumerate(limit.allowances):
            if used[i][j] + reserved[i] >= allowance.tokens:
                return i, j
    return None


class LedgerStore(Protocol):
    """The counters of the spend ledger (see the module docstring for what each operation promises)."""

    description: str
    """How errors and logs name it; never holds a credential."""
    shared: bool
    """Whether other processes may use it too (its leases then lapse unless renewed)."""
    lease_seconds: float
    """How long a lease lasts without being renewed."""

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing: ...

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None: ...

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]: ...

    async def acquire_slot(self, key: str, limit: int, holder: str) -> bool: ...

    async def release_slot(self, key: str, holder: str) -> None: ...

    async def renew(self, held: Sequence[Held]) -> None: ...

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        """True for the first `claimant` of `key` among all who share the store (and for the same
        claimant asking again: a claim re-sent after its reply was lost); remembered until `until`
        (wall-clock seconds)."""
        ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class _Payer:
    used: dict[tuple[str, int], int] = field(default_factory=dict)  # (window or "", number) -> tokens
    reservations: dict[str, int] = field(default_factory=dict)  # lease -> tokens

    def counts(self, now: float) -> bool:
        """Does it hold anything that still counts: a reservation, a lifetime count, or a count of
        a window not over yet?"""
        return bool(self.reservations) or any(
            not window or number >= int(now // BUDGET_WINDOWS[window]) for window, number in self.used
        )


class _Sweep:
    """When a table is next swept: at `SWEEP_AT` entries, then at twice what a sweep left."""

    def __init__(self) -> None:
        self.at = SWEEP_AT

    def due(self, size: int) -> bool:
        return size >= self.at

    def done(self, size: int) -> None:
        self.at = max(SWEEP_AT, 2 * size)


class MemoryStore:
    """The counts of one process, in its memory: nothing is shared and nothing lapses.

    `wall_clock` places charges in windows; `clock` measures the rate-limit minute.

    Payers, rate keys and slot keys come and go (a client identity per OAuth access token), so what
    no longer counts is dropped: an empty slot set at once; a payer without reservations whose counts
    are all of windows past (a payer is charged only in the windows of its allowances, and a
    lifetime count only with a lifetime allowance or `Limit.total`, so a client with no budget keeps
    nothing), a
    rate key whose minute is over, and an expired claim when their table is swept (`_Sweep`).
    A lifetime count is never dropped: forgetting it would reset a budget.
    """

    description = "memory"
    shared = False
    lease_seconds = LEASE_SECONDS

    def __init__(
        self,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall_clock = wall_clock
        self._clock = clock
        self._payers: dict[str, _Payer] = {}
        self._hits: dict[str, deque[float]] = {}
        self._slots: dict[str, set[str]] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._payer_sweep, self._hit_sweep, self._claim_sweep = _Sweep(), _Sweep(), _Sweep()

    def _standing(self, limits: Sequence[Limit], now: float) -> tuple[list[tuple[int, ...]], list[int]]:
        used: list[tuple[int, ...]] = []
        reserved: list[int] = []
        for limit in limits:
            payer = self._payers.get(limit.key) or _Payer()
            used.append(
                tuple(
                    payer.used.get((each.window or "", window_number(each, now)), 0)
                    for each in limit.allowances
                )
            )
            reserved.append(sum(payer.reservations.values()))
        return used, reserved

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        now = self._wall_clock()
        used, reserved = self._standing(limits, now)
        admitted = exhausted(limits, used, reserved) is None
        if admitted:
            self._hold(limits, lease, amount)
        return Standing(tuple(used), tuple(reserved), now, admitted)

    def _hold(self, limits: Sequence[Limit], lease: str, amount: int) -> None:
        if amount > 0:
            for limit in limits:
                self._payer(limit.key).reservations[lease] = amount

    def _payer(self, key: str) -> _Payer:
        payer = self._payers.get(key)
        if payer is None:
            if self._payer_sweep.due(len(self._payers)):
                now = self._wall_clock()
                self._payers = {k: each for k, each in self._payers.items() if each.counts(now)}
                self._payer_sweep.done(len(self._payers))
            payer = self._payers[key] = _Payer()
        return payer

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        now = self._wall_clock()
        for limit in limits:
            payer = self._payer(limit.key)
            payer.reservations.pop(lease, None)
            windows = {(each.window or "", window_number(each, now)) for each in limit.allowances}
            for window, number in windows | ({("", 0)} if limit.total else set()):
                for stale in [k for k in payer.used if k[0] == window and k[1] < number]:
                    del payer.used[stale]  # an earlier window's count
                payer.used[(window, number)] = payer.used.get((window, number), 0) + tokens
            if not payer.reservations and not payer.used:
                del self._payers[limit.key]

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        standing = await self.reserve(limits, "", 0)
        if not standing.admitted:
            return standing, None
        refusal = self._hit(rates)
        if refusal is None:
            self._hold(limits, lease, amount)
        return standing, refusal

    def _hit(self, rates: Sequence[Rate]) -> RateRefusal | None:
        now = self._clock()
        if self._hit_sweep.due(len(self._hits)):
            self._hits = {
                k: hits for k, hits in self._hits.items() if hits and hits[-1] > now - RATE_WINDOW_SECONDS
            }
            self._hit_sweep.done(len(self._hits))
        for index, rate in enumerate(rates):
            if rate.per_minute <= 0:
                continue
            admitted = self._hits.setdefault(rate.key, deque())
            while admitted and admitted[0] <= now - RATE_WINDOW_SECONDS:
                admitted.popleft()
            if len(admitted) >= rate.per_minute:
                return RateRefusal(index, admitted[0] + RATE_WINDOW_SECONDS - now)
        for rate in rates:
            if rate.per_minute > 0:
                self._hits[rate.key].append(now)
        return None

    async def acquire_slot(self, key: str, limit: int, holder: str) -> bool:
        held = self._slots.setdefault(key, set())
        if len(held) >= limit and holder not in held:
            return False
        held.add(holder)
        return True

    async def release_slot(self, key: str, holder: str) -> None:
        held = self._slots.get(key)
        if held is not None:
            held.discard(holder)
            if not held:
                del self._slots[key]

    async def renew(self, held: Sequence[Held]) -> None:
        return None  # nothing lapses in one process's memory

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        now = self._wall_clock()
        if self._claim_sweep.due(len(self._claims)):
            self._claims = {k: claim for k, claim in self._claims.items() if claim[1] > now}
            self._claim_sweep.done(len(self._claims))
        held = self._claims.get(key)
        if held is not None and held[1] > now:
            return held[0] == claimant
        self._claims[key] = (claimant, until)
        return True

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
