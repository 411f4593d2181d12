"""Process hygiene of the stdio wrapper: stdout discipline, bad input, lifecycle, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import pytest

from tests.harness import (
    TEST_API_KEY,
    RawSession,
    initialize_params,
    pid_alive,
    proxy_argv,
    proxy_env,
    proxy_url_argv,
    python_server,
    raw_proxy,
)

pytestmark = pytest.mark.anyio

ECHO = python_server("echo_server.py")


def mock_proxy(*options: str, upstream: list[str] = ECHO) -> list[str]:
    return proxy_argv("--provider", "mock", *options, upstream=upstream)


def upstream_pid(stderr: str) -> int:
    match = re.search(r"relaying .*pid=(\d+)", stderr)
    assert match, stderr
    return int(match.group(1))


async def wait_for_log(read: Callable[[], str], pattern: str, timeout: float = 10) -> str:
    """Poll the proxy's stderr until `pattern` shows up."""
    with anyio.fail_after(timeout):
        while not re.search(pattern, text := read()):
            await anyio.sleep(0.05)
    return text


async def test_garbage_from_the_client_gets_a_parse_error_and_the_session_continues() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.send_raw(b"this is not json\n")
        error = await session.recv()
        assert error["id"] is None
        assert error["error"]["code"] == -32700
        await session.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')  # truncated JSON
        assert (await session.recv())["error"]["code"] == -32700
        response = await session.request(2, "initialize", initialize_params())
        assert response["result"]["echo"]["capabilities"]["sampling"] == {"tools": {}}


async def test_deep_nesting_and_lone_surrogates_do_not_crash_the_proxy() -> None:
    """Found by the codec's property tests: either one line used to end the process with a traceback."""
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.send_raw(b"[" * 5000 + b"]" * 5000 + b"\n")
        error = await session.recv()
        assert (error["id"], error["error"]["code"]) == (None, -32700)
        assert "nested too deeply" in error["error"]["message"]
        # A lone surrogate is valid JSON (as an escape); the id and the echo must come back intact.
        await session.send_raw(b'{"jsonrpc":"2.0","id":"a\\ud800b","method":"initialize","params":{}}\n')
        answer = await session.recv()
        assert answer["id"] == "a\ud800b"
        assert answer["result"]["echo"]["capabilities"]["sampling"] == {"tools": {}}
        response = await session.request(2, "initialize", initialize_params())
        assert response["result"]["echo"]["capabilities"]["sampling"] == {"tools": {}}
        assert session.process.returncode is None


LIMIT = 4096


def padded_request(request_id: object, size: int) -> dict[str, object]:
    """A request whose compact JSON is exactly `size` bytes."""
    request: dict[str, object] = {"jsonrpc": "2.0", "id": request_id, "method": "pad", "params": {"p": ""}}
    overhead = len(json.dumps(request, separators=(",", ":")))
    request["params"] = {"p": "y" * (size - overhead)}
    return request


async def test_oversized_client_request_is_refused_with_its_id() -> None:
    async with raw_proxy(mock_proxy("--max-message-bytes", str(LIMIT)), proxy_env()) as session:
        await session.send(padded_request("big-1", 10_000))
        error = await session.recv()
        assert error["id"] == "big-1"
        assert error["error"]["code"] == -32600
        assert "--max-message-bytes" in error["error"]["message"]
        response = await session.request(2, "small", {})
        assert response["result"]["echo"]["method"] == "small"


async def test_oversized_upstream_response_becomes_an_error_for_the_waiting_request() -> None:
    async with raw_proxy(mock_proxy("--max-message-bytes", str(LIMIT)), proxy_env()) as session:
        # The request fits; the echo server's answer (request + envelope) does not.
        request = padded_request(5, LIMIT - 10)
        await session.send(request)
        error = await session.recv()
        assert error["id"] == 5
        assert error["error"]["code"] == -32603
        assert "too large" in error["error"]["message"]
        response = await session.request(6, "small", {})
        assert response["result"]["echo"]["method"] == "small"


async def test_oversized_client_response_becomes_an_error_for_the_server() -> None:
    async with raw_proxy(mock_proxy("--max-message-bytes", str(LIMIT)), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params({"roots": {}}))
        ask = {"method": "roots/list", "id": 9}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": ask})
        await session.recv_until(lambda m: m.get("method") == "roots/list")
        huge = {"jsonrpc": "2.0", "id": 9, "result": {"roots": [{"uri": "file:///" + "r" * 10_000}]}}
        await session.send(huge)
        final, _ = await session.recv_until(lambda m: m.get("id") == 2)
    client_response = final["result"]["client_response"]
    assert client_response["id"] == 9
    assert "too large" in client_response["error"]["message"]


async def test_garbage_from_the_upstream_is_logged_not_forwarded() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        response = await session.request(1, "test/garbage", {})
        assert response["result"]["echo"]["method"] == "test/garbage"
        log = await wait_for_log(session.stderr, "malformed message from upstream")
    assert "malformed message from upstream" in log


async def test_a_malformed_message_with_a_readable_id_is_answered_under_that_id() -> None:
    """A request that is not JSON got a parse error with a null id, and an answer that is not JSON
    was dropped: either way the request it was, or answered, waited for ever."""
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.send_raw(b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"\xff"}}\n')
        error = await session.recv()
        assert (error["id"], error["error"]["code"]) == (4, -32700)
        error = await session.request(5, "test/malformed_answer", {})
        assert error["error"]["code"] == -32603
        assert "not valid JSON" in error["error"]["message"]
        response = await session.request(6, "small", {})
        assert response["result"]["echo"]["method"] == "small"


async def test_upstream_stderr_passes_through() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "test/stderr", {"text": "hello from the upstream's stderr"})
        await wait_for_log(session.stderr, "hello from the upstream's stderr")


async def test_client_eof_closes_the_upstream_and_exit_status_is_the_upstreams() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        pid = upstream_pid(await wait_for_log(session.stderr, r"relaying .*pid="))
        await session.close_stdin()
        assert await session.wait() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_client_that_stopped_reading_for_good_ends_the_session_like_eof(tmp_path: Path) -> None:
    """The client's end of the proxy's stdout is gone (it crashed, leaving its stdin's write end to
    a process it started): every answer failed to go out and was dropped, yet the proxy relayed each
    later request to the upstream (a `tools/call` the server may answer with a billed Claude call),
    and it and the upstream ran until stdin's end, which may never come."""
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        proxy = subprocess.Popen(
            mock_proxy("--shutdown-grace", "1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=proxy_env(),
        )
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params()}
        proxy.stdin.write(json.dumps(hello).encode() + b"\n")
        proxy.stdin.flush()
        assert json.loads(proxy.stdout.readline())["id"] == 1
        pid = upstream_pid(log.read_text())
        proxy.stdout.close()  # the client reads no more; its stdin stays open
        proxy.stdin.write(b'{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n')
        proxy.stdin.flush()
        with anyio.fail_after(20):
            while proxy.poll() is None:
                await anyio.sleep(0.05)
        assert proxy.returncode == 0, log.read_text()[-3000:]
        assert not pid_alive(pid)
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()
        with suppress(BrokenPipeError):
            proxy.stdin.close()


async def test_upstream_exit_ends_the_proxy_with_its_status() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/exit", "params": {"code": 3}})
        assert await session.wait() == 3
        assert "upstream server exited" in session.stderr()


async def test_upstream_crash_answers_pending_client_requests_with_errors() -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        pid = upstream_pid(await wait_for_log(session.stderr, r"relaying .*pid="))
        # The echo server now waits for our answer to its roots/list, so request 2 stays pending.
        await session.send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "test/ask_client",
                "params": {"method": "roots/list", "id": 9},
            }
        )
        await session.recv_until(lambda m: m.get("method") == "roots/list")
        os.kill(pid, signal.SIGKILL)
        error, _ = await session.recv_until(lambda m: m.get("id") == 2)
        assert error["error"]["code"] == -32603
        assert "exited" in error["error"]["message"]
        assert await session.wait() == 128 + signal.SIGKILL


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signals_shut_down_cleanly(sig: signal.Signals) -> None:
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        pid = upstream_pid(session.stderr())
        session.process.send_signal(sig)
        assert await session.wait() == 0  # the echo server exits cleanly when its stdin closes
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


STUBBORN = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "sys.stdin.close()\n"
    "print('stubborn up', file=sys.stderr, flush=True)\n"
    "time.sleep(120)\n",
]


async def test_stubborn_upstream_is_killed_after_the_grace_period() -> None:
    argv = mock_proxy("--shutdown-grace", "0.3", upstream=STUBBORN)
    async with raw_proxy(argv, proxy_env()) as session:
        await wait_for_log(session.stderr, "stubborn up")
        started = time.monotonic()
        await session.close_stdin()
        assert await session.wait(timeout=10) == 128 + signal.SIGKILL
        assert time.monotonic() - started < 5
        log = session.stderr()
    assert "SIGTERM" in log
    assert "SIGKILL" in log


DEAF = [
    sys.executable,
    "-c",
    "import sys, time\nprint('deaf up', file=sys.stderr, flush=True)\ntime.sleep(120)\n",
]


async def test_an_upstream_that_stops_reading_does_not_hold_up_shutdown() -> None:
    """Requests that fill the pipe to an upstream that never reads its stdin: the proxy still stops
    within its grace steps, without a traceback (a writer thread's part in this is in
    `tests/unit/test_pipe_writer.py`)."""
    argv = mock_proxy("--shutdown-grace", "0.3", upstream=DEAF)
    big = "x" * 300_000
    async with raw_proxy(argv, proxy_env()) as session:
        await wait_for_log(session.stderr, "deaf up")

        async def flood() -> None:
            with suppress(anyio.BrokenResourceError):  # the proxy is gone before all of it is sent
                for n in range(40):  # 12 MB: far more than the pipes between hold
                    request = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"text": big}}
                    await session.send(request)

        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            await anyio.sleep(1)  # the upstream's pipe is full and the proxy waits on it
            started = time.monotonic()
            session.process.send_signal(signal.SIGTERM)
            status = await session.wait(timeout=15)
            assert status == 128 + signal.SIGTERM, session.stderr()[-3000:]
        assert time.monotonic() - started < 10
        assert "Traceback" not in session.stderr()


DEAF_WITH_PID = [
    sys.executable,
    "-c",
    "import os, sys, time\nprint('deaf up', os.getpid(), file=sys.stderr, flush=True)\ntime.sleep(120)\n",
]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
async def test_a_signal_while_the_proxy_starts_stops_its_upstream_as_usual(signum: signal.Signals) -> None:
    """The upstream is started before the proxy has loaded its relay (their starts overlap), so a
    signal can come while the proxy is still starting: it is held until the proxy watches signals,
    then the upstream is stopped as always (here one that ignores the end of its stdin: SIGTERM after
    the grace), and the proxy exits with its status; nothing outlives the proxy."""
    argv = mock_proxy("--shutdown-grace", "0.3", upstream=DEAF_WITH_PID)
    async with raw_proxy(argv, proxy_env()) as session:
        started = re.search(r"deaf up (\d+)", await wait_for_log(session.stderr, r"deaf up \d+", timeout=30))
        assert started is not None
        pid = int(started.group(1))
        session.process.send_signal(signum)  # nearly always before the proxy's own start is over
        status = await session.wait(timeout=30)
        assert status == 128 + signal.SIGTERM, session.stderr()[-3000:]
        assert "signal received; shutting down" in session.stderr()
        assert not pid_alive(pid)


async def test_stdout_carries_only_json_rpc() -> None:
    async with raw_proxy(mock_proxy("--log-level", "debug"), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.request(2, "test/stderr", {"text": "noise"})
        await session.request(3, "test/garbage", {})
        await session.close_stdin()
        await session.wait()
        assert session.process.stdout is not None
        rest = b""
        with anyio.move_on_after(2):
            async for chunk in session.process.stdout:
                rest += chunk
    for line in rest.splitlines():
        assert line.startswith(b"{"), line


def test_missing_api_key_fails_at_startup_with_a_clear_message() -> None:
    result = subprocess.run(
        proxy_argv(upstream=ECHO), env=proxy_env(), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "ANTHROPIC_API_KEY" in result.stderr
    assert "--provider mock" in result.stderr


def test_a_bad_environment_value_is_refused_naming_the_allowed_values() -> None:
    console_script = Path(sys.executable).with_name("mcp-backfill")  # the venv's entry point
    result = subprocess.run(
        [str(console_script), "--", "true"],
        env=proxy_env(MCP_BACKFILL_MODE="sometimes"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "MCP_BACKFILL_MODE" in result.stderr
    assert "fallback, always, off" in result.stderr
    assert "sometimes" in result.stderr


def test_a_state_store_url_it_cannot_use_is_refused_at_startup_without_its_password() -> None:
    result = subprocess.run(
        mock_proxy("--state-store", "redis://:s3cret@redis:abc/0", upstream=ECHO),
        env=proxy_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--state-store / MCP_BACKFILL_STATE_STORE" in result.stderr
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr


@pytest.mark.parametrize("front", ["stdio", "stdio with an audit log", "serve"])
def test_an_unusable_proxy_variable_for_the_http_upstream_is_refused_clearly(
    front: str, tmp_path: Path
) -> None:
    """An `HTTP_PROXY` the upstream's HTTP client cannot use is a usage error at startup naming the
    variable (not its value, which may hold a password). It was a traceback (inside an
    `ExceptionGroup` with `--audit-log`, whose writer ran around the upstream's start), and `serve`
    started, then failed each session with an internal error."""
    options = ["--provider", "mock"]
    if front == "serve":
        options = ["serve", *options, "--port", "0", "--allow-unauthenticated"]
    elif front == "stdio with an audit log":
        options += ["--audit-log", str(tmp_path / "audit.jsonl")]
    result = subprocess.run(
        proxy_url_argv(*options, url="http://127.0.0.1:9/mcp"),
        env=proxy_env(HTTP_PROXY="http://user:s3cret@proxy.example:bad"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "HTTP_PROXY is not a valid proxy URL" in result.stderr
    assert "--upstream-url / MCP_BACKFILL_UPSTREAM_URL" in result.stderr
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr


def test_unstartable_upstream_is_reported() -> None:
    result = subprocess.run(
        mock_proxy(upstream=["/nonexistent/server-binary"]),
        env=proxy_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 127
    assert "cannot start upstream" in result.stderr
    assert result.stdout == ""


ENV_REPORTER = [
    sys.executable,
    "-c",
    "import os, sys\n"
    "print('upstream sees key=' + repr(os.environ.get('ANTHROPIC_API_KEY')), file=sys.stderr, flush=True)\n",
]


async def test_api_key_is_not_passed_to_the_upstream_nor_logged() -> None:
    env = proxy_env("http://127.0.0.1:9", ANTHROPIC_API_KEY=TEST_API_KEY)
    argv = proxy_argv("--log-level", "debug", "--log-format", "json", upstream=ENV_REPORTER)
    async with raw_proxy(argv, env) as session:
        await session.wait()
        log = session.stderr()
    assert "upstream sees key=None" in log
    assert TEST_API_KEY not in log
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert {"ts", "level", "logger", "msg"} <= entries[0].keys()
    assert any(entry["msg"] == "relaying" and entry["provider"] == "anthropic" for entry in entries)


def running(pid: int) -> bool:
    """Is `pid` alive, not a zombie? (An orphan is reaped by PID 1, which in a container may never.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def leaving_a_helper(*, own_session: bool = False, stubborn: bool = False) -> list[str]:
    """The echo server, started by a shell that first leaves a helper behind holding the server's
    stdout (as a server's background helper, a language server or a browser, does): in the server's
    process group, or (`own_session`) out of it, beyond the reach of a signal to that group; or
    (`stubborn`) one that ignores SIGTERM and holds no pipe of the server's."""
    helper = "setsid sleep 60" if own_session else "sleep 60"
    if stubborn:
        helper = "(trap '' TERM; exec sleep 60) >/dev/null"
    server = " ".join(ECHO)
    return ["sh", "-c", f"{helper} & echo helper $! >&2; exec {server}"]


@asynccontextmanager
async def the_helper(session: RawSession) -> AsyncIterator[int]:
    """The pid of the helper `leaving_a_helper`'s server says it started, killed when the test ends."""
    found = re.search(r"helper (\d+)", await wait_for_log(session.stderr, r"helper \d+"))
    assert found is not None
    helper = int(found.group(1))
    try:
        yield helper
    finally:
        with suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


@pytest.mark.parametrize("own_session", [False, True], ids=["in-its-group", "in-its-own-session"])
async def test_a_helper_holding_the_upstreams_stdout_does_not_keep_the_proxy_up(own_session: bool) -> None:
    """The client leaves and the server exits, but a helper it left behind still holds its stdout:
    the proxy ends all the same (it waited for the end of that output as long as the helper lived,
    and ignored SIGTERM meanwhile), and a helper in the server's process group is stopped with the
    server instead of being left running."""
    argv = mock_proxy("--shutdown-grace", "0.5", upstream=leaving_a_helper(own_session=own_session))
    async with raw_proxy(argv, proxy_env()) as session, the_helper(session) as helper:
        await session.request(1, "initialize", initialize_params())
        await session.close_stdin()
        assert await session.wait(timeout=15) == 0, session.stderr()[-3000:]
        if not own_session:
            assert not running(helper)


async def test_a_crashed_upstreams_helper_does_not_leave_requests_waiting() -> None:
    """The server dies with a request in flight while a helper it left holds its stdout: the request
    is answered with an error and the proxy ends with the server's status, as without the helper."""
    argv = mock_proxy("--shutdown-grace", "0.5", upstream=leaving_a_helper(own_session=False))
    async with raw_proxy(argv, proxy_env()) as session, the_helper(session) as helper:
        await session.request(1, "initialize", initialize_params())
        pid = upstream_pid(await wait_for_log(session.stderr, r"relaying .*pid="))
        ask = {"method": "roots/list", "id": 9}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": ask})
        await session.recv_until(lambda m: m.get("method") == "roots/list")
        os.kill(pid, signal.SIGKILL)
        error, _ = await session.recv_until(lambda m: m.get("id") == 2)
        assert error["error"]["code"] == -32603
        assert await session.wait() == 128 + signal.SIGKILL
        assert not running(helper)


async def test_a_helper_that_ignores_sigterm_does_not_outlive_the_proxy() -> None:
    """The server's process group is stopped as the proxy stops (SIGTERM, then SIGKILL after the
    grace) before the proxy exits, even when nothing it relays waits for it."""
    argv = mock_proxy("--shutdown-grace", "0.5", upstream=leaving_a_helper(stubborn=True))
    async with raw_proxy(argv, proxy_env()) as session, the_helper(session) as helper:
        await session.request(1, "initialize", initialize_params())
        await session.close_stdin()
        assert await session.wait(timeout=15) == 0, session.stderr()[-3000:]
        assert not running(helper)


# Credentials a server is often given on its command line (a config's `args`): an option's value, a
# URL's password, a variable set for a container.
CREDENTIAL_ARGS = [
    "--api-key",
    "sk-upstream-SECRET-1",
    "--db=postgres://app:pw-SECRET-2@db/app",
    "-e",
    "GITHUB_TOKEN=ghp_SECRET3",
]


async def test_the_upstreams_credentials_on_its_command_line_are_not_logged() -> None:
    """The log line naming the upstream command (its stderr often ends up in a client's log file and
    from there in a bug report) showed every argument as given, credentials included."""
    argv = mock_proxy(upstream=[*ECHO, *CREDENTIAL_ARGS])
    async with raw_proxy(argv, proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.close_stdin()
        assert await session.wait() == 0
        log = session.stderr()
    assert "relaying" in log
    assert "--api-key" in log  # the command is still recognisable
    assert "GITHUB_TOKEN=***" in log
    assert "SECRET" not in log


# Started by the proxy and still running once it is gone: a server that reads nothing (so never sees
# its stdin end) and ignores SIGTERM, or a helper the server left behind that does.
OUTLIVERS = {
    "a-server-ignoring-eof": ["sh", "-c", "trap '' TERM; echo helper $$ >&2; exec sleep 60"],
    "a-servers-helper": leaving_a_helper(stubborn=True),
}


async def gone_within(pid: int, timeout: float) -> bool:
    with anyio.move_on_after(timeout):
        while running(pid):
            await anyio.sleep(0.05)
    return not running(pid)


@pytest.mark.parametrize("outliver", OUTLIVERS.values(), ids=OUTLIVERS.keys())
async def test_nothing_the_proxy_started_outlives_a_sigkill_of_the_proxy(outliver: list[str]) -> None:
    """SIGKILL leaves the proxy no chance to stop its upstream's process group: what it started ends
    all the same (SIGTERM, then SIGKILL after `--shutdown-grace`) instead of running on as orphans."""
    argv = mock_proxy("--shutdown-grace", "0.5", upstream=outliver)
    async with raw_proxy(argv, proxy_env()) as session, the_helper(session) as helper:
        await wait_for_log(session.stderr, r"relaying .*pid=")  # up (not killed as it starts)
        session.process.kill()
        assert await session.wait() == -signal.SIGKILL
        assert await gone_within(helper, 20), "still running after the proxy was killed"


@pytest.mark.parametrize("closed", ["2", "0"], ids=["stderr", "stdin"])
def test_a_proxy_started_with_a_standard_descriptor_closed_still_works(closed: str) -> None:
    """A launcher may start the proxy with stderr (or stdin) closed (`2>&-`): the descriptor's number
    went to the first pipe the proxy made, so its logs were written into a pipe of the upstream's
    (every request failed and the proxy aborted). With stderr closed the logs go nowhere and the
    session works; with stdin closed the session is an empty one, ended at once with status 0."""
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params()},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    script = f'exec "$@" {closed}<&-' if closed == "0" else f'exec "$@" {closed}>&-'
    done = subprocess.run(
        ["sh", "-c", script, "sh", *mock_proxy()],
        input="".join(json.dumps(line) + "\n" for line in lines).encode(),
        capture_output=True,
        env=proxy_env(),
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    if closed == "0":
        assert answers == []
    else:
        assert [answer.get("id") for answer in answers] == [1, 2]
        assert all("result" in answer for answer in answers), answers


def watchers_of(pid: int) -> list[int]:
    """The children of `pid` that run the group watcher (`python -I -S -c ...`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and cmdline[1:4] == [b"-I", b"-S", b"-c"]:
            found.append(int(entry))
    return found


async def test_the_group_watcher_is_not_given_the_proxys_credentials() -> None:
    """The watcher that stops the upstream's group after a SIGKILL of the proxy needs no secret:
    its environment (readable in /proc as long as it runs) holds none of the proxy's."""
    env = proxy_env("http://127.0.0.1:9", ANTHROPIC_API_KEY=TEST_API_KEY)
    async with raw_proxy(mock_proxy(), env) as session:
        await session.request(1, "initialize", initialize_params())
        [watcher] = watchers_of(session.process.pid)
        environ = Path(f"/proc/{watcher}/environ").read_bytes()
        await session.close_stdin()
        assert await session.wait() == 0
    assert TEST_API_KEY.encode() not in environ
    assert b"ANTHROPIC" not in environ
