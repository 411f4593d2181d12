"""Traces end to end: a real MCP SDK client -> `python -m mcp_backfill` (stdio) -> the example weather
server, sampling answered through the fake Claude API, spans exported over OTLP/HTTP to a receiver
on loopback (tests/otlp_receiver.py) because the standard OTEL_* variables say so.

The client puts a W3C `traceparent` in the tool call's `_meta`: the proxy's span of that call is its
child, the server's sampling request comes back with the proxy's context (the SDK's server passes
it on), and the sampling exchange's `chat` span hangs below it, with the anthropic SDK's own span of
the API call below that.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import cast

import anyio
import pytest
from mcp import Client
from mcp_types import RequestParamsMeta

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import (
    EXAMPLES,
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
)
from tests.otlp_receiver import ReceivedSpan, otlp_receiver
from tests.sidecar_harness import run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WEATHER = [sys.executable, str(EXAMPLES / "weather_server.py")]
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
# An open map on the wire (`extra_items=Any`), which mypy does not model yet.
CLIENT_META = cast(RequestParamsMeta, {"traceparent": TRACEPARENT})
COLLECTOR_KEY = "otlp-ingest-SECRET-9f8e7d6c5b4a"


def otel_env(endpoint: str, fake_url: str | None = None) -> dict[str, str]:
    return proxy_env(
        fake_url,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_SERVICE_NAME="backfill-under-test",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )


def named(spans: Sequence[ReceivedSpan], prefix: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


def has_chat_and_tool(spans: list[ReceivedSpan]) -> bool:
    return bool(named(spans, "chat ")) and bool(named(spans, "tools/call summarize"))


async def test_a_tool_call_that_samples_is_one_trace_from_the_client_to_claude(
    fake_claude: FakeClaude,
) -> None:
    fake_claude.enqueue(text_reply("Rain, then sun.", model="claude-sonnet-5"))
    with otlp_receiver() as receiver:
        argv = proxy_argv("--model", "claude-sonnet-5", upstream=WEATHER)
        async with Client(
            stdio_params(argv, otel_env(receiver.endpoint, fake_claude.url)), mode="legacy"
        ) as client:
            result = await client.call_tool(
                "summarize",
                {"text": "It rains in the morning and clears up later."},
                meta=CLIENT_META,
            )
            assert not result.is_error
        spans = await anyio.to_thread.run_sync(receiver.wait_for, has_chat_and_tool)

    [tool] = named(spans, "tools/call summarize")
    assert tool.kind == "SERVER"
    assert tool.service == "backfill-under-test"
    assert tool.scope == "mcp_backfill"
    assert (tool.trace_id, tool.parent_span_id) == (TRACE_ID, CLIENT_SPAN)
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes["gen_ai.tool.name"] == "summarize"
    assert tool.attributes["mcp.protocol.version"]
    assert tool.attributes["jsonrpc.request.id"]

    # The server's sampling request came back carrying the proxy's tools/call context.
    [sampling] = named(spans, "sampling/createMessage")
    assert sampling.kind == "SERVER"
    assert (sampling.trace_id, sampling.parent_span_id) == (TRACE_ID, tool.span_id)

    [chat] = named(spans, "chat ")
    assert chat.name == "chat claude-sonnet-5"
    assert chat.kind == "CLIENT"
    assert (chat.trace_id, chat.parent_span_id) == (TRACE_ID, sampling.span_id)
    attributes = chat.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == "claude-sonnet-5"
    assert attributes["gen_ai.request.max_tokens"] == 200  # what the example server asks for
    assert attributes["gen_ai.response.model"] == "claude-sonnet-5"
    assert attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    served = fake_claude.message_requests[0]
    assert served.body["model"] == "claude-sonnet-5"
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert chat.status_code != 2

    # The anthropic SDK's span of the API call joins the same trace, below the exchange.
    below = [span for span in spans if span.parent_span_id == chat.span_id]
    assert below, [span.name for span in spans]
    assert all(span.trace_id == TRACE_ID and span.scope != "mcp_backfill" for span in below)


async def test_without_otel_variables_nothing_is_exported_and_meta_is_untouched() -> None:
    with otlp_receiver() as receiver:
        env = proxy_env(OTEL_SERVICE_NAME="unused")  # names a service, asks for no traces
        argv = proxy_argv("--provider", "mock", upstream=WEATHER)
        async with Client(stdio_params(argv, env), mode="legacy") as client:
            result = await client.call_tool("summarize", {"text": "Sunny."}, meta=CLIENT_META)
            assert not result.is_error
        assert receiver.requests == 0


async def test_a_grpc_protocol_is_refused_with_the_variable_to_change() -> None:
    env = proxy_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=WEATHER), env) as proxy:
        status = await proxy.wait()
        assert status == 2
        assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'" in proxy.stderr()
        assert "http/protobuf" in proxy.stderr()


async def test_an_otlp_endpoint_with_no_usable_port_is_refused_at_startup() -> None:
    env = proxy_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://user:hunter2-secret@collector:notaport")
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=WEATHER), env) as proxy:
        status = await proxy.wait()
        assert status == 2
        assert "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL" in proxy.stderr()
        assert "hunter2-secret" not in proxy.stderr()


async def test_the_sidecar_names_the_session_in_its_spans() -> None:
    with otlp_receiver() as receiver:
        env = otel_env(receiver.endpoint)
        async with run_sidecar("--provider", "mock", upstream=WEATHER, env=env) as sidecar:
            async with Client(sidecar.url, mode="legacy") as client:
                result = await client.call_tool("summarize", {"text": "Windy."}, meta=CLIENT_META)
                assert not result.is_error
            spans = await anyio.to_thread.run_sync(receiver.wait_for, has_chat_and_tool)

    [tool] = named(spans, "tools/call summarize")
    [sampling] = named(spans, "sampling/createMessage")
    session = tool.attributes["mcp.session.id"]
    assert isinstance(session, str)
    assert len(session) == 32
    assert int(session, 16) >= 0
    assert sampling.attributes["mcp.session.id"] == session
    assert (tool.trace_id, tool.parent_span_id) == (TRACE_ID, CLIENT_SPAN)
    assert sampling.parent_span_id == tool.span_id
    [chat] = named(spans, "chat ")
    assert chat.parent_span_id == sampling.span_id
    assert chat.attributes["gen_ai.provider.name"] == "mock"


async def test_odd_requests_are_relayed_with_tracing_on() -> None:
    """A `_meta.baggage` with a lone surrogate (valid JSON: "\\ud800") makes the SDK's propagator
    raise: the request goes on as one without a context (a new trace), and the session with it.
    Positional `params` have no `_meta` to carry a context: they go on as they came."""
    with otlp_receiver() as receiver:
        argv = proxy_argv("--provider", "mock", upstream=python_server("echo_server.py"))
        async with raw_proxy(argv, otel_env(receiver.endpoint)) as session:
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            meta = {"traceparent": TRACEPARENT, "baggage": "k=\ud800"}
            odd = await session.request(1, "tools/list", {"_meta": meta})
            forwarded = odd["result"]["echo"]["params"]["_meta"]
            assert TRACE_ID not in forwarded["traceparent"]
            assert forwarded["baggage"] == "k=\ud800"
            positional = await session.request(2, "x/positional", [1, "two", None])
            assert positional["result"]["echo"]["params"] == [1, "two", None]
            await session.close_stdin()
            assert await session.wait(30) == 0, session.stderr()


async def test_a_collector_that_does_not_answer_delays_the_exit_by_two_seconds_at_most() -> None:
    """The client closes stdin and waits for the proxy to exit; the collector accepts connections
    and never answers, so the last batch's export would take the exporter's whole timeout."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(50)  # the kernel accepts; nobody answers
        env = otel_env(f"http://127.0.0.1:{hung.getsockname()[1]}")
        async with raw_proxy(proxy_argv("--provider", "mock", upstream=WEATHER), env) as session:
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await session.request(1, "tools/list")
            await anyio.sleep(0.5)  # a batch is on its way to the collector
            start = time.monotonic()
            await session.close_stdin()
            await session.wait(30)
            took = time.monotonic() - start
    assert took < 3.5, f"exited {took:.1f} s after stdin closed"


async def test_the_exporters_last_wait_comes_after_every_answer_and_the_end_of_stdout() -> None:
    """`tracing.shutdown()` blocks the event loop (up to 2 s, in a thread join): it runs once the
    relay has ended and stdout is closed, so nothing on the loop waits behind it. The client,
    which closed stdin right after its request, reads the answer and the end of stdout, and the
    proxy exits 0 once the exporter gave up."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(50)  # the kernel accepts; nobody answers
        env = otel_env(f"http://127.0.0.1:{hung.getsockname()[1]}")
        async with raw_proxy(proxy_argv("--provider", "mock", upstream=WEATHER), env) as session:
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await session.request(1, "tools/list")
            await anyio.sleep(0.5)  # a batch is on its way to the collector
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "summarize", "arguments": {"text": "Sunny."}},
                }
            )
            await session.close_stdin()
            answer = await session.recv(30)
            assert answer["id"] == 2
            assert "result" in answer or "error" in answer
            assert session.process.stdout is not None
            with pytest.raises(anyio.EndOfStream):
                await session.process.stdout.receive()
            assert await session.wait(30) == 0
            assert "the trace exporter did not finish in time" in session.stderr()


async def test_the_sidecars_exporter_wait_comes_after_its_drain_and_sessions() -> None:
    """In `serve`, `tracing.shutdown()` runs once uvicorn has stopped and every session is closed:
    its blocking wait holds up nothing the loop still had to do."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(50)  # the kernel accepts; nobody answers
        env = otel_env(f"http://127.0.0.1:{hung.getsockname()[1]}")
        async with run_sidecar("--provider", "mock", upstream=WEATHER, env=env) as sidecar:
            async with Client(sidecar.url, mode="legacy") as client:
                result = await client.call_tool("summarize", {"text": "Windy."}, meta=CLIENT_META)
                assert not result.is_error
            sidecar.signal(signal.SIGTERM)
            assert await sidecar.wait(30) == 0
            log = sidecar.stderr()
    stopping = log.index("stopping every session")
    assert log.index("the trace exporter did not finish in time") > stopping


async def test_a_key_in_the_collector_url_stays_out_of_the_log() -> None:
    """Some collectors take their key in the URL; the SDK's warning about a failed export quotes
    the URL it tried (`Max retries exceeded with url: /v1/traces?token=...`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # nothing listens once the socket is closed
    endpoint = f"http://127.0.0.1:{closed_port}/v1/traces?token={COLLECTOR_KEY}"
    env = proxy_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=WEATHER), env) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await session.request(1, "tools/list")
        await anyio.sleep(1.5)  # the batch is exported, and fails, at least once
        await session.close_stdin()
        await session.wait(30)
        stderr = session.stderr()
    assert "Transient error" in stderr or "Failed to export" in stderr, stderr
    assert COLLECTOR_KEY not in stderr, stderr[-800:]


async def test_what_a_client_or_server_names_is_bounded_in_the_spans() -> None:
    """A client's method name, request id and tool name, and an upstream's error message, went into
    span names, attributes and status whole: a client sending 300 kB names made spans of 300 kB, each
    held in the exporter's queue (2,048 of them while a collector is slow) and refused by collectors
    as a batch. They are cut to a bound, marked by an ellipsis."""
    huge = 300_000
    with otlp_receiver() as receiver:
        argv = proxy_argv("--provider", "mock", upstream=python_server("echo_server.py"))
        async with raw_proxy(argv, otel_env(receiver.endpoint)) as session:
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await session.request("i" * huge, "x/" + "m" * huge, {})
            await session.request(2, "tools/call", {"name": "n" * huge, "arguments": {}})
            asked = {"method": "roots/list", "id": "s" * huge}
            await session.send({"jsonrpc": "2.0", "id": 3, "method": "test/ask_client", "params": asked})
            server_request = await session.recv()
            error = {"code": -32000, "message": "e" * huge}
            await session.send({"jsonrpc": "2.0", "id": server_request["id"], "error": error})
            await session.recv()
            spans = await anyio.to_thread.run_sync(
                receiver.wait_for, lambda spans: len(named(spans, "roots/list")) == 1
            )
            await session.close_stdin()
            assert await session.wait(30) == 0, session.stderr()
    assert named(spans, "x/mmm")
    assert named(spans, "tools/call nnn")
    for span in spans:
        texts = [span.name, span.status_message]
        texts += [value for value in span.attributes.values() if isinstance(value, str)]
        assert max(len(text) for text in texts) <= 1024, (span.name[:40], [len(text) for text in texts])
