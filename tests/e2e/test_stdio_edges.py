"""The stdio wrapper at its edges: a client that is slow to read, an upstream that stops reading,
dies mid-message or exits with messages still on their way. Whatever happens, every line on stdout
is one whole JSON-RPC message, none is lost, and every request gets an answer.

Each test runs the real proxy as a process in front of a small child program written for it (the
stdio review's findings: each test failed before its fix).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from mcp_backfill.protocol import INTERNAL_ERROR
from tests.harness import proxy_argv, proxy_env, python_server

ECHO_SERVER = python_server("echo_server.py")

# Notifications the upstream writes one at a time, each ~30 KB: the client's pipe (256 KiB) fills.
FILLER = """
import json, os, time
def note(kind, n, pad=0):
    message = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": {"kind": kind, "n": n, "pad": "x" * pad}}}
    return json.dumps(message, separators=(",", ":")).encode() + b"\\n"
for i in range(12):
    os.write(1, note("filler", i, 30_000))
    time.sleep(0.03)
"""


def child(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def start(tmp_path: Path, upstream: list[str], *options: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*DEFAULT_STOP_SIGNALS, *proxy_argv("--provider", "mock", *options, upstream=upstream)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr").open("wb"),
        env=proxy_env(),
    )


# The proxy starts with the stop signals' default dispositions, whatever the test runner was started
# with (`nohup` ignores SIGHUP; a background job of a non-interactive shell, SIGINT), set before an
# `exec` (which keeps them): what a held signal is given back to decides whether a second one ends
# the proxy.
DEFAULT_STOP_SIGNALS = [
    sys.executable,
    "-c",
    "import os, signal, sys\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])",
]


def whole_messages(out: bytes) -> list[Any]:
    """Every line of `out` as JSON (each must be one whole message, the last one ended too)."""
    *lines, rest = out.split(b"\n")
    assert rest == b"", f"stdout ends in the middle of a line ({len(rest)} bytes)"
    return [json.loads(line) for line in lines]


def test_a_burst_behind_a_full_client_pipe_is_delivered_whole(tmp_path: Path) -> None:
    """The writer thread wrote all it held in one `writev`; past 1,024 buffers (512 messages) the
    call failed, and every message it held was dropped without a word."""
    burst = (
        FILLER
        + """
data = b"".join(note("small", i) for i in range(1500))
os.write(1, data)
time.sleep(0.5)
os.write(1, note("end", 0))
while os.read(0, 65536):
    pass
"""
    )
    proxy = start(tmp_path, child(burst))
    assert proxy.stdout is not None
    try:
        time.sleep(3)  # the client reads nothing for a while: its pipe fills, the thread takes over
        out = b""
        deadline = time.monotonic() + 60
        while b'"kind":"end"' not in out and time.monotonic() < deadline:
            out += os.read(proxy.stdout.fileno(), 1 << 20)
    finally:
        assert proxy.stdin is not None
        proxy.stdin.close()
        proxy.wait(30)
    data = [message["params"]["data"] for message in whole_messages(out)]
    assert [d["n"] for d in data if d["kind"] == "filler"] == list(range(12))
    assert [d["n"] for d in data if d["kind"] == "small"] == list(range(1500))
    assert data[-1]["kind"] == "end"


def test_messages_on_their_way_when_the_upstream_exits_all_reach_a_slow_client(tmp_path: Path) -> None:
    """Stdout used to be closed under the writer thread at exit: messages lost, and half a line left."""
    proxy = start(tmp_path, child(FILLER + "\nraise SystemExit(0)\n"))
    assert proxy.stdout is not None
    time.sleep(3)  # the client is busy elsewhere; the upstream is done by then
    out = proxy.stdout.read()
    proxy.wait(30)
    assert [message["params"]["data"]["n"] for message in whole_messages(out)] == list(range(12))


def test_a_message_cut_off_as_the_client_send_is_cancelled_still_goes_out_whole(tmp_path: Path) -> None:
    """The upstream fills the client's pipe, asks for a sample (so the proxy asks the client for
    approval, a 30 KB question) and dies: the session ends and its tasks are cancelled, one of them in
    the middle of writing that question. Half of it used to stay on stdout, with the next message
    (the error for request 2) glued on."""
    upstream = """
    import json, os, sys, time
    def send(message):
        os.write(1, json.dumps(message, separators=(",", ":")).encode() + b"\\n")
    stdin = sys.stdin.buffer
    init = json.loads(stdin.readline())
    send({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": "2025-11-25",
          "capabilities": {}, "serverInfo": {"name": "S" * 30_000, "version": "1"}}})
    stdin.readline()  # notifications/initialized
    stdin.readline()  # the request it never answers
    for i in range(4):
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "data": "f" * 52_000}})
        time.sleep(0.05)
    send({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {
          "messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}], "maxTokens": 10}})
    time.sleep(1.0)
    os._exit(3)
    """
    proxy = start(tmp_path, child(upstream), "--approve", "elicit")
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    initialize = {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "slow-reader", "version": "0"},
    }
    for message in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "never"}},
    ):
        proxy.stdin.write(json.dumps(message).encode() + b"\n")
    proxy.stdin.flush()
    time.sleep(4)  # the client is busy; the upstream dies meanwhile
    out = proxy.stdout.read()
    assert proxy.wait(30) == 3
    proxy.stdin.close()
    assert 2 in [message.get("id") for message in whole_messages(out)]


@pytest.mark.parametrize("size", [1000, 100_000])
def test_an_answer_cut_off_by_the_upstream_dying_is_not_relayed(tmp_path: Path, size: int) -> None:
    """Its first part, unterminated at the end of the stream, was taken for a whole message; one of
    64 KiB or more (routed by its first bytes, undecoded) reached the client as the answer."""
    upstream = f"""
    import os, sys
    sys.stdin.buffer.readline()
    os.write(1, b'{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"' + b"x" * {size})
    os._exit(3)
    """
    proxy = start(tmp_path, child(upstream))
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "big"}}
    proxy.stdin.write(json.dumps(request).encode() + b"\n")
    proxy.stdin.flush()
    out = proxy.stdout.read()  # to the end: the proxy exits with its upstream
    assert proxy.wait(30) == 3
    proxy.stdin.close()
    [answer] = whole_messages(out)
    assert answer["id"] == 1
    assert "Upstream MCP server exited (status 3)" in answer["error"]["message"]
    assert "ended in the middle of a message" in (tmp_path / "stderr").read_text()


STOPS_READING = """
import json, os, sys, time
line = sys.stdin.buffer.readline()
os.write(1, json.dumps({"jsonrpc": "2.0", "id": json.loads(line)["id"], "result": {}}).encode() + b"\\n")
os.close(0)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("line", "ids"),
    [
        (b'{"jsonrpc":"2.0","id":2,"method":"a/b"}', [2]),
        # A batch (2025-03-26): its requests waited for as long as the upstream lived.
        (b'[{"jsonrpc":"2.0","id":2,"method":"a/b"},{"jsonrpc":"2.0","id":"3","method":"a/b"}]', [2, "3"]),
    ],
)
def test_a_request_for_an_upstream_that_stopped_reading_is_answered(
    tmp_path: Path, line: bytes, ids: list[Any]
) -> None:
    """An upstream that closes its input and runs on: the request it cannot be sent was dropped with
    a log line, and its client waited for as long as the upstream lived."""
    proxy = start(tmp_path, child(STOPS_READING))
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    try:
        proxy.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"a/b"}\n')
        proxy.stdin.flush()
        assert json.loads(proxy.stdout.readline())["id"] == 1
        time.sleep(0.5)  # it has closed its input by now
        proxy.stdin.write(line + b"\n")
        proxy.stdin.flush()
        out, deadline = b"", time.monotonic() + 30
        while out.count(b"\n") < len(ids):  # read from the descriptor: `readline` buffers past a line
            ready, _, _ = select.select([proxy.stdout], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"answers to {ids} expected, got {out!r}"
            out += os.read(proxy.stdout.fileno(), 65536)
        answers = whole_messages(out)
    finally:
        proxy.kill()
        proxy.wait()
    assert [answer["id"] for answer in answers] == ids
    assert all("not reading its input" in answer["error"]["message"] for answer in answers)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_a_message_of_exactly_the_limit_is_relayed_whatever_its_line_ending(ending: bytes) -> None:
    """The CR of a CRLF, framing, used to count against --max-message-bytes: the request was refused
    as too large (-32600). Relayed, its echo (the request and more) is what is too large, coming back."""
    limit = 2000
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "x/y", "params": {"p": ""}}
    request["params"]["p"] = "z" * (limit - len(json.dumps(request).encode()))
    line = json.dumps(request).encode()
    assert len(line) == limit
    done = subprocess.run(
        proxy_argv("--provider", "mock", "--max-message-bytes", str(limit), upstream=ECHO_SERVER),
        input=line + ending,
        capture_output=True,
        env=proxy_env(),
        timeout=60,
    )
    [answer] = whole_messages(done.stdout)
    assert answer["id"] == 1
    assert answer["error"]["code"] == INTERNAL_ERROR, answer
    assert "from the upstream too large" in done.stderr.decode()


def test_a_client_that_closes_its_input_still_gets_an_answer_to_every_request(tmp_path: Path) -> None:
    """`echo request | mcp-backfill -- server` with a server that dies before answering: the client's
    end of input stopped the upstream, and the request it was still waiting for got nothing."""
    upstream = """
    import os, sys
    sys.stdin.buffer.readline()
    os._exit(3)
    """
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "never"}}
    done = subprocess.run(
        proxy_argv("--provider", "mock", upstream=child(upstream)),
        input=json.dumps(request).encode() + b"\n",
        capture_output=True,
        env=proxy_env(),
        timeout=60,
    )
    [answer] = whole_messages(done.stdout)
    assert answer["id"] == 7
    assert "Upstream MCP server exited" in answer["error"]["message"]


@pytest.mark.parametrize("size", [1000, 100_000])
def test_an_answer_that_is_not_utf8_does_not_reach_the_client(size: int) -> None:
    """A line on the wire must be UTF-8 (a client reading it as text, as the mcp SDK's does, fails
    on the first bad byte and ends its whole session). One of 64 KiB or more, routed by its first
    bytes without being decoded, went out as it came; a smaller one became an error for its request."""
    upstream = f"""
    import os, sys
    sys.stdin.buffer.readline()
    os.write(1, b'{{"jsonrpc":"2.0","id":1,"result":{{"text":"caf\\xe9 ' + b"x" * {size} + b'"}}}}\\n')
    sys.stdin.buffer.readline()
    """
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "big"}}
    done = subprocess.run(
        proxy_argv("--provider", "mock", upstream=child(upstream)),
        input=json.dumps(request).encode() + b"\n",
        capture_output=True,
        env=proxy_env(),
        timeout=60,
    )
    done.stdout.decode("utf-8")  # all of it
    [answer] = whole_messages(done.stdout)
    assert answer["id"] == 1
    assert answer["error"]["code"] == INTERNAL_ERROR
    assert "not valid JSON" in answer["error"]["message"]


def test_what_the_upstream_wrote_before_it_exited_reaches_a_slow_client(tmp_path: Path) -> None:
    """The upstream fills every pipe and buffer between it and a client that reads nothing for now,
    then exits; the client reads seconds later, long past --shutdown-grace: all of it is relayed
    (the end of the upstream's output is waited for as long as there is output left to read)."""
    fill = """
import json, os, sys, time
os.set_blocking(1, False)
sent = full = 0
while full < 20:  # until the pipe has stayed full for a second: all between is full too
    message = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": {"n": sent, "pad": "x" * 3000}}}
    try:
        os.write(1, json.dumps(message).encode() + b"\\n")  # under PIPE_BUF: all or nothing
    except BlockingIOError:
        full += 1
        time.sleep(0.05)
        continue
    sent, full = sent + 1, 0
print("sent", sent, file=sys.stderr, flush=True)
"""
    proxy = start(tmp_path, child(fill), "--shutdown-grace", "0.2")
    assert proxy.stdout is not None
    deadline = time.monotonic() + 30
    while not re.search(r"sent \d+", (tmp_path / "stderr").read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # the upstream has exited, its last output still in the pipe, the grace over
    found = re.search(r"sent (\d+)", (tmp_path / "stderr").read_text())
    assert found is not None
    out = proxy.stdout.read()
    proxy.wait(30)
    numbers = [message["params"]["data"]["n"] for message in whole_messages(out)]
    assert numbers == list(range(int(found.group(1))))


# Two notifications of 200 KB, each written once the proxy has read the one before: each comes in
# one read and is relayed from the read callback (`deliver_at_once`). The first fills most of the
# client's pipe (256 KiB), the rest of the second waits in the writer thread, and the relay never
# waits for it; then the upstream exits, with the client's request unanswered.
TWO_LARGE_NOTES = """
import fcntl, json, os, sys, termios, time
def note(n):
    message = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": {"n": n, "pad": "x" * 200_000}}}
    return json.dumps(message, separators=(",", ":")).encode() + b"\\n"
def unread():
    return int.from_bytes(fcntl.ioctl(1, termios.FIONREAD, bytes(4)), sys.byteorder)
sys.stdin.buffer.readline()  # the relay runs: its reader of our stdout is waiting
for n in range(2):
    os.write(1, note(n))
    while unread():
        time.sleep(0.01)
"""


def in_the_shutdown_tail(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A proxy whose session is over (its upstream exited) and that is still flushing its last
    messages to a client that has not read them yet (for up to `CLOSE_SECONDS`)."""
    proxy = start(tmp_path, child(TWO_LARGE_NOTES), "--log-level", "debug")
    assert proxy.stdin is not None
    proxy.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}\n')
    proxy.stdin.flush()
    deadline = time.monotonic() + 30
    while "relay ended" not in (tmp_path / "stderr").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "relay ended" in (tmp_path / "stderr").read_text()
    return proxy


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_the_proxy_finishes_its_shutdown_does_not_cut_it(tmp_path: Path, signum: int) -> None:
    """Once the relay had ended, the default handlers were back: a SIGTERM then (the mcp SDK's
    client sends one 2 s after closing the proxy's stdin) killed the proxy in the middle of its last
    flush to the client (and before its store settlements and audit log's close). A first signal
    there is held now: the proxy is stopping already, and the rest is bounded."""
    proxy = in_the_shutdown_tail(tmp_path)
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    proxy.send_signal(signum)
    out = proxy.stdout.read()
    proxy.stdin.close()
    assert proxy.wait(30) == 0, (tmp_path / "stderr").read_text()[-3000:]
    first, second, answer = whole_messages(out)
    assert [first["params"]["data"]["n"], second["params"]["data"]["n"]] == [0, 1]
    assert len(second["params"]["data"]["pad"]) == 200_000
    assert answer["id"] == 1
    assert "Upstream MCP server exited" in answer["error"]["message"]


def test_a_second_signal_while_the_proxy_finishes_its_shutdown_ends_it(tmp_path: Path) -> None:
    """A proxy stuck in its shutdown still yields to a repeated signal. (Two different ones, which
    the kernel cannot merge into one; which of them the proxy sees first is not certain.)"""
    proxy = in_the_shutdown_tail(tmp_path)
    proxy.send_signal(signal.SIGHUP)
    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(30) in (-signal.SIGHUP, -signal.SIGTERM)
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    proxy.stdin.close()
    proxy.stdout.close()
