"""The audit log: one JSON line per sampling exchange, so a user can see what a server spent.

A line holds who asked (session, the client identity it belongs to, upstream request id), what it
cost (model, the usage Claude reported for the answer, the tokens charged to the budgets for every
call made, latency) and how it ended: answered, refused (before any call: by a limit, a budget,
validation, the user's approval, or because the client cancelled the request it was made for),
failed, timed out or cancelled, with the JSON-RPC error when there is one. Message contents
are left out unless `--audit-content` is given; known secrets are redacted from every line.

The file is opened when the proxy starts (an unusable path is a `ConfigError` then, not a failure
mid-session); a new file is created readable by its owner only (`FILE_MODE`: with `--audit-content`
it holds every prompt), an existing one keeps its mode. `record()` never blocks: lines go through
an in-memory queue to a writer task that appends and flushes them one by one in a worker thread, so
a slow disk never stalls the relay. The queue holds at most `QUEUE_LINES` lines: when the disk
cannot keep up, further lines are dropped (and counted in `dropped`, logged, and exported by the
sidecar's `/metrics`) rather than held in memory without bound; so are lines the file refused (a
full disk), and a line that cannot be written never stops the writer. Both fronts run the writer
(`auditing`) for as long as they serve; what is queued when they stop is written before the file is
closed.

Rotation: before each batch the path is compared with the open file, and a file renamed or removed
(logrotate's `create`) is followed by opening the path again; a file truncated in place
(`copytruncate`) needs nothing, every write going to its end (`O_APPEND`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

import anyio

from mcp_backfill.errors import ConfigError
from mcp_backfill.logs import Redactor, get_logger
from mcp_backfill.options import named
from mcp_backfill.shared_dirs import NOFOLLOW, foreign_file, in_shared_directory, link_refused

if TYPE_CHECKING:
    from mcp_backfill.sampling.spend import Ticket

__all__ = ["QUEUE_LINES", "AuditLog", "AuditRecord", "auditing"]

QUEUE_LINES = 10_000
"""Lines waiting for the disk, at most; beyond it lines are dropped and counted."""
DROP_LOG_EVERY = 1000
"""A dropped line is logged at warning for the first one and then every this many."""
FILE_MODE = 0o600
"""A new audit file's permissions: its owner's only (the umask may remove more, never add)."""
# A character UTF-8 cannot encode: a lone surrogate, which JSON strings (a server's request id, a
# prompt) may hold as `\ud800`.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

log = get_logger("audit")


@dataclass
class AuditRecord:
    """What is known about one sampling exchange, filled in as it progresses."""

    request_id: Any
    session: str | None
    client: str | None = None
    """The client identity the session belongs to (whose budgets it is charged to)."""
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    tools: int = 0
    usage: dict[str, int] | None = None
    stop_reason: str | None = None
    claude_request_id: str | None = None
    error: dict[str, Any] | None = None
    cancelled: bool = False
    failure: str = "failed"
    """How it ended when `error` is set: refused, failed or timed_out."""
    ticket: Ticket | None = None
    """The ledger's record of the request once it was admitted (what its calls were charged)."""

    @property
    def latency_ms(self) -> int:
        return round((time.monotonic() - self.started) * 1000)

    @property
    def calls(self) -> int:
        """Claude calls made for the request so far."""
        return self.ticket.calls if self.ticket is not None else 0

    @property
    def charged(self) -> dict[str, int]:
        """Tokens charged to the budgets for the request, by usage counter (empty: no call made)."""
        return dict(self.ticket.charged) if self.ticket is not None and self.ticket.calls else {}

    @property
    def outcome(self) -> str:
        """answered, refused, failed, timed_out or cancelled."""
        if self.cancelled:
            return "cancelled"
        return self.failure if self.error is not None else "answered"

    def fail(self, code: int, message: str, data: Any = None, outcome: str = "failed") -> None:
        self.failure = outcome
        self.error = {"code": code, "message": message}
        limit = data.get("limit") if isinstance(data, Mapping) else None
        if isinstance(limit, str):
            self.error["limit"] = limit
        reason = data.get("reason") if isinstance(data, Mapping) else None
        if isinstance(reason, str):  # why the user's approval was not had
            self.error["reason"] = reason
        status = data.get("status") if isinstance(data, Mapping) else None
        if isinstance(status, int):  # the API's HTTP status
            self.error["status"] = status

    def entry(self) -> dict[str, Any]:
        """The audit line (contents excluded)."""
        entry: dict[str, Any] = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "session": self.session,
            "client": self.client,
            "request_id": self.request_id,
            "model": self.model,
            "tools": self.tools,
            "usage": self.usage,
            "charged": self.charged or None,
            "calls": self.calls,
            "latency_ms": self.latency_ms,
            "stop_reason": self.stop_reason,
            "outcome": self.outcome,
        }
        if self.claude_request_id is not None:
            entry["claude_request_id"] = self.claude_request_id
        if self.error is not None:
            entry["error"] = self.error
        return entry


class AuditLog:
    """An append-only JSONL file fed from the event loop without blocking it."""

    def __init__(
        self,
        path: str,
        *,
        include_content: bool = False,
        secrets: Iterable[str] = (),
        queue_lines: int = QUEUE_LINES,
    ) -> None:
        self.path = path
        self.include_content = include_content
        self._redactor = Redactor(secrets)
        try:
            self._file: IO[bytes] = _open_for_appending(path)
        except _Refused as exc:
            raise ConfigError(f"{named('--audit-log')}: {exc}") from None
        except OSError as exc:
            raise ConfigError(
                f"{named('--audit-log')}: cannot open {path} for appending ({exc.strerror or exc})"
            ) from None
        self._send, self._receive = anyio.create_memory_object_stream[str](queue_lines)
        self.dropped = 0
        """Lines lost: the queue was full, or the file refused them."""
        self._reopen_failed: str | None = None
        self._torn = False
        """The last line was cut short (a full disk): the next one begins with a line break."""
        self._writing = threading.Lock()

    def record(self, record: AuditRecord, params: Any = None, result: Any = None) -> None:
        """Queue one exchange's line; returns at once (safe even in a cancelled task)."""
        entry = record.entry()
        if self.include_content:
            entry["params"] = params
            entry["result"] = result
        line = _writable(self._redactor.redact(json.dumps(entry, ensure_ascii=False, default=str)))
        try:
            self._send.send_nowait(line)
        except anyio.WouldBlock:
            self._lost(1, "the disk cannot keep up")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost(*self._write([line]))  # the writer has stopped (shutdown): write directly

    @asynccontextmanager
    async def running(self) -> AsyncIterator[AuditLog]:
        """Run the writer for the body's duration; lines queued by then are written before closing."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain)
                try:
                    yield self
                finally:
                    self._send.close()
        finally:
            with contextlib.suppress(OSError):  # nothing is buffered: nothing to lose
                self._file.close()

    async def _drain(self) -> None:
        async with self._receive:
            async for line in self._receive:
                batch = [line]
                while True:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                    except anyio.EndOfStream:
                        break
                self._lost(*await anyio.to_thread.run_sync(self._write, batch))

    def _write(self, lines: list[str]) -> tuple[int, str]:
        """Append `lines`, each flushed (in a worker thread); returns how many were lost and why.
        Nothing is raised: the writer task, and with it the proxy, outlives a full disk or an odd line.
        One call at a time: `record()` writes directly once the writer has stopped, which it may
        not have finished doing (and a reopened file replaces the one the other call writes to)."""
        with self._writing:
            return self._write_locked(lines)

    def _write_locked(self, lines: list[str]) -> tuple[int, str]:
        if self._file.closed:
            return len(lines), "the audit log is already closed"
        self._follow_rotation()
        lost, error = 0, ""
        for written, line in enumerate(lines):
            try:
                self._append((line + "\n").encode("utf-8"))
            except OSError as exc:  # the disk refused: the rest of the batch would fare no better
                return lost + len(lines) - written, str(exc)
            except ValueError as exc:  # not expected (`_writable`): this line is lost, not the writer
                lost, error = lost + 1, str(exc)
        return lost, error

    def _append(self, data: bytes) -> None:
        """Write `data` whole, or raise. Unbuffered: a line the disk refused is gone (and counted),
        not kept to be tried again with the next line and at the close. A line cut short by a full
        disk is ended by a line break before the next one, which stays a line of its own."""
        if self._torn:
            data = b"\n" + data
        view = memoryview(data)
        while view:
            count = self._file.write(view)
            if not count:  # not expected of a blocking file; never loop on it
                raise OSError(errno.EIO, "the audit log took nothing of a write")
            self._torn = True  # until the whole line is there
            view = view[count:]
        self._torn = False

    def _follow_rotation(self) -> None:
        """Reopen the path when the file there is no longer the one open (logrotate's `create`
        renamed it, or it was removed): a stat per batch, next to the writes. A path that cannot be
        opened (or is refused, `shared_dirs`) leaves the old file in use, with a warning."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        except OSError:  # cannot tell (a directory made unreadable): keep what is open
            return
        held = os.fstat(self._file.fileno())
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return
        try:
            reopened = _open_for_appending(self.path)
        except (OSError, _Refused) as exc:
            if self._reopen_failed is None:  # once per failure, not once per batch
                log.warning(
                    "audit log moved or removed, and its path cannot be opened: writing on to the old file",
                    extra={"path": self.path, "error": getattr(exc, "strerror", None) or str(exc)},
                )
            self._reopen_failed = str(exc)
            return
        self._reopen_failed = None
        old, self._file, self._torn = self._file, reopened, False
        with contextlib.suppress(OSError):  # flushed already, line by line
            old.close()
        log.info("audit log reopened (it was moved or removed)", extra={"path": self.path})

    def _lost(self, count: int, error: str) -> None:
        """Count lines that will never reach the file; log the first loss and then every
        `DROP_LOG_EVERY`."""
        if not count:
            return
        before, self.dropped = self.dropped, self.dropped + count
        if before == 0 or before // DROP_LOG_EVERY != self.dropped // DROP_LOG_EVERY:
            log.warning(
                "audit log lines dropped", extra={"path": self.path, "dropped": self.dropped, "error": error}
            )


class _Refused(Exception):
    """The audit path is not to be used: another user's file or link (`shared_dirs`)."""


def _open_for_appending(path: str) -> IO[bytes]:
    """`path` opened for appending, created with `FILE_MODE` if it does not exist. In a directory
    every user can write to, a link there is not followed and a file another user owns is refused
    (`shared_dirs`): they would read every line (with `--audit-content`, every prompt)."""
    shared = in_shared_directory(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    if shared is not None:  # and not blocking on a FIFO planted there
        flags |= NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if shared is not None and exc.errno == errno.ELOOP:
            raise _Refused(link_refused(path)) from None
        raise
    try:
        problem = foreign_file(fd, shared) if shared is not None else None
        if problem is not None:
            raise _Refused(f"{path}: {problem}")
        if shared is not None:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "ab", buffering=0)  # unbuffered: `AuditLog._append`
    except BaseException:
        os.close(fd)
        raise


def _writable(line: str) -> str:
    """`line` with each lone surrogate as its JSON escape (`\\ud800`), which UTF-8 can encode and
    which reads back as the same string (the secrets were redacted before, in the text as it was)."""
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", line)


@asynccontextmanager
async def auditing(audit: AuditLog | None) -> AsyncIterator[None]:
    """Run the audit log's writer (if there is one) for the body's duration."""
    if audit is None:
        yield
        return
    async with audit.running():
        yield
