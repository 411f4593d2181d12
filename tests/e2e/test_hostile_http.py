"""Hostile HTTP on both legs: odd but valid (or malformed) bytes from a client of `serve`, and from an
HTTP upstream behind the stdio wrapper's `--upstream-url`.

The upstream here is a small asyncio server in the test's own event loop, on 127.0.0.1, that
answers `initialize` properly and every other request with the bytes its test scripts for its
method (`Script`), so that the proxy meets exactly the framing a test is about. Each test checks
that the waiting client gets its answer (or a clear JSON-RPC error), and that the next request
still works.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest

from tests.harness import initialize_params, proxy_env, proxy_url_argv, python_server, raw_proxy
from tests.sidecar_harness import HANDSHAKE_HEADERS, HTTP_TIMEOUT, initialize_body, run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ECHO_SERVER = python_server("echo_server.py")
HEADER_BYTES = [(name.encode(), value.encode()) for name, value in HANDSHAKE_HEADERS.items()]

# What the upstream writes for a request: given the request's id, the whole answer's bytes.
Script = Callable[[Any], bytes]


def answer(request_id: Any, result: Any = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result or {"ok": True}}).encode()


def json_answer(body: bytes, head: bytes = b"HTTP/1.1 200 OK\r\n", line_end: bytes = b"\r\n") -> bytes:
    lines = [b"content-type: application/json", b"content-length: %d" % len(body)]
    return head + b"".join(line + line_end for line in lines) + line_end + body


def sse_answer(events: bytes) -> bytes:
    """An SSE body framed by the connection's end (the upstream closes after it)."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + events


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, Any]:
    """A request's head, and its body decoded as JSON (None without one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, json.loads(await reader.readexactly(length)) if length else None


@asynccontextmanager
async def hostile_upstream(scripts: dict[str, Script]) -> AsyncIterator[str]:
    """A handshake-era upstream at the URL yielded: `initialize` is answered properly, a method named
    in `scripts` with its bytes (the connection then closed if they say `connection: close`; after a
    notification's scripted bytes, always),
    anything else with `{"method": M}`; notifications and responses get 202, GET and DELETE 405 (a
    GET the bytes of the script named "GET" when there is one, and `initialize` a session id then)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, body = await read_request(reader)
                if head.startswith(b"GET") and "GET" in scripts:
                    writer.write(scripts["GET"](None))
                    break
                if not head.startswith(b"POST"):
                    writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                elif isinstance(body, dict) and "id" not in body and body.get("method") in scripts:
                    writer.write(scripts[body["method"]](None))  # a notification's scripted acknowledgement
                    break
                elif not (isinstance(body, dict) and "method" in body and "id" in body):
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                elif body["method"] == "initialize":
                    result = {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "serverInfo": {"name": "hostile", "version": "0"},
                    }
                    session = b"mcp-session-id: s1\r\n" if "GET" in scripts else b""
                    writer.write(json_answer(answer(body["id"], result), b"HTTP/1.1 200 OK\r\n" + session))
                elif body["method"] in scripts:
                    wire = scripts[body["method"]](body["id"])
                    writer.write(wire)
                    if b"connection: close" in wire.partition(b"\r\n\r\n")[0].lower():
                        await writer.drain()
                        break
                else:
                    writer.write(json_answer(answer(body["id"], {"method": body["method"]})))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        listener.close()


async def through_the_wrapper(scripts: dict[str, Script], method: str) -> tuple[Any, Any, str]:
    """The stdio wrapper's answer to a request of `method`, to the one after it, and its stderr;
    every line it writes must be one JSON message."""
    async with (
        hostile_upstream(scripts) as url,
        raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
    ):
        first = await session.request(1, "initialize", initialize_params())
        assert "result" in first, first
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        hostile = await session.request(2, method)
        after = await session.request(3, "anything/else")
        await session.close_stdin()
        await session.wait()
        return hostile, after, session.stderr()


# -- messages that are JSON over several lines ------------------------------------------------------


async def test_a_pretty_printed_answer_reaches_a_stdio_client_as_one_line() -> None:
    """Raw newlines in JSON text are whitespace: an upstream answering with indented JSON (or an SSE
    event whose `data:` is split over lines) is valid, but written as it came, each of its lines
    reached the stdio client as a message of its own (none of them JSON), and the request was
    never answered."""
    scripts: dict[str, Script] = {
        "pretty/json": lambda rid: json_answer(json.dumps(json.loads(answer(rid)), indent=2).encode()),
        "split/sse": lambda rid: sse_answer(
            b"data: " + answer(rid)[:10] + b"\r\ndata: " + answer(rid)[10:] + b"\n\n"
        ),
    }
    for method in scripts:
        hostile, after, log = await through_the_wrapper(scripts, method)
        assert hostile == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}, (method, log)
        assert after["result"] == {"method": "anything/else"}


async def test_a_pretty_printed_post_reaches_a_stdio_upstream_as_one_line() -> None:
    """A client of `serve` may POST indented JSON (as `curl -d @file.json` sends it): relayed as it
    came, each of its lines reached the child upstream as a message of its own, and the POST waited
    for an answer for ever."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        with anyio.fail_after(2 * HTTP_TIMEOUT):  # (unanswered, the POST's SSE stream never ended)
            await _post_pretty(http, sidecar.url)


async def _post_pretty(http: httpx2.AsyncClient, url: str) -> None:
    opened = await http.post(url, content=json.dumps(initialize_body(), indent=2), headers=HANDSHAKE_HEADERS)
    assert opened.status_code == 200, opened.text
    assert opened.json()["result"]["serverInfo"]["name"] == "echo-server"
    session = {**HANDSHAKE_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    pretty = await http.post(url, content=json.dumps(ping, indent=2) + "\r\n", headers=session)
    assert pretty.status_code == 200, pretty.text
    assert pretty.json()["result"] == {"echo": ping}


# -- SSE framing ------------------------------------------------------------------------------------


async def test_an_sse_answer_whose_lines_end_in_a_lone_cr_is_delivered() -> None:
    """A lone CR ends an SSE line (the spec allows CRLF, LF or CR). The CR that ended the answer's
    event was held as perhaps half of a CRLF until another byte came; none came before the stream
    ended, and the request got "ended the response stream without answering" instead of its answer."""
    scripts: dict[str, Script] = {"cr/sse": lambda rid: sse_answer(b"id: 1\rdata: " + answer(rid) + b"\r\r")}
    hostile, after, log = await through_the_wrapper(scripts, "cr/sse")
    assert hostile == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}, log
    assert after["result"] == {"method": "anything/else"}


# -- the front of `serve` -----------------------------------------------------------------------------


async def test_a_forwarded_authorization_that_is_not_ascii_is_refused_at_the_door() -> None:
    """With `--forward-authorization` a client's `Authorization` goes upstream as a header, which
    cannot hold a byte past ASCII as text: one that did opened a session whose every request failed
    with "Internal error ... UnicodeEncodeError" (a traceback in the log). It gets a 400 naming the
    option, no session, and the next client is served."""
    async with (
        hostile_upstream({}) as url,
        run_sidecar(
            "--provider", "mock", "--forward-authorization", "--upstream-url", url, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        body = initialize_body()
        refused = await http.post(
            sidecar.url, json=body, headers=[*HEADER_BYTES, (b"authorization", b"Bearer caf\xc3\xa9")]
        )
        fine = await http.post(
            sidecar.url, json=body, headers={**HANDSHAKE_HEADERS, "authorization": "Bearer cafe"}
        )
        healthz = (await http.get(f"{sidecar.base}/healthz")).json()
    assert refused.status_code == 400, refused.text
    assert "mcp-session-id" not in refused.headers
    assert "--forward-authorization" in refused.json()["error"]["message"]
    assert fine.status_code == 200, fine.text
    assert fine.json()["result"]["serverInfo"]["name"] == "hostile"
    assert healthz["sessions"] == 1
    assert "Traceback" not in sidecar.stderr()


async def read_to_close(port: int, send: bytes) -> bytes:
    """Connect, send `send`, and read until the sidecar closes the connection."""
    received = b""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(send)
        with anyio.fail_after(HTTP_TIMEOUT):
            while True:
                try:
                    received += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                    return received


async def test_bytes_that_are_no_request_after_a_request_leave_its_answer_first() -> None:
    """A request followed by bytes that are no HTTP request (a body longer than its Content-Length)
    is relayed, and must be answered before the 400 for what came after it: the 400 went out at
    once, in place of the answer, while the request still went upstream (a client retrying what it
    was told failed would run a tool twice)."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        opened = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
        session_id = opened.headers["mcp-session-id"]
        body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}).encode()
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nMcp-Session-Id: {session_id}\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        received = await read_to_close(sidecar.port, head.encode() + body + b"GARBAGE GARBAGE\r\n\r\n")
        health = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\n\r\n".encode()
        health_first = await read_to_close(sidecar.port, health + b"\x00\x01 nonsense\r\n\r\n")
        after = await http.post(
            sidecar.url,
            json={"jsonrpc": "2.0", "id": 6, "method": "ping"},
            headers={**HANDSHAKE_HEADERS, "mcp-session-id": session_id},
        )
    answer, _, rest = received.partition(b"HTTP/1.1 400")
    assert answer.startswith(b"HTTP/1.1 200"), received
    assert answer.endswith(
        b'{"jsonrpc":"2.0","id":5,"result":{"echo":{"jsonrpc":"2.0","id":5,"method":"ping"}}}'
    )
    assert b"Invalid HTTP request" in rest
    assert health_first.startswith(b"HTTP/1.1 200"), health_first
    assert b"HTTP/1.1 400" in health_first
    assert after.json()["id"] == 6


# -- what a stdio client's request puts in the 2026-07-28 routing headers -----------------------------


@pytest.mark.parametrize(
    ("method", "version", "header"),
    [
        ("tools/list", "2026-07-28\u00e9", "MCP-Protocol-Version"),
        ("tools/\u00e9", "2026-07-28", "Mcp-Method"),
        ("tools/x\ny", "2026-07-28", "Mcp-Method"),
        ("tools/list", "2026-07-28\r\nx-injected: 1", "MCP-Protocol-Version"),
    ],
)
async def test_a_request_whose_routing_header_cannot_be_sent_gets_a_clear_error(
    method: str, version: str, header: str
) -> None:
    """A 2026-07-28 request repeats its method and protocol version in headers. One holding a byte
    past ASCII failed with "Internal error ... UnicodeEncodeError" (a traceback in the log), one
    holding a line break with "Upstream unreachable", which also made the proxy exit with status 1
    as if the upstream had failed; and the version, kept for later notifications, broke each of
    theirs. The request gets an error naming the header; nothing else is affected."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    fine_envelope = {**envelope, "io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    async with (
        hostile_upstream({}) as url,
        raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
    ):
        refused = await session.request(1, method, {"_meta": envelope})
        await session.send(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"_meta": envelope}}
        )
        fine = await session.request(2, "tools/list", {"_meta": fine_envelope})
        await session.close_stdin()
        status = await session.wait()
        log = session.stderr()
    assert refused["error"]["code"] == -32600, refused
    assert header in refused["error"]["message"]
    assert "unreachable" not in refused["error"]["message"]
    assert fine["result"] == {"method": "tools/list"}
    assert "Traceback" not in log
    assert status == 0, log


async def test_a_request_with_two_host_headers_is_refused() -> None:
    """RFC 9112 §3.2: a request with more than one Host line gets 400. The first was checked against
    `--allowed-hosts` and the others ignored, so `Host: 127.0.0.1:PORT` then `Host: evil.example`
    passed, where a proxy in front that reads the last one routes by another host than was checked."""
    async with run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar:
        good = f"Host: 127.0.0.1:{sidecar.port}\r\n"
        both = f"GET /healthz HTTP/1.1\r\n{good}Host: evil.example\r\nConnection: close\r\n\r\n"
        refused = await read_to_close(sidecar.port, both.encode())
        fine = await read_to_close(
            sidecar.port, f"GET /healthz HTTP/1.1\r\n{good}Connection: close\r\n\r\n".encode()
        )
    assert refused.startswith(b"HTTP/1.1 400"), refused
    assert b"Host" in refused
    assert fine.startswith(b"HTTP/1.1 200"), fine


# -- acknowledgements ------------------------------------------------------------------------------


async def test_a_garbled_acknowledgement_of_a_notification_does_not_end_the_wrapper() -> None:
    """An upstream that took a notification (its 202 head came) but broke off the acknowledgement's
    body (shorter than its `content-length`, or chunks that do not parse) was logged as unreachable
    and marked failed, so the stdio wrapper exited 1 when its client was done: one bad answer to a
    notification ended the proxy. It is a warning now, and the exit is clean."""
    scripts: dict[str, Script] = {
        "notifications/short": lambda _: b"HTTP/1.1 202 Accepted\r\ncontent-length: 50\r\n\r\n{",
        "notifications/chunks": lambda _: (
            b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
        ),
    }
    async with (
        hostile_upstream(scripts) as url,
        raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
    ):
        assert "result" in await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for number, method in enumerate(scripts, start=2):
            await session.send({"jsonrpc": "2.0", "method": method})
            after = await session.request(number, "anything/else")
            assert after["result"] == {"method": "anything/else"}, (method, session.stderr())
        await session.close_stdin()
        assert await session.wait() == 0, session.stderr()
        assert "unreachable" not in session.stderr()


# -- batches --------------------------------------------------------------------------------------


async def test_a_batch_answering_a_single_request_reaches_the_client_as_its_messages() -> None:
    """A batch answers only a batch (JSON-RPC 2.0 §6; 2025-06-18 has no batches at all): an upstream
    answering a single request with an array (as a JSON body or as one SSE event) had it passed on
    as it came, and the stdio client, which waits for an answer object, never got one. Its messages
    now go on one by one, as the events of the request's stream would."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}

    def array(rid: Any) -> bytes:
        return b"[" + json.dumps(note).encode() + b"," + answer(rid) + b"]"

    scripts: dict[str, Script] = {
        "array/json": lambda rid: json_answer(array(rid)),
        "array/sse": lambda rid: sse_answer(b"data: " + array(rid) + b"\n\n"),
    }
    for method in scripts:
        async with (
            hostile_upstream(scripts) as url,
            raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
        ):
            assert "result" in await session.request(1, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await session.send({"jsonrpc": "2.0", "id": 2, "method": method})
            answered, before = await session.recv_until(lambda m: isinstance(m, list) or "id" in m)
            assert answered == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}, (method, session.stderr())
            assert before == [note], method
            after = await session.request(3, "anything/else")
            assert after["result"] == {"method": "anything/else"}


# -- the standalone stream --------------------------------------------------------------------------


async def test_a_standalone_stream_that_ends_at_once_is_not_reopened_at_the_servers_pace() -> None:
    """An upstream whose GET stream says `retry: 1` and closes at once was asked for it again every
    millisecond, for as long as the session lasted (each opened stream reset the attempts). The
    server's `retry:` now has a floor, and streams that keep ending at once without a message back
    off further."""
    gets: list[float] = []

    def standalone(_: Any) -> bytes:
        gets.append(anyio.current_time())
        return sse_answer(b"retry: 1\n\n")

    async with (
        hostile_upstream({"GET": standalone}) as url,
        raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
    ):
        assert "result" in await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        with anyio.fail_after(15):
            while not gets:
                await anyio.sleep(0.05)
        await anyio.sleep(2)
        assert (await session.request(2, "anything/else"))["result"] == {"method": "anything/else"}
    # Floor 0.1 s, doubling: gaps of 0.1, 0.2, 0.4, 0.8 s fit in 2 s, the next not (the old code: hundreds).
    assert 1 <= len(gets) <= 6, len(gets)


# -- an HTTP/1.0 client of `serve` ------------------------------------------------------------------


async def test_an_http10_client_gets_its_event_stream_without_chunked_framing() -> None:
    """HTTP/1.0 knows no chunked transfer coding (RFC 9112 §6.1): uvicorn's httptools protocol
    framed an SSE answer to an HTTP/1.0 request with `Transfer-Encoding: chunked` all the same, and
    the client read the chunk sizes as part of the stream. The body is now the events as they are,
    ended by the connection's close."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        opened = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
        session_id = opened.headers["mcp-session-id"]
        request = (
            f"GET /mcp HTTP/1.0\r\nHost: 127.0.0.1:{sidecar.port}\r\nMcp-Session-Id: {session_id}\r\n"
            f"Accept: text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\r\n"
        ).encode()
        received = b""
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(request)
            with anyio.fail_after(HTTP_TIMEOUT):
                while b"\r\n\r\n" not in received:
                    received += await stream.receive()
                ended = await http.delete(
                    sidecar.url, headers={**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
                )
                while True:
                    try:
                        received += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                        break
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), received
    assert b"text/event-stream" in head.lower(), head
    assert b"transfer-encoding" not in head.lower(), head
    assert b"connection: close" in head.lower(), head
    assert ended.is_success, ended.text
    assert not body.endswith(b"0\r\n\r\n"), body
    assert all(line == b"" or line[:1] in b":de" for line in body.split(b"\n")), body


# -- a cancelled request whose stream never ends ----------------------------------------------------


async def test_a_cancelled_request_whose_stream_pings_forever_is_let_go() -> None:
    """A handshake-era request the client cancelled, whose upstream ignores the cancellation and
    keeps its SSE answer alive with comments, had its stream read (a task and a connection held)
    for as long as the server went on, each ping resetting the read timeout: for the whole session.
    The stream is closed shortly after the cancellation went out."""
    stream_closed = asyncio.Event()
    cancellations: list[Any] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _head, body = await read_request(reader)
                if not (isinstance(body, dict) and "id" in body and "method" in body):
                    if isinstance(body, dict) and body.get("method") == "notifications/cancelled":
                        cancellations.append(body["params"]["requestId"])
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                elif body["method"] == "initialize":
                    result = {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "serverInfo": {"name": "h"},
                    }
                    writer.write(json_answer(answer(body["id"], result)))
                elif body["method"] == "slow/forever":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                    )
                    try:
                        while True:
                            writer.write(b": ping\n\n")
                            await writer.drain()
                            await asyncio.sleep(0.05)
                    finally:
                        stream_closed.set()
                else:
                    writer.write(json_answer(answer(body["id"], {"method": body["method"]})))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/mcp"
    try:
        async with raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session:
            assert "result" in await session.request(1, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await session.send({"jsonrpc": "2.0", "id": 2, "method": "slow/forever"})
            await anyio.sleep(0.3)
            cancel = {"requestId": 2, "reason": "timed out"}
            await session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
            with anyio.fail_after(10):  # the stream lasts forever otherwise; it goes within ~1 s
                await stream_closed.wait()
            assert cancellations == [2]
            assert (await session.request(3, "anything/else"))["result"] == {"method": "anything/else"}
    finally:
        listener.close()


async def test_a_notification_the_upstream_never_answers_is_logged_as_not_delivered() -> None:
    """The log of a notification that could not be delivered named it in a field called `message`,
    which `logging` reserves: the call raised KeyError, and a traceback took the warning's place."""
    scripts: dict[str, Script] = {"notifications/dropped": lambda _: b""}  # closed without an answer
    async with (
        hostile_upstream(scripts) as url,
        raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session,
    ):
        assert "result" in await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/dropped"})
        assert (await session.request(2, "anything/else"))["result"] == {"method": "anything/else"}
        await session.close_stdin()
        assert await session.wait() == 1  # the upstream was unreachable at some point
        log = session.stderr()
    assert "message not delivered" in log, log
    assert 'sent="notifications/dropped"' in log, log
    assert "Traceback" not in log, log
