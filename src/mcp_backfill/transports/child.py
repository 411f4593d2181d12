"""Starting the upstream server as a child process: its pipes and the spawn, with the stdlib alone.

Apart from the stdio transport (which needs asyncio and anyio) so that the stdio wrapper can start
its upstream before it imports the relay: the server's own start (an interpreter, `npx`, a JVM)
then runs beside the proxy's instead of after it. `stdio.spawn_upstream` adopts the child, and
`HeldSignals` keeps a stop signal that comes meanwhile for the front to act on.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any

from mcp_backfill.errors import cannot_start
from mcp_backfill.transports.guard import GUARD

PIPE_SIZE = 256 * 1024  # what enlarge_pipe asks for
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class HeldSignals:
    """SIGTERM, SIGINT and SIGHUP held while the stdio wrapper starts, before its event loop watches
    them (`take` hands them to the front, which then stops the upstream the usual way): by default
    a SIGTERM there would end the proxy at once and leave the child started early running. Held
    again (`install` once more) once the relay has ended, while the front finishes its shutdown:
    the proxy is stopping already. A second signal while one is held acts as it would have without
    holding (so a proxy stuck starting or stopping still yields to a repeated SIGTERM or Ctrl-C)."""

    def __init__(self) -> None:
        self._held: list[int] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> HeldSignals:
        """Hold the signals from now on; `restore` puts back the handlers there were before the
        first `install` (not those an event loop left in between)."""
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._hold)
            self._previous.setdefault(sig, previous)
        return self

    def take(self) -> list[int]:
        held, self._held = self._held, []
        return held

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _hold(self, signum: int, frame: object) -> None:
        if not self._held:
            self._held.append(signum)
            return
        self.restore()
        signal.raise_signal(signum)


class StartedChild:
    """A running child with pipes for its stdin and stdout (stderr is ours): the parent's ends."""

    __slots__ = ("_settled", "command", "from_child", "popen", "to_child")

    def __init__(
        self, popen: subprocess.Popen[bytes], to_child: int, from_child: int, command: Sequence[str]
    ) -> None:
        self.popen = popen
        self.to_child = to_child
        self.from_child = from_child
        self.command = tuple(command)
        self._settled = False  # adopted or discarded: `discard` has nothing (more) to do

    def adopt(self) -> None:
        """Take the child over: from now on its stopping is the adopter's (`discard` leaves it be)."""
        self._settled = True

    def discard(self, grace: float) -> None:
        """Stop the child unless it was adopted (or discarded already): it has been sent nothing, so
        at once stdin closed and SIGTERM to its group, SIGKILL after `grace` seconds; then reap it."""
        if self.let_go():
            self.reap(grace)

    def let_go(self) -> bool:
        """`discard`'s first step, which does not wait: close our ends of its pipes (now, while their
        numbers cannot have been reused) and SIGTERM its group; False if adopted or discarded."""
        if self._settled:
            return False
        self._settled = True
        for fd in (self.to_child, self.from_child):
            with suppress(OSError):
                os.close(fd)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        return True

    def reap(self, grace: float) -> None:
        """`discard`'s second step, after `let_go`: SIGKILL after `grace` seconds, and reap it (it
        waits: from an event loop, call it in a thread)."""
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace)
            GUARD.forget(self.popen.pid)
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        GUARD.forget(self.popen.pid)


def start_child(command: Sequence[str], env: Mapping[str, str], grace: float) -> StartedChild:
    """Start `command` in its own session (a signal to its group reaches its children too), with
    pipes we make ourselves: read and written like our own stdio, with room for a large message.
    Its group is stopped (SIGTERM, then SIGKILL after `grace` seconds) even if this process is
    killed before it could stop it (`guard.GUARD`).

    Raises `UpstreamStartError` (with what usually fixes it) when the command cannot be started."""
    made: list[int] = []
    try:
        child_stdin, to_child = _pipe(made)
        from_child, child_stdout = _pipe(made)
    except OSError as exc:  # out of descriptors (`serve` at its open-files limit)
        for fd in made:
            os.close(fd)
        raise cannot_start(command[0], str(exc.strerror or exc), None, not_found=False) from exc
    for fd in (to_child, from_child):
        enlarge_pipe(fd)
    GUARD.ready(grace)
    try:
        popen = subprocess.Popen(
            list(command),
            stdin=child_stdin,
            stdout=child_stdout,
            stderr=None,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        for fd in (to_child, from_child):
            os.close(fd)
        not_found = isinstance(exc, FileNotFoundError | NotADirectoryError | PermissionError)
        reason = str(exc.strerror or exc)
        raise cannot_start(command[0], reason, env.get("PATH"), not_found=not_found) from exc
    finally:
        os.close(child_stdin)
        os.close(child_stdout)
    GUARD.watch(popen.pid, grace)
    return StartedChild(popen, to_child, from_child, command)


def _pipe(made: list[int]) -> tuple[int, int]:
    """`os.pipe()`, its ends also added to `made` (to close them all if a later one fails)."""
    ends = os.pipe()
    made.extend(ends)
    return ends


def enlarge_pipe(fd: int) -> None:
    """Let a pipe hold 256 KiB (Linux; 64 KiB by default): fewer wake-ups per large message.

    Never shrinks a pipe. Not more: pipe capacity counts against a per-user quota, and past it
    every new pipe of the user's (ours and other programs') is cut to one page.
    """
    try:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE_SIZE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (ImportError, AttributeError, OSError):
        pass  # not Linux, not a pipe, or above the user's quota: the size it has works, only slower
