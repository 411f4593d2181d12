"""The proxy's own sampling tasks (MCP 2025-11-25), as plain state: statuses, TTLs, pages.

A server that may augment `sampling/createMessage` with `params.task` gets a task id at once and
polls for the answer. The book holds what the spec asks a receiver to keep per task: its status
(`working`, then one terminal status that never changes), when it was created and last updated, its
TTL (the server's request, lowered to the operator's cap) and its outcome. An expired task is
forgotten: looking it up finds nothing, as for an id never issued (a task that ended just before
its TTL is kept a few poll intervals past it, for its answer to be fetched). Past `MAX_TASKS` one is
evicted to make room: looking it up says so until its TTL passes. The I/O (running the Claude
call, answering the server) lives in `tasks`; this module is pure, with an injectable clock.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from mcp_backfill import protocol

Status = Literal["working", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

# Task ids are unguessable (the spec asks for that where tasks are not bound to an authorisation
# context) and carry a prefix, so that requests about them are routed to the proxy, never the client.
TASK_ID_PREFIX = "mcp-backfill-task-"
POLL_INTERVAL_MS = 1000  # what the proxy suggests to pollers
# How long a task that ended is kept at least, TTL or not: a call that ends in the last moments of
# its TTL has been paid for, and a server polling as told must still find its answer.
FINISHED_KEPT_MS = 3 * POLL_INTERVAL_MS
PAGE_SIZE = 50  # tasks per `tasks/list` page
CURSOR_PREFIX = "after-"  # a `tasks/list` cursor: this and the creation number of the last task listed
MAX_TASKS = 1000  # kept per session; the oldest fetched, then finished, ones make room beyond it

NOT_FOUND = "Failed to retrieve task: Task not found"
EXPIRED = "The task expired"  # the outcome of a task forgotten while working when its TTL passed
# The outcome of a task forgotten while working to make room for a new one (none had finished).
EVICTED = (
    f"The task was evicted to make room for a newer one: the session already kept {MAX_TASKS} tasks "
    "(MAX_TASKS, the most mcp-backfill keeps per session) and none of them had finished"
)
# What a lookup of a task evicted before its TTL passed is answered.
EVICTED_NOT_FOUND = (
    f"{NOT_FOUND}: it was evicted to make room for newer tasks, the session having kept {MAX_TASKS} "
    "(MAX_TASKS, the most mcp-backfill keeps per session)"
)


def is_own_task(task_id: Any) -> bool:
    return isinstance(task_id, str) and task_id.startswith(TASK_ID_PREFIX)


def iso(timestamp: float) -> str:
    """An ISO 8601 (RFC 3339) UTC timestamp with milliseconds."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class SamplingTask:
    """One task: what `tasks/get` shows, and the outcome `tasks/result` returns once it is terminal."""

    task_id: str
    created: float
    ttl_ms: int
    status: Status = "working"
    status_message: str | None = None
    updated: float = 0.0
    # Once terminal: ("result", CreateMessageResult) or ("error", JSON-RPC error object).
    outcome: tuple[Literal["result", "error"], dict[str, Any]] | None = None
    # Its place in the session's creation order: a `tasks/list` cursor names the last one listed.
    number: int = 0
    # A `tasks/result` was answered with its outcome: past `MAX_TASKS`, it makes room first.
    fetched: bool = False
    # Dropped from the book to make room for a new task (past `MAX_TASKS`), not for its TTL.
    evicted: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def expires(self) -> float:
        """When the task may be forgotten: its TTL after its creation, or, for one that ended
        within `FINISHED_KEPT_MS` of that, as long after its end (its answer, paid for, was
        forgotten before a server polling every `pollInterval` could see the task had ended)."""
        end = self.created + self.ttl_ms / 1000
        if self.terminal:
            return max(end, self.updated + FINISHED_KEPT_MS / 1000)
        return end

    def wire(self) -> dict[str, Any]:
        """The `Task` object of the spec."""
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": iso(self.created),
            "lastUpdatedAt": iso(self.updated or self.created),
            "ttl": self.ttl_ms,
            "pollInterval": POLL_INTERVAL_MS,
        }
        if self.status_message is not None:
            task["statusMessage"] = self.status_message
        return task


class TaskError(LookupError):
    """A `tasks/*` request the spec answers with `-32602` (unknown task or cursor, or a cancel of
    a finished task); the message is the error's."""


@dataclass
class TaskBook:
    """The tasks of one session, in creation order."""

    ttl_max_ms: int
    clock: Callable[[], float] = time.time
    tasks: dict[str, SamplingTask] = field(default_factory=dict)
    created_count: int = 0
    # Tasks evicted before their TTL passed, to when it passes: looking one up says it was evicted
    # (at most `MAX_TASKS` of them, the oldest forgotten first).
    evictions: dict[str, float] = field(default_factory=dict)

    def create(self, requested_ttl: Any) -> tuple[SamplingTask, list[SamplingTask]]:
        """A new working task, and the tasks forgotten, expired or `evicted` to make room (still
        working ones among them must be stopped by the caller)."""
        evicted = self.expire()
        now = self.clock()
        self.created_count += 1
        task = SamplingTask(
            TASK_ID_PREFIX + secrets.token_urlsafe(16),
            now,
            self.granted_ttl(requested_ttl),
            updated=now,
            number=self.created_count,
        )
        if len(self.tasks) >= MAX_TASKS:
            dropped = self.tasks.pop(self._least_needed().task_id)
            dropped.evicted = True
            self.evictions[dropped.task_id] = dropped.expires()
            if len(self.evictions) > MAX_TASKS:
                del self.evictions[next(iter(self.evictions))]
            evicted.append(dropped)
        self.tasks[task.task_id] = task
        return task, evicted

    def _least_needed(self) -> SamplingTask:
        """The task to drop for a new one past `MAX_TASKS`: the oldest whose answer the server has
        fetched, else the oldest finished one (its answer, paid for, never fetched), else the oldest."""
        finished = None
        for task in self.tasks.values():  # in creation order
            if task.terminal and task.fetched:
                return task
            if task.terminal and finished is None:
                finished = task
        return finished if finished is not None else next(iter(self.tasks.values()))

    def granted_ttl(self, requested: Any) -> int:
        """The TTL a task gets (ms): the server's request within the cap, whole milliseconds rounded
        up, or the cap when it asked for none a task can have (not a positive finite number: JSON's
        `1e400` is infinity, and 0.5 ms cut to 0 would be a task gone before it could be polled)."""
        numeric = isinstance(requested, int | float) and not isinstance(requested, bool)
        if numeric and math.isfinite(requested) and requested > 0:
            ceiling: int = math.ceil(requested)
            return min(ceiling, self.ttl_max_ms)
        return self.ttl_max_ms

    def expire(self) -> list[SamplingTask]:
        """Forget the tasks whose TTL has passed; returns them."""
        now = self.clock()
        gone = [task for task in self.tasks.values() if task.expires() <= now]
        for task in gone:
            del self.tasks[task.task_id]
        if self.evictions:
            for task_id in [task_id for task_id, end in self.evictions.items() if end <= now]:
                del self.evictions[task_id]
        return gone

    def get(self, task_id: Any) -> SamplingTask:
        if not isinstance(task_id, str):  # JSON can make it unhashable
            raise TaskError(NOT_FOUND)
        task = self.tasks.get(task_id)
        now = self.clock()
        if task is None or task.expires() <= now:
            evicted = task is None and self.evictions.get(task_id, now) > now
            raise TaskError(EVICTED_NOT_FOUND if evicted else NOT_FOUND)
        return task

    def clear(self) -> None:
        """Forget every task (the session they were made in ended)."""
        self.tasks.clear()
        self.evictions.clear()

    def finish(self, task: SamplingTask, status: Status, outcome: Any, message: str | None = None) -> bool:
        """Move a working task to a terminal status; False (and no change) if it already is terminal."""
        if task.terminal:
            return False
        task.status = status
        task.outcome = outcome
        task.status_message = message
        task.updated = max(self.clock(), task.created)
        return True

    def cancel(self, task_id: Any) -> SamplingTask:
        task = self.get(task_id)
        if task.terminal:
            raise TaskError(f"Cannot cancel task: already in terminal status '{task.status}'")
        error = {"code": protocol.REQUEST_CANCELLED, "message": "The task was cancelled by request"}
        self.finish(task, "cancelled", ("error", error), "The task was cancelled by request.")
        return task

    def page(self, cursor: Any) -> tuple[list[SamplingTask], str | None]:
        """One `tasks/list` page after `cursor`, and the next cursor if more follow. A cursor names
        a place in the creation order, not a task: it stays good when the last task of its page
        expires, or is dropped, before the next page is asked for (that task's id, the cursor it
        used to be, then failed as invalid)."""
        self.expire()
        after = 0
        if cursor is not None:
            after = self._cursor_place(cursor)
        chunk: list[SamplingTask] = []
        more = False
        for task in self.tasks.values():  # in creation order
            if task.number <= after:
                continue
            if len(chunk) == PAGE_SIZE:
                more = True
                break
            chunk.append(task)
        return chunk, f"{CURSOR_PREFIX}{chunk[-1].number}" if more else None

    def _cursor_place(self, cursor: Any) -> int:
        """The creation number a cursor this book gave names; raises `TaskError` for any other."""
        digits = cursor.removeprefix(CURSOR_PREFIX) if isinstance(cursor, str) else ""
        well_formed = digits != cursor and 0 < len(digits) <= 20 and digits.isascii() and digits.isdigit()
        if not well_formed or not 0 < int(digits) <= self.created_count:
            raise TaskError("Invalid cursor for tasks/list")
        return int(digits)
