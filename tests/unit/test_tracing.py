"""Trace spans of the relay and the sampler, in process: a real `Relay` and `Sampler` (mock provider)
with OpenTelemetry's SDK and its in-memory exporter. The process test (tests/e2e/test_tracing.py)
checks the same through a real proxy and a real OTLP/HTTP receiver."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from mcp_backfill import assembly, protocol, telemetry
from mcp_backfill.errors import ConfigError, ProviderError, SamplingError
from mcp_backfill.providers.mock import MockProvider
from mcp_backfill.relay.tracing import RequestTraces, with_trace_context
from mcp_backfill.sampling.audit import AuditLog
from mcp_backfill.sampling.provider import ProgressCallback, UsageMeter
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.telemetry import ChatOutcome, NoTelemetry, otel, traces_requested
from mcp_backfill.telemetry.otel import OtelTelemetry
from tests.defaults import CONFIG, SPEND
from tests.unit.test_relay_flows import (
    ELICIT,
    HELLO,
    GatedProvider,
    initialize,
    input_required,
    relayed,
    request,
    result,
    sampling_request,
    stateless,
)

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for the test; off again after it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = telemetry.install(OtelTelemetry(provider))
    try:
        yield exporter
    finally:
        telemetry.install(previous)
        provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = exporter.get_finished_spans()
    named = {span.name: span for span in finished}
    assert len(named) == len(finished), [span.name for span in finished]
    return named


def parent_of(span: ReadableSpan) -> str | None:
    return format(span.parent.span_id, "016x") if span.parent is not None else None


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


def traceparent_span(meta: dict[str, Any]) -> str:
    version, trace_id, parent, flags = str(meta["traceparent"]).split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    return parent


async def test_a_tool_call_its_sampling_request_and_the_chat_form_one_trace(
    spans: InMemorySpanExporter,
) -> None:
    async with relayed() as r:
        await r.client.send(request(0, "initialize", initialize({})))
        await r.server.recv()
        await r.server.send(result(0, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        call = {"name": "weather", "arguments": {}, "_meta": {"traceparent": TRACEPARENT, "other": 1}}
        await r.client.send(request(5, protocol.TOOLS_CALL, call))
        forwarded = await r.server.recv()
        assert forwarded["params"]["_meta"]["other"] == 1  # the client's own _meta is kept
        hop = traceparent_span(forwarded["params"]["_meta"])
        # The server's sampling request carries its own span's context (here: the proxy's, passed on).
        await r.server.send(
            sampling_request(
                70, {**HELLO, "_meta": {"traceparent": forwarded["params"]["_meta"]["traceparent"]}}
            )
        )
        answer = await r.server.recv()
        assert answer["id"] == 70
        assert "result" in answer
        await r.server.send(result(5, {"content": [], "isError": False}))
        assert (await r.client.recv())["id"] == 5

    named = by_name(spans)
    tool = named["tools/call weather"]
    assert tool.kind == SpanKind.SERVER
    assert parent_of(tool) == CLIENT_SPAN
    assert span_id(tool) == hop
    assert tool.attributes is not None
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes["jsonrpc.request.id"] == "5"
    assert tool.attributes["gen_ai.tool.name"] == "weather"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["mcp.protocol.version"] == "2025-11-25"
    assert tool.status.status_code == StatusCode.UNSET

    sampling = named["sampling/createMessage"]
    assert parent_of(sampling) == span_id(tool)
    assert sampling.attributes is not None
    assert sampling.attributes["jsonrpc.request.id"] == "70"
    assert sampling.attributes["mcp_backfill.sender"] == "server"

    [chat_name] = [name for name in named if name.startswith("chat ")]
    chat = named[chat_name]
    assert chat.kind == SpanKind.CLIENT
    assert parent_of(chat) == span_id(sampling)
    attributes = chat.attributes
    assert attributes is not None
    assert chat_name == f"chat {attributes['gen_ai.request.model']!s}"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "mock"
    assert attributes["gen_ai.request.max_tokens"] == HELLO["maxTokens"]
    assert str(attributes["gen_ai.response.model"]).startswith("mock/")
    assert attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert isinstance(attributes["gen_ai.usage.input_tokens"], int)
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert isinstance(attributes["gen_ai.usage.output_tokens"], int)
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["mcp_backfill.sampling.outcome"] == "answered"
    one_trace = (tool, sampling, chat)
    assert {span.context.trace_id for span in one_trace if span.context} == {int(TRACE_ID, 16)}
    assert named["initialize"].parent is None  # the client sent no trace context with it


async def test_an_error_response_and_a_refused_sampling_request_are_errors(
    spans: InMemorySpanExporter,
) -> None:
    async with relayed() as r:
        await r.client.send(request(1, "tools/list"))
        await r.server.recv()
        await r.server.send({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no tools"}})
        await r.client.recv()
        await r.server.send(sampling_request(2, {**HELLO, "maxTokens": 0}))  # invalid: maxTokens < 1
        refused = await r.server.recv()
        assert refused["error"]["code"] == protocol.INVALID_PARAMS

    named = by_name(spans)
    listed = named["tools/list"]
    assert listed.parent is None  # no trace context in _meta: a root span
    assert listed.attributes is not None
    assert listed.attributes["error.type"] == "-32601"
    assert listed.attributes["rpc.response.status_code"] == "-32601"
    assert listed.status.status_code == StatusCode.ERROR
    assert listed.status.description == "no tools"
    sampling = named["sampling/createMessage"]
    assert sampling.attributes is not None
    assert sampling.attributes["error.type"] == str(protocol.INVALID_PARAMS)
    chat = named["chat"]  # refused before a model was chosen
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == str(protocol.INVALID_PARAMS)
    assert chat.attributes["mcp_backfill.sampling.outcome"] == "refused"
    assert parent_of(chat) == span_id(sampling)


async def test_a_2026_round_samples_under_the_client_request(spans: InMemorySpanExporter) -> None:
    async with relayed() as r:
        params = stateless({"name": "ask", "arguments": {}})
        params["_meta"]["traceparent"] = TRACEPARENT
        await r.client.send(request(9, protocol.TOOLS_CALL, params))
        first = await r.server.recv()
        hop = traceparent_span(first["params"]["_meta"])
        await r.server.send(result(9, input_required({"s": {"method": protocol.SAMPLING, "params": HELLO}})))
        retry = await r.server.recv()
        assert traceparent_span(retry["params"]["_meta"]) == hop  # the re-sent round is the same request
        await r.server.send(result(retry["id"], {"content": [{"type": "text", "text": "done"}]}))
        assert (await r.client.recv())["id"] == 9

    named = by_name(spans)
    tool = named["tools/call ask"]
    assert parent_of(tool) == CLIENT_SPAN
    assert span_id(tool) == hop
    assert tool.attributes is not None
    assert tool.attributes["mcp.protocol.version"] == protocol.STATELESS_VERSION
    [chat] = [span for name, span in named.items() if name.startswith("chat ")]
    assert parent_of(chat) == span_id(tool)


async def test_a_server_request_passed_to_the_client_ends_with_its_answer(
    spans: InMemorySpanExporter,
) -> None:
    async with relayed() as r:
        await r.server.send({"jsonrpc": "2.0", "id": 3, **ELICIT})
        forwarded = await r.client.recv()
        assert "traceparent" in forwarded["params"]["_meta"]
        await r.client.send(result(3, {"action": "decline"}))
        assert (await r.server.recv())["id"] == 3

    elicit = by_name(spans)["elicitation/create"]
    assert elicit.attributes is not None
    assert elicit.attributes["mcp_backfill.sender"] == "server"
    assert span_id(elicit) == forwarded["params"]["_meta"]["traceparent"].split("-")[2]


async def test_a_cancelled_request_ends_its_span(spans: InMemorySpanExporter) -> None:
    async with relayed() as r:
        await r.client.send(request(4, "tools/list"))
        await r.server.recv()
        await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 4}})
        await r.server.recv()
    listed = by_name(spans)["tools/list"]
    assert listed.attributes is not None
    assert listed.attributes["error.type"] == "cancelled"


async def test_a_server_request_the_server_cancelled_ends_its_span_at_once(
    spans: InMemorySpanExporter,
) -> None:
    """A client does not answer a request its server cancelled: its span was held open (and in the
    session's memory) until the session ended, one more for every such request of a session that
    lives for weeks."""
    async with relayed() as r:
        for request_id in range(50):
            await r.server.send({"jsonrpc": "2.0", "id": request_id, **ELICIT})
            await r.client.recv()
            cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": request_id}}
            await r.server.send(cancel)
            assert (await r.client.recv())["method"] == protocol.CANCELLED
        ended = [span for span in spans.get_finished_spans() if span.name == "elicitation/create"]
        assert len(ended) == 50
        assert all(
            span.attributes is not None and span.attributes["error.type"] == "cancelled" for span in ended
        )
        await r.server.send({"jsonrpc": "2.0", "id": 7, **ELICIT})  # an id used again: a span of its own
        await r.client.recv()
        await r.client.send(result(7, {"action": "decline"}))
        assert (await r.server.recv())["id"] == 7
    assert len([span for span in spans.get_finished_spans() if span.name == "elicitation/create"]) == 51


async def test_without_tracing_requests_are_forwarded_untouched() -> None:
    assert isinstance(telemetry.current(), NoTelemetry)
    async with relayed() as r:
        call = request(5, protocol.TOOLS_CALL, {"name": "weather", "_meta": {"traceparent": TRACEPARENT}})
        await r.client.send(call)
        assert await r.server.recv() == call


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_only_the_standard_variables_turn_tracing_on(environ: dict[str, str], wanted: bool) -> None:
    assert traces_requested(environ) is wanted


def test_the_sdk_is_not_imported_unless_tracing_is_on() -> None:
    """Zero cost when off: the fronts, the relay and the sampler import no OpenTelemetry SDK module,
    and `install_from_environment` without OTEL_* variables imports none either."""
    probe = (
        "import sys\n"
        "import mcp_backfill.stdio_front, mcp_backfill.sidecar.server\n"
        "from mcp_backfill import telemetry\n"
        "telemetry.install_from_environment({})\n"
        "heavy = ('opentelemetry.sdk', 'mcp_backfill.telemetry.otel')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]"


async def test_a_refused_request_keeps_its_prompt_out_of_the_span_and_the_audit_log(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """The content as a bare string, a common server mistake: the -32602 that refuses it goes into
    the span status and the audit log (which holds no contents without --audit-content)."""
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    sampler = Sampler(MockProvider(), assembly.sampler_settings(CONFIG), spend=Spend(SPEND), audit=audit)
    prompt = {"messages": [{"role": "user", "content": "Patient Jane Roe, diagnosis X"}], "maxTokens": 50}
    async with audit.running():
        with pytest.raises(SamplingError):
            await sampler.sample(prompt, request_id=1)
    line = (tmp_path / "audit.jsonl").read_text()
    assert '"refused"' in line
    [chat] = spans.get_finished_spans()
    assert chat.status.description is not None
    assert "<string, 29 characters>" in chat.status.description
    assert [text for text in (line, chat.status.description) if "Jane" in text] == []


class OverloadedProvider(MockProvider):
    """Claude overloaded for good (the retries are the retry policy's business, not this test's)."""

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        data = {"provider": "mock", "status": 529, "type": "overloaded_error"}
        raise ProviderError("Claude API error (529 overloaded_error): Overloaded", data, retryable=True)


async def test_a_claude_failure_is_the_chat_spans_error_type(spans: InMemorySpanExporter) -> None:
    async with relayed(OverloadedProvider()) as r:
        await r.server.send(sampling_request(8))
        failed = await r.server.recv()
        assert failed["error"]["code"] == protocol.INTERNAL_ERROR
    named = by_name(spans)
    [chat] = [span for name, span in named.items() if name.startswith("chat ")]
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == "overloaded_error"
    assert chat.attributes["mcp_backfill.sampling.outcome"] == "failed"
    assert chat.status.status_code == StatusCode.ERROR
    sampling = named["sampling/createMessage"]
    assert sampling.attributes is not None
    assert sampling.attributes["rpc.response.status_code"] == str(protocol.INTERNAL_ERROR)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_an_exporter_this_build_cannot_serve_is_a_clear_error(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        otel.from_environment(environ, make_global=False)
    assert variable in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "endpoint"),
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:notaport"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "notaurl"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4318"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:99999/v1/traces"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://collector:4317"),
    ],
)
def test_an_unusable_otlp_endpoint_is_refused_at_startup(
    variable: str, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was accepted, and then every export batch logged an error; its text is not quoted (it
    may hold a password)."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, endpoint)
    with pytest.raises(ConfigError) as caught:
        otel.from_environment(os.environ, make_global=False)
    assert variable in str(caught.value)
    assert "http://" in str(caught.value)
    assert endpoint == "http://" or endpoint not in str(caught.value)


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:pw@collector.example"},
        # The traces variable wins: the general one is not used then.
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "notaurl",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1]:4318/x",
        },
        {"OTEL_TRACES_EXPORTER": "otlp"},  # the SDK's default, localhost:4318
    ],
)
def test_a_usable_otlp_endpoint_is_accepted(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    otel.from_environment(os.environ, make_global=False).provider.shutdown()


def test_the_console_exporter_writes_to_stderr_not_the_protocol(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "probe")
    traced = otel.from_environment(os.environ, make_global=False)
    with traced.chat("anthropic") as chat:
        chat.request("claude-x", 5)
        chat.end(ChatOutcome("answered", calls=1))
    traced.shutdown()
    out, err = capfd.readouterr()
    assert out == ""
    assert '"name": "chat claude-x"' in err
    assert '"service.name": "probe"' in err


class FixedSpan:
    """Injects a fixed context, as the OpenTelemetry span would (the propagator replaces the keys)."""

    def inject(self, meta: dict[str, Any]) -> None:
        meta["traceparent"] = TRACEPARENT

    def activate(self) -> AbstractContextManager[None]:
        return nullcontext()

    def end(self, error: Mapping[str, Any] | None = None, *, tool_error: bool = False) -> None:
        pass

    def cancel(self) -> None:
        pass


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(
    params=st.none() | JSON | st.dictionaries(st.text(max_size=8), JSON, max_size=4),
    meta=st.none() | JSON | st.dictionaries(st.text(max_size=12), JSON, max_size=4),
)
def test_trace_context_goes_into_a_copy_and_keeps_everything_else(params: Any, meta: Any) -> None:
    if isinstance(params, dict) and meta is not None:
        params = {**params, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    before = copy.deepcopy(message)
    traced = with_trace_context(message, FixedSpan())
    assert message == before  # the original (and its bytes) untouched
    if params is not None and not isinstance(params, dict):  # positional: no `_meta` to write to
        assert traced == before
        return
    assert traced["params"]["_meta"]["traceparent"] == TRACEPARENT
    old_params = params if isinstance(params, dict) else {}
    assert {k: v for k, v in traced["params"].items() if k != "_meta"} == {
        k: v for k, v in old_params.items() if k != "_meta"
    }
    old_meta = old_params.get("_meta")
    old_meta = old_meta if isinstance(old_meta, dict) else {}
    assert {k: v for k, v in traced["params"]["_meta"].items() if k != "traceparent"} == {
        k: v for k, v in old_meta.items() if k not in ("traceparent", "tracestate")
    }
    assert {k: v for k, v in traced.items() if k != "params"} == {
        k: v for k, v in message.items() if k != "params"
    }


def traced_meta(meta: dict[str, Any], params: Any = None) -> Any:
    """The `params` of a request with `meta` as forwarded with tracing on (the span's context in)."""
    traces = RequestTraces(telemetry.current())
    params = {"_meta": meta} if params is None else params
    message = {"jsonrpc": "2.0", "id": 1, "method": protocol.TOOLS_LIST, "params": params}
    return traces.relayed(message, sender="client")["params"]


def test_a_trace_context_the_propagators_cannot_read_starts_a_new_trace(
    spans: InMemorySpanExporter,
) -> None:
    """`"baggage": "k=\\ud800"` is valid JSON the relay's decoder accepts, and makes the SDK's
    baggage propagator raise: the request still gets its span (a root) and goes on."""
    forwarded = traced_meta({"traceparent": TRACEPARENT, "baggage": "k=\ud800"})["_meta"]
    assert TRACE_ID not in forwarded["traceparent"]
    assert forwarded["baggage"] == "k=\ud800"  # not ours to rewrite


def test_positional_params_are_forwarded_as_they_are(spans: InMemorySpanExporter) -> None:
    assert traced_meta({}, params=[1, 2, 3]) == [1, 2, 3]


def test_a_tracestate_goes_with_its_traceparent_only(spans: InMemorySpanExporter) -> None:
    """With a valid parent its `tracestate` is passed on; with an invalid one (a new trace) the old
    `tracestate` belongs to no trace and is dropped (W3C Trace Context)."""
    valid = traced_meta({"traceparent": TRACEPARENT, "tracestate": "vendor=kept"})["_meta"]
    assert (valid["traceparent"].split("-")[1], valid["tracestate"]) == (TRACE_ID, "vendor=kept")
    invalid = traced_meta({"traceparent": "00-not-a-valid-parent", "tracestate": "vendor=stale"})["_meta"]
    assert invalid["traceparent"].startswith("00-")
    assert "tracestate" not in invalid, invalid


class StuckProcessor(SpanProcessor):
    """A processor whose exporter never gets through (a collector that hangs)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def shutdown(self) -> None:
        self.released.wait(30)


def test_shutdown_waits_for_the_exporter_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel, "SHUTDOWN_SECONDS", 0.2)
    provider = TracerProvider()
    stuck = StuckProcessor()
    provider.add_span_processor(stuck)
    start = time.monotonic()
    try:
        OtelTelemetry(provider).shutdown()
        assert time.monotonic() - start < 2
    finally:
        stuck.released.set()


async def test_a_sampling_request_refused_for_reusing_an_id_in_flight_has_its_span(
    spans: InMemorySpanExporter,
) -> None:
    """Every request the proxy receives gets a span: one refused at once (-32600) for reusing the id
    of a sampling request the proxy is still answering had none."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(sampling_request(3))
        assert (await r.server.recv())["error"]["code"] == protocol.INVALID_REQUEST
        provider.gate.set()
        assert "result" in await r.server.recv()
    sampling = [span for span in spans.get_finished_spans() if span.name == protocol.SAMPLING]
    codes = sorted(str((span.attributes or {}).get("error.type")) for span in sampling)
    assert codes == [str(protocol.INVALID_REQUEST), "None"], codes
