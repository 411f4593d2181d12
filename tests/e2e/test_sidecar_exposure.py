"""What an unauthenticated or hostile HTTP client can do to `mcp-backfill serve`: the review's
findings on metrics cardinality, slow and idle connections, Host/Origin on every route, and the
warning when nothing authenticates clients. Real sockets on loopback against the real process."""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import string

import anyio
import httpx2
import pytest

from mcp_backfill.sidecar.connections import DRAIN_LIMIT, DRAIN_RATE
from mcp_backfill.transports.event_stream import REPLAY_BYTES
from tests.harness import proxy_env, python_server
from tests.sidecar_harness import HANDSHAKE_HEADERS, HTTP_TIMEOUT, Sidecar, open_session, run_sidecar

pytestmark = pytest.mark.anyio

ECHO_SERVER = python_server("echo_server.py")
TOKEN = "exposure-token-0123456789abcdef"
# Generous: the sidecar closes after its (1 s) timeout; a loaded machine may take longer.
CLOSE_WITHIN = 30.0
CLOSED = (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError)


async def closed_by_server(sidecar: Sidecar, send: bytes) -> bytes:
    """Connect, send `send`, and read until the server closes the connection; returns what it sent."""
    stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
    received = b""
    async with stream:
        if send:
            await stream.send(send)
        with anyio.fail_after(CLOSE_WITHIN):
            while True:
                try:
                    received += await stream.receive()
                except CLOSED:
                    return received


async def test_idle_and_half_sent_requests_are_closed_and_a_slow_body_gets_408() -> None:
    options = ("--provider", "mock", "--header-timeout", "1", "--body-timeout", "1")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        assert await closed_by_server(sidecar, b"") == b""  # sent nothing at all
        assert await closed_by_server(sidecar, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1") == b""
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{"
        ).encode()
        answer = await closed_by_server(sidecar, head)  # a body that never completes
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            assert (await http.get(f"{sidecar.base}/healthz")).status_code == 200  # still serving
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"--body-timeout" in answer


async def test_a_refused_body_is_dropped_then_the_connection_serves_on_up_to_the_drain_limit() -> None:
    """A body over --max-message-bytes gets its 413 while the client still sends; the rest is read
    and dropped so that the client can read the 413 and go on using the connection. A body that
    keeps coming past the drain limit (4 MiB) has its connection closed, and the sidecar serves on."""
    options = ("--provider", "mock", "--max-message-bytes", "1024")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:

        def head(length: int) -> bytes:
            return (
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n\r\n"
            ).encode()

        chunk = b" " * 65536
        stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
        async with stream:
            await stream.send(head(len(chunk) * 16))
            for _ in range(16):  # 1 MiB: all of it is read, none of it kept
                await stream.send(chunk)
            answer = b""
            with anyio.fail_after(CLOSE_WITHIN):
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                    answer += await stream.receive()
                await stream.send(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode())
                again = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"--max-message-bytes" in answer
        assert again.startswith(b"HTTP/1.1 200")  # the same connection, after the dropped body

        stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
        sent = 0
        async with stream:
            await stream.send(head(1024 * 1024 * 1024))
            with anyio.fail_after(CLOSE_WITHIN), contextlib.suppress(*CLOSED):
                while sent < 64 * 1024 * 1024:  # far past the limit: closed long before
                    await stream.send(chunk)
                    sent += len(chunk)
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            assert (await http.get(f"{sidecar.base}/healthz")).status_code == 200
    assert sent < 64 * 1024 * 1024
    assert "over the drain limit" in sidecar.stderr()


async def test_refused_bodies_are_read_no_faster_than_the_drain_rate_whoever_sends_them() -> None:
    """Four connections send 3 MiB bodies over --max-message-bytes at once: each gets its 413 and its
    connection serves on, but the 12 MiB are read and dropped no faster than the drain budget
    allows, all connections together: the 4 MiB burst at once, the rest at 8 MiB a second (loopback
    alone would take a few milliseconds). A client sending refused bodies back to back cannot make
    the sidecar spend its CPU reading them."""
    options = ("--provider", "mock", "--max-message-bytes", "1024", "--header-timeout", "120")
    size, senders = 3 * 1024 * 1024, 4
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {size}\r\n\r\n"
        ).encode()
        health = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
        answers: list[bytes] = []

        async def refused_then_healthy() -> None:
            stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
            async with stream:
                await stream.send(head)
                for _ in range(size // 65536):
                    await stream.send(b" " * 65536)
                await stream.send(health)  # read only once the body before it has been dropped
                received = b""
                while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"}"):
                    received += await stream.receive()
                answers.append(received)

        started = anyio.current_time()
        with anyio.fail_after(CLOSE_WITHIN * 2):
            async with anyio.create_task_group() as tg:
                for _ in range(senders):
                    tg.start_soon(refused_then_healthy)
        elapsed = anyio.current_time() - started
    assert len(answers) == senders
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"HTTP/1.1 200" in answer  # the same connection, after the dropped body
    # At least half the time the budget gives the bodies: what a connection read before its 413 went
    # out (a read or two of up to 256 KiB) is not charged, and the clocks differ a little.
    assert elapsed >= 0.5 * (senders * size - DRAIN_LIMIT) / DRAIN_RATE


async def test_endless_request_headers_are_cut_off_at_the_head_limit() -> None:
    """Headers that keep coming (well within --header-timeout) are not buffered without end: the
    connection is closed once they pass 64 KiB, and the sidecar keeps serving."""
    options = ("--provider", "mock", "--header-timeout", "60")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
        sent = 0
        async with stream:
            await stream.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            with anyio.fail_after(CLOSE_WITHIN), contextlib.suppress(*CLOSED):
                while sent < 64 * 1024 * 1024:  # far past the limit: closed long before
                    await stream.send(b"X-Filler: " + b"a" * 1000 + b"\r\n")
                    sent += 1012
                await stream.receive()
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            assert (await http.get(f"{sidecar.base}/healthz")).status_code == 200
    # Closed, not read on without end. (What the client got to send first is no measure of when:
    # loopback's buffers take tens of MiB while a sidecar on a loaded machine reads its first 64 KiB.)
    assert sent < 64 * 1024 * 1024
    assert "request headers over the size limit" in sidecar.stderr()


async def test_connections_beyond_the_cap_are_closed() -> None:
    options = ("--provider", "mock", "--max-connections", "2")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        held = [socket.create_connection(("127.0.0.1", sidecar.port)) for _ in range(2)]
        try:
            with anyio.fail_after(CLOSE_WITHIN):  # the two held ones are accepted first
                while "connection refused: too many" not in sidecar.stderr():
                    extra = await anyio.connect_tcp("127.0.0.1", sidecar.port)
                    async with extra:
                        with contextlib.suppress(
                            anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError
                        ):
                            await extra.receive()
        finally:
            for sock in held:
                sock.close()
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            assert (await http.get(f"{sidecar.base}/healthz")).status_code == 200


async def test_random_methods_add_no_metric_series() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        rng = random.Random(7)
        methods = ["".join(rng.choices(string.ascii_uppercase, k=12)) for _ in range(40)] + ["X" * 8000]
        statuses = {
            (await http.request(method, f"{sidecar.base}/{rng.randint(0, 10**6)}")).status_code
            for method in methods
        }
        metrics = (await http.get(f"{sidecar.base}/metrics")).text
    series = re.findall(r"^mcp_backfill_http_requests_total\{(.*)\} (\d+)$", metrics, re.MULTILINE)
    # llhttp (uvicorn's httptools parser) refuses a method it does not know with a 400 before the
    # application sees it; h11 hands it on and the application answers 404 under OTHER.
    assert statuses == {400}
    assert len(series) <= 1  # only GET (the scrape itself is counted once it is answered)
    assert all(method not in metrics for method in methods)


@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
async def test_dns_rebinding_cannot_read_metrics_or_health(path: str) -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        rebound = await http.get(f"{sidecar.base}{path}", headers={"host": f"evil.example:{sidecar.port}"})
        foreign = await http.get(f"{sidecar.base}{path}", headers={"origin": "http://evil.example"})
        fine = await http.get(f"{sidecar.base}{path}")
    assert (rebound.status_code, foreign.status_code, fine.status_code) == (403, 403, 200)
    assert "mcp_backfill" not in rebound.text + foreign.text


async def test_serving_without_authentication_is_announced() -> None:
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as open_sidecar:
        pass
    env = proxy_env(MCP_BACKFILL_AUTH_TOKEN=TOKEN)
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=env) as guarded:
        pass
    assert "serving without authentication (no --auth-token)" in open_sidecar.stderr()
    assert "MCP_BACKFILL_AUTH_TOKEN" in open_sidecar.stderr()
    assert "serving without authentication" not in guarded.stderr()


async def test_a_session_that_never_reads_its_get_stream_holds_a_bounded_replay_buffer() -> None:
    """Server messages for the standalone GET stream were kept (1,024 of up to 32 MiB each) for a
    client that never opens it; now each stream keeps at most REPLAY_BYTES, the newest always."""
    blob = "x" * (1024 * 1024)
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
        for n in range(20):  # two requests in flight: the notification belongs to neither (GET stream)
            notify = {"method": "notifications/big", "params": {"n": n, "blob": blob}}
            batch = [call(f"a{n}", "test/notify_client", notify), call(f"b{n}", "ping")]
            response = await http.post(sidecar.url, json=batch, headers=headers)
            assert response.status_code == 200
        metrics = (await http.get(f"{sidecar.base}/metrics")).text
        [buffered] = map(int, re.findall(r"^mcp_backfill_replay_buffer_bytes (\d+)$", metrics, re.MULTILINE))
        seen: list[int] = []
        get_headers = {"accept": "text/event-stream", "mcp-session-id": session}
        async with http.stream("GET", sidecar.url, headers=get_headers) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:])["params"]["n"])
                    if seen[-1] == 19:
                        break
    assert buffered <= REPLAY_BYTES + 64 * 1024
    assert seen[-1] == 19  # the newest messages are still there for the client
    assert 1 <= len(seen) < 20  # the oldest were dropped
    assert seen == sorted(seen)


def call(request_id: str, method: str, params: object = None) -> dict[str, object]:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


# -- one connection, several requests: HEAD, pipelining, Expect (the HTTP front's review) ----------


async def read_until(stream: anyio.abc.ByteStream, done: bytes, seconds: float = 5) -> tuple[bytes, bool]:
    """What arrives until `done` is in it, or the server closes, or `seconds` pass; and whether closed."""
    received = b""
    with anyio.move_on_after(seconds):
        while done not in received:
            try:
                received += await stream.receive()
            except CLOSED:
                return received, True
    return received, False


def sse_get(port: int, session_id: str) -> bytes:
    return (
        f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
        f"Mcp-Session-Id: {session_id}\r\n\r\n"
    ).encode()


async def test_head_requests_are_answered_and_pipelined_answers_keep_their_order() -> None:
    """A HEAD's response head, held back for a body uvicorn never writes for HEAD, used never to go
    out: probes by HEAD hung, and the answer to a request pipelined behind it came first."""
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        host = f"Host: 127.0.0.1:{sidecar.port}\r\n"
        for path, status in (("/healthz", b"200"), ("/readyz", b"200"), ("/nope", b"404")):
            async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
                await stream.send(f"HEAD {path} HTTP/1.1\r\n{host}\r\n".encode())
                received, _ = await read_until(stream, b"\r\n\r\n")
            assert received.startswith(b"HTTP/1.1 " + status), (path, received)
            assert received.endswith(b"\r\n\r\n"), (path, received)  # a head, no body
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(
                f"HEAD /healthz HTTP/1.1\r\n{host}\r\nGET /nope HTTP/1.1\r\n{host}\r\n".encode()
            )
            received, _ = await read_until(stream, b"Not Found")
    assert received.startswith(b"HTTP/1.1 200"), received
    assert received.index(b"HTTP/1.1 404") > 0


async def test_a_stream_pipelined_behind_a_request_is_not_cut_by_the_header_timeout() -> None:
    """The header timer armed as the first answer completed used to close the connection in the
    middle of the SSE stream uvicorn started right after it."""
    options = ("--provider", "mock", "--header-timeout", "1")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            session_id = await open_session(http, sidecar.url)
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            first = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
            await stream.send(first + sse_get(sidecar.port, session_id))
            received, closed = await read_until(stream, b"never", seconds=3)  # three header timeouts
    assert b"text/event-stream" in received, received
    assert not closed


async def test_the_header_clock_starts_again_at_each_answer_of_a_kept_alive_connection() -> None:
    """`--header-timeout` counts from the connection's start or its last answer: requests a little
    apart keep one connection for many timeouts, and a head left unfinished after an answer is
    still cut off."""
    options = ("--provider", "mock", "--header-timeout", "1")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            for _ in range(12):  # three seconds: three header timeouts
                await stream.send(request)
                received, closed = await read_until(stream, b'"status":"ok"')
                assert received.startswith(b"HTTP/1.1 200"), received
                assert not closed
                await anyio.sleep(0.25)
            await stream.send(request[:20])  # a head begun after an answer, never finished
            received, closed = await read_until(stream, b"never", seconds=CLOSE_WITHIN)
    assert closed
    assert received == b""


async def test_a_head_begun_late_after_an_answer_is_due_as_it_was_at_the_answer() -> None:
    """With `--header-timeout` no shorter than uvicorn's keep-alive (5 s), the head's timer is armed
    only once the next request's bytes come; it is due all the same when it was due at the answer,
    not a whole timeout after the bytes (and a head never finished is still cut off)."""
    options = ("--provider", "mock", "--header-timeout", "5")
    async with run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(request)
            received, closed = await read_until(stream, b'"status":"ok"')
            answered = anyio.current_time()
            assert received.startswith(b"HTTP/1.1 200"), received
            assert not closed
            await anyio.sleep(3.5)  # within the keep-alive: the connection is still open
            await stream.send(request[:20])  # a head begun late, never finished
            received, closed = await read_until(stream, b"never", seconds=CLOSE_WITHIN)
            cut_after = anyio.current_time() - answered
    assert closed
    assert received == b""
    # Due 5 s after the answer; counted from the bytes it would have been 8.5 s.
    assert cut_after < 7.5, cut_after


async def test_a_request_pipelined_behind_one_in_flight_gets_the_head_limit_too() -> None:
    """While a request is in flight the next one's header bytes used to be neither counted nor
    timed, and llhttp keeps them all: 64 MiB of header lines behind an SSE stream grew the sidecar
    by 1.9 GiB."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(sse_get(sidecar.port, session_id))  # in flight: the stream
            await read_until(stream, b"text/event-stream")
            await stream.send(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n".encode())
            sent = 0
            with anyio.fail_after(CLOSE_WITHIN), contextlib.suppress(*CLOSED):
                while sent < 64 * 1024 * 1024:  # closed long before
                    await stream.send(b"X:\r\n" * 16384)
                    sent += 4 * 16384
                await stream.receive()
        assert (await http.get(f"{sidecar.base}/healthz")).status_code == 200
    # Closed, not read on without end. (What the client got to send first is no measure of when:
    # loopback's buffers take tens of MiB while a sidecar on a loaded machine reads its first 64 KiB.)
    assert sent < 64 * 1024 * 1024
    assert "request headers over the size limit" in sidecar.stderr()


async def test_a_client_that_pipelines_and_leaves_releases_its_stream() -> None:
    """uvicorn tells only the request it parsed last that its client left: an SSE stream with a
    request pipelined behind it used to stay attached to the session after its client had gone, and
    the session's next GET was refused (409)."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        behind = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(sse_get(sidecar.port, session_id) + behind)
            received, _ = await read_until(stream, b"text/event-stream")
            assert received.startswith(b"HTTP/1.1 200"), received
        headers = {"accept": "text/event-stream", "mcp-session-id": session_id}
        # The stream's handler hears that its client left and lets the session go: at once, where it
        # used to take until its next keep-alive comment failed to go out (15 s).
        with anyio.fail_after(8):
            while True:
                async with http.stream("GET", sidecar.url, headers=headers) as again:
                    if again.status_code == 200:
                        break
                    assert again.status_code == 409
                await anyio.sleep(0.2)


async def test_a_refused_request_that_expected_100_continue_does_not_swallow_the_next_one() -> None:
    """Refused before its body (413 for its declared size), no `100 Continue` went out, so its client
    sends no body; the sidecar used to wait for it and take the next request's bytes as that body."""
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        host = f"Host: 127.0.0.1:{sidecar.port}\r\n"
        refused = (
            f"POST /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nExpect: 100-continue\r\n"
            "Content-Length: 50000000\r\n\r\n"
        ).encode()
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(refused)
            received, closed = await read_until(stream, b"}")
            if not closed:
                await stream.send(f"GET /healthz HTTP/1.1\r\n{host}\r\n".encode())
                more, closed = await read_until(stream, b'"version"')
                received += more
    assert received.startswith(b"HTTP/1.1 413"), received
    assert b"100 Continue" not in received
    assert closed or b"HTTP/1.1 200" in received, received


async def test_a_token_with_non_ascii_characters_is_accepted() -> None:
    """Sent as UTF-8, it used to be compared encoded twice (latin-1 decoding, then UTF-8): 401."""
    token = "clé-secrète-0123456789"
    env = {**proxy_env(), "MCP_BACKFILL_AUTH_TOKEN": token}
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=env) as sidecar:
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(
                f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nAuthorization: Bearer ".encode()
                + token.encode()
                + b"\r\n\r\n"
            )
            received, _ = await read_until(stream, b"\r\n\r\n")
        assert received.startswith(b"HTTP/1.1 200"), received
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(
                f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nAuthorization: Bearer ".encode()
                + token.encode("latin-1")  # the same characters, other bytes: not the token
                + b"\r\n\r\n"
            )
            received, _ = await read_until(stream, b"\r\n\r\n")
        assert received.startswith(b"HTTP/1.1 401"), received


async def test_answers_given_as_json_are_not_kept_for_a_resumption_that_cannot_come() -> None:
    """A single request answered in time gets its answer as JSON, with no event id to resume from;
    the session kept it all the same among its last eight finished streams (eight 2 MiB tool results
    held 16 MiB a session, up to --max-sessions times, after the client had read them)."""
    blob = "x" * (2 * 1024 * 1024)
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        headers = {"accept": "application/json, text/event-stream", "mcp-session-id": session}
        json_answers = 0
        for n in range(8):
            response = await http.post(
                sidecar.url, json=call(f"big{n}", "x/big", {"blob": blob}), headers=headers
            )
            assert response.status_code == 200
            json_answers += response.headers["content-type"].startswith("application/json")
        metrics = (await http.get(f"{sidecar.base}/metrics")).text
        [buffered] = map(int, re.findall(r"^mcp_backfill_replay_buffer_bytes (\d+)$", metrics, re.MULTILINE))
    assert json_answers >= 1
    assert buffered <= (8 - json_answers) * (len(blob) + 1024) + 4096  # + the GET stream's notes
