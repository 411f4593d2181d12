"""The ledger's counts in a SQLite file, shared by every process on one machine that opens it.

Each operation is one `BEGIN IMMEDIATE` transaction (the write lock is taken at its start, so two
processes' check-and-reserve steps cannot interleave), run in a worker thread so that the event
loop never waits on the file. The database is in WAL mode: readers do not block the writer, and a
process that dies mid-transaction leaves nothing half-written. Time is this machine's clock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import anyio

from mcp_backfill.errors import StoreUnavailable
from mcp_backfill.options import BUDGET_WINDOWS
from mcp_backfill.sampling.store import (
    LAPSED_MEMORY_SECONDS,
    LEASE_SECONDS,
    RATE_WINDOW_SECONDS,
    SWEEP_AT,
    Held,
    Limit,
    Rate,
    RateRefusal,
    Standing,
    exhausted,
    window_number,
)
from mcp_backfill.shared_dirs import unsafe_directory

__all__ = ["SqliteStore"]

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS used (
    key TEXT NOT NULL, window TEXT NOT NULL, number INTEGER NOT NULL, tokens INTEGER NOT NULL,
    PRIMARY KEY (key, window, number)
);
-- The sweep finds the counts of windows past by it, not by reading every payer's (`_sweep`).
CREATE INDEX IF NOT EXISTS used_by_window ON used (window, number);
CREATE TABLE IF NOT EXISTS leases (
    kind TEXT NOT NULL, key TEXT NOT NULL, lease TEXT NOT NULL, amount INTEGER NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (kind, key, lease)
);
CREATE TABLE IF NOT EXISTS hits (key TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS hits_by_key ON hits (key, at);
"""
DROP_LEASE = "DELETE FROM leases WHERE kind = ? AND key = ? AND lease = ?"


def unsafe_place(path: str) -> str | None:
    """Why the ledger must not be kept at `path` (None: it may). SQLite creates the file and its
    `-wal` and `-shm` beside it, following links: in a directory another user can write to (`/tmp`)
    or owns, they could create them first and then rewrite what every budget has used."""
    directory = os.path.dirname(os.path.abspath(path))
    problem = unsafe_directory(directory)
    if problem is None:
        return None
    return (
        f"{problem}: another user could create the SQLite ledger (or its -wal and -shm files) there "
        "first, and rewrite the budgets; keep it in a directory only its users can write to, e.g. "
        "sqlite:///var/lib/mcp-backfill/ledger.db"
    )


def _identity(path: str) -> tuple[int, int] | None:
    """The file at `path` (device, inode), None if there is none."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


class SqliteStore:
    """A `LedgerStore` in the SQLite file at `path` (created if missing)."""

    shared = True

    def __init__(
        self,
        path: str,
        *,
        lease_seconds: float = LEASE_SECONDS,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.description = f"sqlite://{path}"  # as the URL gave it
        self.lease_seconds = lease_seconds
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._operations = 0
        self._busy_ms = 0
        """The busy timeout (ms) the connection has."""
        self._file: tuple[int, int] | None = None
        """The file the connection opened (device, inode)."""

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None and self._file != _identity(self.path):
            # The file was removed or another put in its place (budgets started again, a backup
            # restored): the processes opening the path from now on use the new one, so must this
            # one. (SQLite neither checkpoints into, nor deletes the -wal of, a file that moved.)
            self._db.close()
            self._db = None
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            problem = unsafe_place(self.path)  # again: the directory may have been made meanwhile
            if problem is not None:
                raise OSError(problem)
            db = sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            try:
                self._prepare(db)
            except BaseException:
                db.close()
                raise
            self._db, self._busy_ms = db, round(self._timeout * 1000)
            self._file = _identity(self.path)
        return self._db

    def _prepare(self, db: sqlite3.Connection) -> None:
        """WAL mode and the schema. Switching a new file to WAL ignores the busy timeout ("database
        is locked" at once when several processes open it together), so that step is retried."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)

    async def _run(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        def transaction() -> T:
            # The timeout bounds the operation, waiting for this process's operations before it
            # included: else each waits out its own busy timeout after theirs, one after another.
            deadline = time.monotonic() + self._timeout
            if not self._lock.acquire(timeout=self._timeout):
                raise sqlite3.OperationalError("database is locked")
            try:
                db = self._connect()
                self._wait_until(db, deadline)
                db.execute("BEGIN IMMEDIATE")
                try:
                    now = self._clock()
                    result = work(db, now)
                    self._operations += 1
                    if self._operations >= SWEEP_AT:
                        self._operations = 0
                        self._sweep(db, now)
                    db.execute("COMMIT")
                except BaseException:
                    self._roll_back(db)
                    raise
                return result
            finally:
                self._lock.release()

        try:
            return await anyio.to_thread.run_sync(transaction)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(self.description, str(exc)) from None

    def _wait_until(self, db: sqlite3.Connection, deadline: float) -> None:
        """Have SQLite wait for another process's write lock no longer than until `deadline` (the
        busy timeout is the whole timeout unless this operation waited its turn in this process)."""
        whole = round(self._timeout * 1000)
        left = max(1, round((deadline - time.monotonic()) * 1000))
        busy = whole if left >= whole - 10 else left
        if busy != self._busy_ms:
            db.execute(f"PRAGMA busy_timeout = {busy}")
            self._busy_ms = busy

    @staticmethod
    def _sweep(db: sqlite3.Connection, now: float) -> None:
        """Drop what no longer counts whoever it was for: rate admissions older than the minute,
        counts of windows past, lapsed leases no longer remembered, slots and claims expired. Each
        payer's are dropped as it is used; this is for the payers never used again (client
        identities that come and go), every `SWEEP_AT` operations of this process. Each statement
        reads only what it drops (or a minute's admissions), never every payer's counts: it runs
        inside an operation's transaction, the file's write lock held for every process."""
        db.execute("DELETE FROM hits WHERE at <= ?", (now - RATE_WINDOW_SECONDS,))
        for window, seconds in BUDGET_WINDOWS.items():
            db.execute("DELETE FROM used WHERE window = ? AND number < ?", (window, int(now // seconds)))
        db.execute("DELETE FROM leases WHERE kind IN ('lapsed', 'slot', 'claim') AND expires <= ?", (now,))

    def _roll_back(self, db: sqlite3.Connection) -> None:
        """End a transaction that failed, its COMMIT included: one left open fails every later
        operation ("cannot start a transaction within a transaction"). A connection that cannot even
        roll back is closed, and the next operation opens a new one."""
        try:
            if db.in_transaction:
                db.execute("ROLLBACK")
        except sqlite3.Error:
            db.close()
            self._db = None

    def _reserved(self, db: sqlite3.Connection, limit: Limit, now: float) -> int:
        """What calls in flight hold; a lease whose holder stopped renewing it lapses, and its whole
        reservation is charged (the holder died before it could say what the call cost), in the
        window it lapsed in however much later its payer is read. It stays as a 'lapsed' row a
        while, so that a late settlement charges only what the call cost beyond."""
        db.execute("DELETE FROM leases WHERE kind = 'lapsed' AND key = ? AND expires <= ?", (limit.key, now))
        where = "WHERE kind = 'reservation' AND key = ? AND expires <= ?"
        lapsed = db.execute(f"SELECT amount, expires FROM leases {where}", (limit.key, now)).fetchall()  # noqa: S608
        db.execute(
            f"UPDATE leases SET kind = 'lapsed', expires = ? {where}",  # noqa: S608
            (now + LAPSED_MEMORY_SECONDS, limit.key, now),
        )
        for amount, expired in lapsed:
            self._charge(db, limit, amount, expired)
        row = db.execute(
            "SELECT COALESCE(SUM(amount), 0) FROM leases WHERE kind = 'reservation' AND key = ?", (limit.key,)
        ).fetchone()
        return int(row[0])

    @staticmethod
    def _charge(db: sqlite3.Connection, limit: Limit, tokens: int, now: float) -> None:
        """Add `tokens` to the count of each of the payer's allowances, its lifetime's or its window's
        (dropping past windows), and to its lifetime count if it keeps one (`Limit.total`)."""
        windows = {(each.window or "", window_number(each, now)) for each in limit.allowances}
        for window, number in windows | ({("", 0)} if limit.total else set()):
            db.execute(
                "DELETE FROM used WHERE key = ? AND window = ? AND number < ?", (limit.key, window, number)
            )
            db.execute(
                "INSERT INTO used VALUES (?, ?, ?, ?) ON CONFLICT (key, window, number) "
                "DO UPDATE SET tokens = tokens + excluded.tokens",
                (limit.key, window, number, tokens),
            )

    def _standing(
        self, db: sqlite3.Connection, limits: Sequence[Limit], now: float, lease: str, amount: int
    ) -> Standing:
        used: list[tuple[int, ...]] = []
        reserved: list[int] = []
        for limit in limits:
            reserved.append(self._reserved(db, limit, now))
            counts = []
            for each in limit.allowances:
                row = db.execute(
                    "SELECT tokens FROM used WHERE key = ? AND window = ? AND number = ?",
                    (limit.key, each.window or "", window_number(each, now)),
                ).fetchone()
                counts.append(int(row[0]) if row else 0)
            used.append(tuple(counts))
        admitted = exhausted(limits, used, reserved) is None
        if admitted:
            self._hold(db, limits, lease, amount, now)
        return Standing(tuple(used), tuple(reserved), now, admitted)

    def _hold(
        self, db: sqlite3.Connection, limits: Sequence[Limit], lease: str, amount: int, now: float
    ) -> None:
        if amount > 0:
            db.executemany(
                "INSERT OR REPLACE INTO leases VALUES ('reservation', ?, ?, ?, ?)",
                [(limit.key, lease, amount, now + self.lease_seconds) for limit in limits],
            )

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        return await self._run(lambda db, now: self._standing(db, limits, now, lease, amount))

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        def work(db: sqlite3.Connection, now: float) -> tuple[Standing, RateRefusal | None]:
            standing = self._standing(db, limits, now, "", 0)
            if not standing.admitted:
                return standing, None
            refusal = self._hit(db, rates, now)
            if refusal is None:
                self._hold(db, limits, lease, amount, now)
            return standing, refusal

        return await self._run(work)

    @staticmethod
    def _hit(db: sqlite3.Connection, rates: Sequence[Rate], now: float) -> RateRefusal | None:
        for index, rate in enumerate(rates):
            if rate.per_minute <= 0:
                continue
            db.execute("DELETE FROM hits WHERE key = ? AND at <= ?", (rate.key, now - RATE_WINDOW_SECONDS))
            count, oldest = db.execute(
                "SELECT COUNT(*), MIN(at) FROM hits WHERE key = ?", (rate.key,)
            ).fetchone()
            if count >= rate.per_minute:
                return RateRefusal(index, oldest + RATE_WINDOW_SECONDS - now)
        db.executemany(
            "INSERT INTO hits VALUES (?, ?)", [(rate.key, now) for rate in rates if rate.per_minute > 0]
        )
        return None

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            for limit in limits:
                due = tokens
                if not db.execute(DROP_LEASE, ("reservation", limit.key, lease)).rowcount:
                    row = db.execute(
                        "SELECT amount FROM leases WHERE kind = 'lapsed' AND key = ? AND lease = ?",
                        (limit.key, lease),
                    ).fetchone()
                    if row is not None:  # charged whole when it lapsed: only what it cost beyond
                        due = max(0, tokens - int(row[0]))
                        db.execute(DROP_LEASE, ("lapsed", limit.key, lease))
                self._charge(db, limit, due, now)

        await self._run(work)

    async def acquire_slot(self, key: str, limit: int, holder: str) -> bool:
        def work(db: sqlite3.Connection, now: float) -> bool:
            db.execute("DELETE FROM leases WHERE kind = 'slot' AND key = ? AND expires <= ?", (key, now))
            (count,) = db.execute(
                "SELECT COUNT(*) FROM leases WHERE kind = 'slot' AND key = ?", (key,)
            ).fetchone()
            if count >= limit:
                return False
            db.execute(
                "INSERT OR REPLACE INTO leases VALUES ('slot', ?, ?, 0, ?)",
                (key, holder, now + self.lease_seconds),
            )
            return True

        return await self._run(work)

    async def release_slot(self, key: str, holder: str) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            db.execute(DROP_LEASE, ("slot", key, holder))

        await self._run(work)

    async def renew(self, held: Sequence[Held]) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            db.executemany(
                "UPDATE leases SET expires = ? WHERE kind = ? AND key = ? AND lease = ?",
                [(now + self.lease_seconds, each.kind, each.key, each.lease) for each in held],
            )

        if held:
            await self._run(work)

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        def work(db: sqlite3.Connection, now: float) -> bool:
            db.execute("DELETE FROM leases WHERE kind = 'claim' AND expires <= ?", (now,))
            row = db.execute("SELECT lease FROM leases WHERE kind = 'claim' AND key = ?", (key,)).fetchone()
            if row is not None:
                return bool(row[0] == claimant)
            db.execute("INSERT INTO leases VALUES ('claim', ?, ?, 0, ?)", (key, claimant, until))
            return True

        return await self._run(work)

    async def ping(self) -> None:
        await self._run(lambda db, now: db.execute("SELECT 1").fetchone())

    async def aclose(self) -> None:
        """Close the connection in a worker thread, as an operation runs: one may be waiting for the
        file up to the timeout, and the event loop must not. One still in use then is left to it."""

        def close() -> None:
            if self._lock.acquire(timeout=self._timeout):
                db, self._db = self._db, None
                self._lock.release()
                if db is not None:
                    db.close()

        await anyio.to_thread.run_sync(close)
