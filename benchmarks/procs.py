"""Processes the scenarios start: command lines, environments, memory readings, log files."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, TextIO

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PYTHON = sys.executable
# A syntactically plausible key for the fake API; the real API is never reached from a benchmark.
BENCH_API_KEY = "sk-ant-bench-not-a-real-key"
# Nothing listens here: pass-through scenarios never sample, so the provider is never called.
UNUSED_API_URL = "http://127.0.0.1:9"


def python_script(path: Path, *args: str) -> list[str]:
    return [PYTHON, str(path), *args]


def raw_echo_command() -> list[str]:
    return python_script(BENCH / "servers" / "raw_echo.py")


def sdk_server_command() -> list[str]:
    return python_script(BENCH / "servers" / "sdk_server.py")


def forwarder_command(upstream: Sequence[str]) -> list[str]:
    """The bare byte forwarder (the floor for any process in between) in front of `upstream`."""
    return python_script(BENCH / "servers" / "forwarder.py", *upstream)


def proxy_command(upstream: Sequence[str], *options: str) -> list[str]:
    """The proxy as users run it (default provider: anthropic), in front of `upstream`."""
    return [PYTHON, "-m", "mcp_backfill", *options, "--", *upstream]


def bench_env(api_url: str = UNUSED_API_URL) -> dict[str, str]:
    """Our environment without real credentials or proxy settings, pointed at a local API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "MCP_BACKFILL_"))}
    env.update(ANTHROPIC_API_KEY=BENCH_API_KEY, ANTHROPIC_BASE_URL=api_url)
    return env


def proc_status(pid: int) -> dict[str, int]:
    """The `Vm*`/`Rss*` lines of /proc/<pid>/status, in bytes."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key.startswith(("Vm", "Rss")) and rest.strip().endswith("kB"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def rss(pid: int) -> int:
    return proc_status(pid)["VmRSS"]


def peak_rss(pid: int) -> int:
    return proc_status(pid)["VmHWM"]


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when the kernel refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far (all threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def waits(pid: int) -> int:
    """How often `pid`'s main thread has waited for something to do (its voluntary context switches:
    an event loop's waits for I/O)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key == "voluntary_ctxt_switches":
                return int(rest)
    raise RuntimeError(f"/proc/{pid}/status counts no voluntary context switches")


# The longest wait for a process to go quiet (the anthropic SDK's import takes 0.8-3.6 s).
QUIET_TIMEOUT = 30.0


def wait_until_quiet(pid: int, timeout: float = QUIET_TIMEOUT) -> None:
    """Wait until `pid` uses under 10% of a core for half a second (at most `timeout`).

    A proxy whose client cannot sample builds the Claude client in the background from the
    handshake on (the warm-up); the scenarios that measure steady pass-through wait for that to end,
    as it would long before a user's steady state (in a `--quick` run it would span every sample).
    """
    deadline = time.monotonic() + timeout
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < 0.05:
            return
        last = now


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc/<pid>/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def proxy_children() -> list[int]:
    """The pids of this process's children that run mcp_backfill (for clients that spawn it themselves)."""
    found = []
    for pid in children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"mcp_backfill" in cmdline.read():
                    found.append(pid)
        except OSError:
            continue
    return found


class LogDir:
    """Where the processes of one run write their stderr, kept for a post-mortem when a scenario fails."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="mcp-backfill-bench-"))
        self._count = 0

    def open(self, name: str) -> IO[bytes]:
        self._count += 1
        return (self.path / f"{self._count:03d}-{name}.log").open("wb")

    def open_text(self, name: str) -> TextIO:
        self._count += 1
        return (self.path / f"{self._count:03d}-{name}.log").open("w", encoding="utf-8")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Close stdin (the polite stop for a stdio server), then terminate, then kill."""
    if process.stdin is not None:
        with suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def started(
    argv: Sequence[str], logs: LogDir, name: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child with piped stdin/stdout and its stderr in the run's log directory, stopped on exit."""
    with logs.open(name) as stderr:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env if env is not None else bench_env(),
            cwd=ROOT,
            bufsize=0,
        )
        try:
            yield process
        finally:
            stop_process(process)
            if process.stdout is not None:
                process.stdout.close()
