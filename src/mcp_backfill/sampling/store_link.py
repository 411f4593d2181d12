"""The ledger's store as one process uses it: what an outage means, leases kept alive, settlements
made late, and each operation's time told to an observer.

`StoreLink.run` is the one way the ledger touches a shared store. While the store is unavailable
(`StoreUnavailable`) a request is refused with an error that names the store and the option that
changes the policy, or (`--state-store-outage local`) the operation runs on this process's own
`MemoryStore` instead. A settlement the store missed is kept and retried until it lands, so a call
is never left uncharged; `upkeep()` does that, and renews the leases this process holds.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

from mcp_backfill.errors import StoreUnavailable, internal_error
from mcp_backfill.logs import get_logger
from mcp_backfill.sampling.store import Held, LedgerStore, Limit, MemoryStore

__all__ = ["SETTLE_TIMEOUT_SECONDS", "StoreLink"]

log = get_logger("spend")

SETTLE_TIMEOUT_SECONDS = 10.0
"""How long a settlement or a slot's release may take before it is left for later (or to lapse)."""

T = TypeVar("T")


class StoreLink:
    """One process's use of its ledger store (see the module docstring)."""

    def __init__(self, store: LedgerStore, outage_policy: str, fallback: MemoryStore) -> None:
        self.store = store
        self.policy = outage_policy
        self.fallback = fallback
        """Where counts go while a shared store is unavailable, with the `local` policy."""
        self.outage: str | None = None
        """Why the shared store is unavailable, while it is."""
        self.observer: Callable[[str, float, bool], None] | None = None
        """Told of each operation on a shared store: its name, seconds taken, and whether it worked."""
        self.held: dict[tuple[str, str], Held] = {}
        self._unsettled: list[tuple[tuple[Limit, ...], str, int]] = []
        self._releases: deque[tuple[float, tuple[Limit, ...], str]] = deque()
        """Settlements of 0 tokens the store missed, with when they stop mattering (see `_missed`)."""
        self._background: TaskGroup | None = None

    @property
    def unsettled(self) -> int:
        return len(self._unsettled) + len(self._releases)

    async def run(
        self,
        name: str,
        store: LedgerStore,
        op: Callable[[LedgerStore], Awaitable[T]],
        *,
        holding: tuple[tuple[Limit, ...], str] = ((), ""),
    ) -> tuple[T, LedgerStore]:
        """Operation `name` (`op`) on `store`, and the store that answered it. An operation that
        may hold a reservation (`holding`: its limits and lease) and ends without an answer
        releases it (see `_release_unanswered`)."""
        if not store.shared:
            return await op(store), store
        started = time.perf_counter()
        try:
            result = await op(store)
        except BaseException as exc:
            await self._release_unanswered(store, *holding)
            if not isinstance(exc, StoreUnavailable):
                raise
            self._observe(store, name, started, ok=False)
            if self.outage is None:
                log.error("state store unavailable", extra={"store": exc.store, "error": exc.cause})
            self.outage = exc.cause
            if self.policy == "local":
                return await op(self.fallback), self.fallback
            why = str(exc).rstrip(".")  # a client library's text may end a sentence of its own
            raise internal_error(
                f"Sampling is refused while {why}; relaying goes on. To sample on this process's own "
                "counts meanwhile, set --state-store-outage local (or MCP_BACKFILL_STATE_STORE_OUTAGE)",
                limit="state_store",
                store=exc.store,
                option="--state-store-outage",
            ) from None
        self._observe(store, name, started, ok=True)
        if self.outage is not None:
            log.info("state store available again", extra={"store": store.description})
            self.outage = None
        return result, store

    async def _release_unanswered(self, store: LedgerStore, limits: tuple[Limit, ...], lease: str) -> None:
        """Settle `lease` for nothing after its operation ended without an answer (cancelled, or its
        reply lost): the store may hold it all the same, and nobody else would settle it, so it
        would lapse and be charged whole for a call never made. Like any settlement: shielded,
        bounded by `SETTLE_TIMEOUT_SECONDS`, in the background, and retried if the store missed it
        (see `_missed`); a lease the store never held costs nothing."""
        if lease:
            with anyio.CancelScope(shield=True):
                await self.settle(store, limits, lease, 0, wait=False)

    def hold(self, store: LedgerStore, kind: str, key: str, lease: str) -> None:
        """Keep a lease of a shared store alive until `let_go`."""
        if store.shared:
            self.held[(key, lease)] = Held(kind, key, lease)

    def let_go(self, key: str, lease: str) -> None:
        self.held.pop((key, lease), None)

    async def settle(
        self, store: LedgerStore, limits: tuple[Limit, ...], lease: str, tokens: int, *, wait: bool
    ) -> None:
        """Release `lease` and charge `tokens` to `limits`. Without `wait`, a shared store is told
        in the background (under `upkeep()`): the answer need not wait for the store, and the
        reservation holds until the settlement lands."""
        for limit in limits:
            self.let_go(limit.key, lease)
        if not wait and store.shared and self._background is not None:
            self._background.start_soon(self._settle, store, limits, lease, tokens)
        else:
            await self._settle(store, limits, lease, tokens)

    async def _settle(self, store: LedgerStore, limits: tuple[Limit, ...], lease: str, tokens: int) -> None:
        started = time.perf_counter()
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(SETTLE_TIMEOUT_SECONDS):
                await store.settle(limits, lease, tokens)
        except (StoreUnavailable, TimeoutError) as exc:
            self._observe(store, "settle", started, ok=False)
            # Charged later, when the store is back; meanwhile the reservation lapses there.
            self._missed(limits, lease, tokens)
            (log.error if tokens else log.debug)(
                "state store missed a settlement; it is retried until the store is back",
                extra={"store": store.description, "tokens": tokens, "error": str(exc)},
            )
            if self.policy == "local" and tokens:  # (not a release: the lease may be held here)
                await self.fallback.settle(limits, lease, tokens)
        else:
            self._observe(store, "settle", started, ok=True)

    def _missed(self, limits: tuple[Limit, ...], lease: str, tokens: int) -> None:
        """Keep a settlement the store missed for `_flush`. One of 0 tokens (a release) matters only
        while the store may hold its lease: once that lapsed, the store charged it whole, and a late
        settlement charges only what the call cost beyond it, nothing. So a release is kept no
        longer than a lease lasts, and an outage refusing many requests keeps few."""
        if tokens:
            self._unsettled.append((limits, lease, tokens))
            return
        now = time.monotonic()
        while self._releases and self._releases[0][0] <= now:
            self._releases.popleft()
        self._releases.append((now + self.store.lease_seconds, limits, lease))

    async def release_slot(self, store: LedgerStore, key: str, holder: str) -> None:
        """Give a slot back; one the store misses lapses there with its lease."""
        self.let_go(key, holder)
        shield = anyio.CancelScope(shield=True)
        with shield, anyio.move_on_after(SETTLE_TIMEOUT_SECONDS), contextlib.suppress(StoreUnavailable):
            await store.release_slot(key, holder)

    def _observe(self, store: LedgerStore, name: str, started: float, *, ok: bool) -> None:
        if store.shared and self.observer is not None:
            self.observer(name, time.perf_counter() - started, ok)

    @asynccontextmanager
    async def upkeep(self) -> AsyncIterator[None]:
        """While the body runs, renew this process's leases in a shared store and retry the
        settlements it missed; then settle what is left and close the store."""
        try:
            if not self.store.shared:
                yield
                return
            async with anyio.create_task_group() as tg:
                renewing = anyio.CancelScope()
                tg.start_soon(self._keep_leases, renewing)
                self._background = tg
                try:
                    yield
                finally:
                    self._background = None
                    renewing.cancel()  # settlements in flight finish (they are shielded)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SETTLE_TIMEOUT_SECONDS):
                await self._flush()
            if self._unsettled:
                log.error(
                    "state store unavailable at exit: settlements lost; their reservations lapse and "
                    "are charged whole, what the calls cost beyond that is not counted",
                    extra={
                        "unsettled": len(self._unsettled),
                        "tokens": sum(tokens for _, _, tokens in self._unsettled),
                        "store": self.store.description,
                    },
                )
            with anyio.CancelScope(shield=True):
                await self.store.aclose()

    async def _keep_leases(self, scope: anyio.CancelScope) -> None:
        with scope:
            while True:
                await anyio.sleep(self.store.lease_seconds / 3)
                try:
                    await self.store.renew(list(self.held.values()))
                    await self._flush()
                except StoreUnavailable as exc:
                    log.debug("state store upkeep failed", extra={"error": exc.cause})

    async def _flush(self) -> None:
        while self._releases:
            until, limits, lease = self._releases[0]
            if until > time.monotonic():
                try:
                    await self.store.settle(limits, lease, 0)
                except StoreUnavailable:
                    return
            self._releases.popleft()
        while self._unsettled:
            limits, lease, tokens = self._unsettled[0]
            try:
                await self.store.settle(limits, lease, tokens)
            except StoreUnavailable:
                return
            self._unsettled.pop(0)
            log.info("state store settlement made late", extra={"tokens": tokens})
