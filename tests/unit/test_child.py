"""The upstream child: started with the stdlib alone, adopted by the event loop, discarded unadopted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from mcp_backfill.errors import UpstreamStartError
from mcp_backfill.transports import child as child_module
from mcp_backfill.transports.child import HeldSignals, StartedChild, start_child
from mcp_backfill.transports.guard import GUARD, GroupGuard
from mcp_backfill.transports.stdio import ChildProcess, spawn_upstream
from tests.harness import pid_alive

pytestmark = pytest.mark.anyio

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
IGNORES_SIGTERM = [
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(60)",
]


async def test_waiters_see_the_exit_status_and_one_cancelled_waiter_leaves_the_others() -> None:
    child = start_child(SLEEPER, os.environ, 1.0)
    process = ChildProcess(child.popen, grace=1.0)
    statuses: list[int] = []

    async def wait() -> None:
        statuses.append(await process.wait())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            tg.start_soon(wait)
            with anyio.move_on_after(0.05) as scope:
                await process.wait()
            assert scope.cancelled_caught
            assert process.returncode is None
            process.send_signal(signal.SIGTERM)
        assert statuses == [-signal.SIGTERM, -signal.SIGTERM]
        assert process.returncode == -signal.SIGTERM
        assert await process.wait() == -signal.SIGTERM  # and again, once it has exited
    finally:
        child.discard(1.0)


async def test_an_adopted_child_is_stopped_by_its_adopter_and_not_discarded_twice() -> None:
    child = start_child(["cat"], os.environ, 1.0)
    async with spawn_upstream(["cat"], os.environ, 1 << 20, grace=5.0, started=child) as upstream:
        assert upstream.pid == child.popen.pid
        await upstream.channel.send(b'{"jsonrpc":"2.0","method":"ping"}\n')
        assert await upstream.channel.receive() == b'{"jsonrpc":"2.0","method":"ping"}'
    assert child.popen.returncode == 0  # cat saw its stdin end
    child.discard(5.0)  # what the front's owner does afterwards: nothing, it was adopted


# An upstream start cancelled while its stdout pipe connects (a 2026-07-28 hub stopped as it
# starts, a shutdown), then another upstream started at once: its pipes get the descriptor numbers
# the first gave back. Run as the proxy runs (uvloop) in a process of its own: the descriptor closed
# under the other session made libuv abort the whole sidecar.
INTERRUPTED_START = textwrap.dedent(
    """
    import gc, os, sys
    import anyio
    from mcp_backfill.transports.stdio import spawn_upstream

    SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
    ECHO = [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.readline()); sys.stdout.flush()"]

    async def main() -> None:
        kept: list[BaseException] = []
        scope = anyio.CancelScope()

        async def first() -> None:
            with scope:
                try:
                    async with spawn_upstream(SLEEPER, dict(os.environ), 1 << 20, 0.5):
                        await anyio.sleep_forever()
                except BaseException as exc:
                    kept.append(exc)  # a logged error's traceback keeps the start's frames a while
                    raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.lowlevel.checkpoint()  # the start now waits for the child's stdout to connect
            scope.cancel()
        async with spawn_upstream(ECHO, dict(os.environ), 1 << 20, 0.5) as second:
            kept.clear()
            gc.collect()  # whatever the interrupted start left behind goes now
            await second.channel.send(b'{"jsonrpc":"2.0","method":"ping"}')
            print(await second.channel.receive(), flush=True)

    anyio.run(main, backend_options={"use_uvloop": sys.argv[1] == "uvloop"})
    """
)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_start_cancelled_while_connecting_leaves_no_descriptor_to_close_later(loop: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_START, loop], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == 'b\'{"jsonrpc":"2.0","method":"ping"}\'\n'


def test_an_unadopted_child_is_terminated_and_reaped() -> None:
    child = start_child(SLEEPER, os.environ, 1.0)
    pid = child.popen.pid
    child.discard(5.0)
    assert child.popen.returncode == -signal.SIGTERM
    assert not pid_alive(pid)
    for fd in (child.to_child, child.from_child):
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


def test_an_unadopted_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    child = start_child(IGNORES_SIGTERM, os.environ, 1.0)
    with os.fdopen(os.dup(child.from_child), "rb") as out:
        assert out.readline() == b"ready\n"  # its handler is in place
    child.discard(0.2)
    assert child.popen.returncode == -signal.SIGKILL


def test_a_command_that_cannot_start_says_what_fixes_it_and_leaves_no_descriptor() -> None:
    GUARD.ready(1.0)  # the watcher's pipe is this process's, whatever becomes of the child
    before = set(os.listdir("/proc/self/fd"))
    hint = r"cannot start upstream 'no-such-server-xyz'.*give its absolute path"
    with pytest.raises(UpstreamStartError, match=hint):
        start_child(["no-such-server-xyz"], {"PATH": "/nonexistent"}, 1.0)
    assert set(os.listdir("/proc/self/fd")) == before


def test_the_watcher_runs_before_the_first_child_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy killed while it started its first upstream left that upstream unguarded for as long
    as the watcher took to start (a few milliseconds after the child's): an orphan, should it ignore
    its stdin's end. The watcher is now started first."""
    guard = GroupGuard()
    monkeypatch.setattr(child_module, "GUARD", guard)
    watcher_up_at_start: list[bool] = []
    real_popen = subprocess.Popen

    def popen(argv: list[str], *args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        if argv == SLEEPER:
            watcher_up_at_start.append(guard._pipe is not None)
        return real_popen(argv, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    child = start_child(SLEEPER, os.environ, 1.0)
    monkeypatch.undo()
    try:
        assert watcher_up_at_start == [True]
    finally:
        child.discard(5.0)
        if guard._pipe is not None:
            os.close(guard._pipe)  # its watcher ends with it


def test_the_child_gets_its_own_session_and_pipes_for_stdin_and_stdout() -> None:
    child: StartedChild = start_child(
        [sys.executable, "-c", "import os, sys; print(os.getsid(0), sys.stdin.read())"], os.environ, 1.0
    )
    os.write(child.to_child, b"hello")
    os.close(child.to_child)
    with os.fdopen(child.from_child, "rb") as out:
        sid, text = out.read().split()
    assert (int(sid), text) == (child.popen.pid, b"hello")
    assert child.popen.wait(30) == 0


def test_a_stop_signal_is_held_and_a_second_one_acts_as_it_would_have() -> None:
    # Python's own Ctrl-C handler, whatever a test before this one in the same worker left there.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        held = HeldSignals().install()
        try:
            signal.raise_signal(signal.SIGINT)  # held: no KeyboardInterrupt
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)  # a second one: Ctrl-C as usual
            assert signal.getsignal(signal.SIGINT) is before  # restored by the second
            assert held.take() == [signal.SIGINT]
            assert held.take() == []
        finally:
            held.restore()
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, outer)


def test_held_signals_installed_again_restore_the_handlers_from_before_the_first_install() -> None:
    """The stdio front installs them again once its relay has ended, over the handlers its event
    loop left behind (SIG_DFL): `restore`, and a second signal, go back to the ones from before."""
    outer = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under `nohup`
    try:
        held = HeldSignals().install()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # what an event loop's signal receiver leaves
        held.install()
        held.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        held.install()
        signal.raise_signal(signal.SIGHUP)  # held
        signal.raise_signal(signal.SIGHUP)  # a second: as it would have been, ignored
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, outer)


# A start refused for want of descriptors (`serve` at its open-files limit): the first pipe made,
# the second refused. Run in a process of its own, whose limit it lowers.
OUT_OF_DESCRIPTORS = textwrap.dedent(
    """
    import os, resource, sys
    from mcp_backfill.errors import UpstreamStartError
    from mcp_backfill.transports.child import start_child

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    fillers = []
    while True:  # every descriptor taken ...
        try:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    for fd in fillers[-3:]:  # ... but three: room for one pipe (and a look at /proc), not two
        os.close(fd)
    del fillers[-3:]
    before = sorted(os.listdir("/proc/self/fd"))
    try:
        start_child(["true"], os.environ, 1.0)
    except UpstreamStartError as exc:
        print("refused:", exc)
    after = sorted(os.listdir("/proc/self/fd"))
    print("leaked:", len(after) - len(before))
    """
)


def test_a_start_refused_for_want_of_descriptors_says_so_and_leaves_none_behind() -> None:
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused: cannot start upstream" in done.stdout
    assert "Too many open files" in done.stdout
    assert "PATH" not in done.stdout  # no hint that does not apply
    assert "leaked: 0" in done.stdout


# The same interrupted start, of a child that ignores SIGTERM (inherited: ignored from its first
# instruction): stopping it takes the grace, which must not be spent with the event loop standing
# still (in `serve`, every other session's).
INTERRUPTED_START_OF_A_STUBBORN_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    import anyio
    from mcp_backfill.transports.stdio import spawn_upstream

    SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the child inherits it

    async def main() -> None:
        gaps = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await anyio.sleep(0.02)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        scope = anyio.CancelScope()

        async def first() -> None:
            with scope:
                async with spawn_upstream(SLEEPER, dict(os.environ), 1 << 20, 1.0):
                    await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            await anyio.sleep(0.1)
            async with anyio.create_task_group() as starting:
                starting.start_soon(first)
                await anyio.lowlevel.checkpoint()  # the start waits for the child's stdout to connect
                scope.cancel()
            tg.cancel_scope.cancel()
        print(f"longest stall: {max(gaps):.2f}", flush=True)

    anyio.run(main, backend_options={"use_uvloop": sys.argv[1] == "uvloop"})
    """
)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_cancelled_start_stops_its_child_without_stalling_the_event_loop(loop: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_START_OF_A_STUBBORN_CHILD, loop],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    stall = float(done.stdout.split(":")[1])
    assert stall < 0.5, done.stdout  # the grace (1 s) then SIGKILL were waited out in a thread


# A process that registers two sleepers' groups with the watcher, forgets the first, prints both
# pids, and waits to be killed.
WATCHING = textwrap.dedent(
    """
    import subprocess, sys, time
    from mcp_backfill.transports.guard import GUARD

    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        for _ in range(2)
    ]
    for sleeper in sleepers:
        GUARD.watch(sleeper.pid, 0.5)
    GUARD.forget(sleepers[0].pid)
    print(*(sleeper.pid for sleeper in sleepers), flush=True)
    time.sleep(60)
    """
)


def test_the_watcher_stops_the_groups_still_registered_when_its_process_is_killed() -> None:
    """SIGKILL the process: the group it still had registered is stopped by the watcher, the one it
    had forgotten (ended, its number free to be reused by another) is left alone."""
    host = subprocess.Popen([sys.executable, "-c", WATCHING], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    forgotten, watched = (int(pid) for pid in host.stdout.readline().split())
    try:
        host.kill()
        host.wait(30)
        deadline = time.monotonic() + 20
        while running(watched) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(watched)
        assert running(forgotten)
    finally:
        for pid in (forgotten, watched):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        host.stdout.close()


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow, or never come)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
