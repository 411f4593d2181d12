"""The upstream's process groups stopped even when the proxy is killed outright (SIGKILL, the OOM killer).

The proxy stops each child's process group itself as it stops, but nothing of it runs after a
SIGKILL: a server that does not read its stdin (so never sees it end), one that ignores its end, or
a helper a server left in its group, would run on as an orphan. So one small watcher process per
proxy (`GroupGuard`), in a session of its own, is told each group the proxy starts and stops
through a pipe only the proxy holds open. Its end (the proxy gone, however) has the watcher SIGTERM
the groups still registered, and SIGKILL what is left of them after the grace. Stdlib alone (see
`child`); POSIX only (elsewhere there are no process groups to stop and `GroupGuard` does nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import suppress

# Run as `python -I -S -c WATCHER FD GRACE`: no site, no environment, so it starts in milliseconds.
WATCHER = """
import os, signal, sys, time
fd, grace = int(sys.argv[1]), float(sys.argv[2])
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
groups, rest = set(), b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except InterruptedError:
        continue
    except OSError:
        break
    if not chunk:
        break
    *lines, rest = (rest + chunk).split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
def signal_groups(sig):
    for pgid in list(groups):
        try:
            os.killpg(pgid, sig)
        except OSError:
            groups.discard(pgid)
signal_groups(signal.SIGTERM)
deadline = time.monotonic() + grace
while groups and time.monotonic() < deadline:
    time.sleep(0.05)
    signal_groups(0)
signal_groups(signal.SIGKILL)
"""


class GroupGuard:
    """The watcher of this process's children's groups, started before the first one (`ready`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: int | None = None
        self._failed = False

    def ready(self, grace: float) -> None:
        """Start the watcher now, if it is not running: before a child is started, so that a proxy
        killed while it starts one leaves only the instant between the child's start and `watch`
        unguarded, not the watcher's own start (a few milliseconds)."""
        with self._lock:
            if self._pipe is None and not self._failed:
                self._start(grace)

    def watch(self, pgid: int, grace: float) -> None:
        """Have the group `pgid` stopped should this process end without stopping it (`forget`)."""
        self.ready(grace)
        with self._lock:
            self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int) -> None:
        """The group `pgid` has ended (or been stopped): not the watcher's to stop any more."""
        with self._lock:
            self._send(b"-%d\n" % pgid)

    def _start(self, grace: float) -> None:
        if os.name != "posix":
            self._failed = True
            return
        try:
            reading, writing = os.pipe()
        except OSError:
            return  # out of descriptors: tried again with the next child
        try:
            subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", WATCHER, str(reading), repr(max(grace, 0.0))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # never the protocol's stdout
                stderr=subprocess.DEVNULL,  # nor the client's stderr held open after the proxy's end
                pass_fds=(reading,),
                env=_bare_environment(),
                start_new_session=True,  # out of reach of a signal to the proxy's group
            )
        except OSError:
            os.close(writing)
            return  # tried again with the next child; the proxy stops its children as it stops
        finally:
            os.close(reading)
        os.set_blocking(writing, False)  # a watcher that stopped reading never holds up the proxy
        self._pipe = writing

    def _send(self, line: bytes) -> None:
        if self._pipe is None:
            return
        with suppress(OSError):  # the watcher is gone (or stopped, its pipe full): nothing to tell
            os.write(self._pipe, line)


def _bare_environment() -> dict[str, str]:
    """What the interpreter may need to start, and nothing else: none of the proxy's credentials
    (an environment stays readable in /proc as long as its process runs)."""
    keep = ("PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "SYSTEMROOT")
    return {name: os.environ[name] for name in keep if name in os.environ}


GUARD = GroupGuard()
