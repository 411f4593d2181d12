"""The OpenTelemetry implementation of `Telemetry` (imported only when tracing is on).

Spans, with the attribute names of the MCP and generative-AI semantic conventions:

* one per request the proxy relays or answers, named `{mcp.method.name} {target}` (target: the tool
  or prompt name), kind SERVER: the proxy received it from one peer. Its parent is the trace context
  in the request's `params._meta` (`traceparent`/`tracestate`, SEP-414); its own context is written
  into the `_meta` of the request the proxy forwards, so the next hop's span is its child.
* one per sampling exchange, `chat {gen_ai.request.model}`, kind CLIENT, child of the request span
  of the `sampling/createMessage` request (or of the client request whose `input_required` round
  asked for it), with the model, token usage and stop reason. It is the current span while the
  provider works, so the anthropic SDK's own span of each API call (when it makes one) nests in it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, StatusCode

from mcp_backfill import __version__, protocol
from mcp_backfill.errors import ConfigError
from mcp_backfill.logs import get_logger
from mcp_backfill.telemetry import OTLP_ENDPOINT_VARIABLES, TRACE_EXPORTERS, ChatOutcome

SCOPE = "mcp_backfill"
DEFAULT_SERVICE_NAME = "mcp-backfill"
# `gen_ai.provider.name` by `--provider`: the well-known values where there is one.
PROVIDER_NAMES = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "vertex": "gcp.vertex_ai"}
# Requests whose `params.name` is a low-cardinality target for the span name.
NAMED_TARGETS = {protocol.TOOLS_CALL: "gen_ai.tool.name", protocol.PROMPTS_GET: "gen_ai.prompt.name"}

NAME_CHARACTERS = 256
"""The longest a name or id a peer chose (method, tool, request id, session, model) is in a span's
name or attributes; longer ones are cut, ending in an ellipsis. A client sending names of 300 kB
made spans of 300 kB, each held in the exporter's queue (2,048 of them while a collector is slow)
and refused by collectors with the whole batch."""
MESSAGE_CHARACTERS = 1024
"""The longest an error message (a span's status) is."""

SHUTDOWN_SECONDS = 2.0
"""The longest the exit waits for the spans still buffered to be exported."""

log = get_logger("telemetry")


def _bounded(text: str, limit: int = NAME_CHARACTERS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parent(params: Any) -> Context | None:
    """The trace context carried in `params._meta`, or None (then the span is a root).

    The peer wrote it: a context the propagators cannot read (a lone surrogate in `baggage` makes
    the SDK's raise) starts a new trace, as a missing one does, rather than failing the request.
    """
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or "traceparent" not in meta:
        return None
    carrier = {k: v for k, v in meta.items() if isinstance(v, str)}
    try:
        context = propagate.extract(carrier)
    except Exception:  # any propagator OTEL_PROPAGATORS names, on any input
        log.debug("unreadable trace context in _meta; a new trace starts", exc_info=True)
        return None
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


class OtelRequestSpan:
    def __init__(self, span: Span) -> None:
        self.span = span
        self._ended = False

    def inject(self, meta: dict[str, Any]) -> None:
        propagate.inject(meta, context=trace.set_span_in_context(self.span))

    def activate(self) -> AbstractContextManager[None]:
        return _using(self.span)

    def end(self, error: Mapping[str, Any] | None = None, *, tool_error: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            code = _bounded(str(error.get("code")))
            self.span.set_attribute("error.type", code)
            self.span.set_attribute("rpc.response.status_code", code)
            message = error.get("message")
            shown = _bounded(message, MESSAGE_CHARACTERS) if isinstance(message, str) else None
            self.span.set_status(StatusCode.ERROR, shown)
        elif tool_error:
            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(StatusCode.ERROR)
        self.span.end()

    def cancel(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.span.set_attribute("error.type", "cancelled")
        self.span.set_status(StatusCode.ERROR, "ended without a response")
        self.span.end()


@contextmanager
def _using(span: Span) -> Iterator[None]:
    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        yield


class OtelChatSpan:
    def __init__(self, span: Span) -> None:
        self.span = span

    def request(self, model: str, max_tokens: int | None) -> None:
        model = _bounded(model)
        self.span.update_name(f"chat {model}")
        self.span.set_attribute("gen_ai.request.model", model)
        if max_tokens is not None:
            self.span.set_attribute("gen_ai.request.max_tokens", max_tokens)

    def response(self, message: Mapping[str, Any]) -> None:
        span = self.span
        if isinstance(message.get("model"), str):
            span.set_attribute("gen_ai.response.model", _bounded(message["model"]))
        if isinstance(message.get("id"), str):
            span.set_attribute("gen_ai.response.id", _bounded(message["id"]))
        if isinstance(message.get("stop_reason"), str):
            span.set_attribute("gen_ai.response.finish_reasons", [_bounded(message["stop_reason"])])
        usage = message.get("usage")
        if isinstance(usage, Mapping):
            cache_read = _count(usage, "cache_read_input_tokens")
            cache_creation = _count(usage, "cache_creation_input_tokens")
            # The conventions count every input token in input_tokens; Claude reports cached ones apart.
            span.set_attribute(
                "gen_ai.usage.input_tokens", _count(usage, "input_tokens") + cache_read + cache_creation
            )
            span.set_attribute("gen_ai.usage.output_tokens", _count(usage, "output_tokens"))
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", cache_read)
            span.set_attribute("gen_ai.usage.cache_creation.input_tokens", cache_creation)

    def end(self, outcome: ChatOutcome) -> None:
        span = self.span
        span.set_attribute("mcp_backfill.sampling.outcome", outcome.outcome)
        span.set_attribute("mcp_backfill.sampling.calls", outcome.calls)
        if outcome.error_type is not None:
            span.set_attribute("error.type", _bounded(outcome.error_type))
            message = outcome.error_message
            span.set_status(
                StatusCode.ERROR, None if message is None else _bounded(message, MESSAGE_CHARACTERS)
            )
        span.end()


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) else 0


class OtelTelemetry:
    """Spans from a tracer of `provider` (the process's, or a test's with an in-memory exporter)."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE, __version__)
        name = provider.resource.attributes.get(SERVICE_NAME)
        self.service_name = str(name) if name is not None else DEFAULT_SERVICE_NAME

    def request(
        self,
        method: str,
        request_id: Any,
        params: Any,
        *,
        sender: str,
        protocol_version: str | None = None,
        session_id: str | None = None,
    ) -> OtelRequestSpan:
        method = _bounded(method)
        attributes: dict[str, Any] = {"mcp.method.name": method, "mcp_backfill.sender": sender}
        if request_id is not None:
            attributes["jsonrpc.request.id"] = _bounded(str(request_id))
        if protocol_version:
            attributes["mcp.protocol.version"] = _bounded(protocol_version)
        if session_id:
            attributes["mcp.session.id"] = _bounded(session_id)
        name = method
        target = params.get("name") if isinstance(params, dict) else None
        if method in NAMED_TARGETS and isinstance(target, str):
            target = _bounded(target)
            attributes[NAMED_TARGETS[method]] = target
            name = f"{method} {target}"
        if method == protocol.TOOLS_CALL:
            attributes["gen_ai.operation.name"] = "execute_tool"
        span = self.tracer.start_span(
            name,
            context=_parent(params) or Context(),
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        return OtelRequestSpan(span)

    @contextmanager
    def chat(self, provider: str) -> Iterator[OtelChatSpan]:
        span = self.tracer.start_span(
            "chat",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER_NAMES.get(provider, provider),
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        with _using(span):
            yield OtelChatSpan(span)

    def shutdown(self) -> None:
        """Export what is buffered, waiting `SHUTDOWN_SECONDS` at most: a collector that is down or
        hangs would otherwise hold the exit for the exporter's whole timeout and retries (10 s by
        default) while the client waits for the proxy to go. Spans still unexported are lost."""
        flushing = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        flushing.start()
        flushing.join(SHUTDOWN_SECONDS)
        if flushing.is_alive():
            log.warning(
                "the trace exporter did not finish in time; spans not yet exported are lost",
                extra={"seconds": SHUTDOWN_SECONDS},
            )


def from_environment(environ: Mapping[str, str], *, make_global: bool = True) -> OtelTelemetry:
    """The tracer provider the `OTEL_*` variables describe, made the global one (so libraries that
    trace, such as the anthropic SDK, join the same traces) unless `make_global` is False."""
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read by the SDK from the process environment)
    # name the service; "mcp-backfill" otherwise.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_processor(environ))
    if make_global:
        trace.set_tracer_provider(provider)
    return OtelTelemetry(provider)


def _processor(environ: Mapping[str, str]) -> SpanProcessor:
    """The batch processor (`OTEL_BSP_*` apply) of the configured exporter."""
    return BatchSpanProcessor(_exporter(environ))


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    name = names[0] if names else "otlp"
    if len(names) > 1 or name not in TRACE_EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={environ.get('OTEL_TRACES_EXPORTER')!r} is not supported by "
            f"mcp-backfill: use one of {', '.join(TRACE_EXPORTERS)}"
        )
    if name == "none":
        raise ValueError("OTEL_TRACES_EXPORTER=none asks for no traces")
    if name == "console":
        # stdout is the MCP protocol in stdio mode: the console exporter writes to stderr.
        return ConsoleSpanExporter(out=sys.stderr)
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip()
    if protocol not in ("", "http/protobuf"):
        variable = (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
            if environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            else "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        raise ConfigError(
            f"{variable}={protocol!r} is not supported by mcp-backfill's otel extra: use http/protobuf "
            "(the collector's port 4318)"
        )
    _check_endpoint(environ)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _check_endpoint(environ: Mapping[str, str]) -> None:
    """The OTLP endpoint the exporter will use (the traces variable's, else the general one's),
    checked at startup: an unusable one was accepted, and then every export batch logged an error.
    Its text is not quoted: it may hold a password."""
    variable = next((name for name in OTLP_ENDPOINT_VARIABLES if environ.get(name)), None)
    if variable is None:
        return  # the SDK's default, http://localhost:4318
    try:
        parts = urlsplit(environ[variable].strip())
        parts.port  # noqa: B018 (a port that is not a number, or out of range, raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{variable} must be an http:// or https:// URL with a host (and a numeric port), "
            "such as http://collector:4318 (OTLP over HTTP)"
        )
