"""Tracing, optional: a span per relayed request and per sampling exchange, or nothing at all.

The relay and the sampler talk to the `Telemetry` interface below. Unless the `otel` extra is
installed *and* the standard `OTEL_*` variables ask for traces, the process keeps the `NoTelemetry`
object: its methods do nothing, `enabled` is False (so the relay skips even the bookkeeping), and
OpenTelemetry is never imported by this package. `install_from_environment()` is called once by
each front; `telemetry.otel` holds the implementation and is imported only when tracing is on.

Conventions followed (see docs/observability-tracing.md): the OpenTelemetry semantic conventions
for MCP and for generative-AI client spans, as published in open-telemetry/semantic-conventions-genai
(development status; attribute names as of semantic conventions 1.41).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from mcp_backfill.credentials import url_secrets
from mcp_backfill.logs import get_logger

log = get_logger("telemetry")


@dataclass(frozen=True)
class ChatOutcome:
    """How one sampling exchange ended, as the sampler knows it (for the span's attributes)."""

    outcome: str
    """answered, refused, failed, timed_out or cancelled (the audit log's outcomes)."""
    calls: int = 0
    error_type: str | None = None
    error_message: str | None = None


class RequestSpan(Protocol):
    """The span of one JSON-RPC request the proxy relays (or answers), from receipt to response."""

    def inject(self, meta: dict[str, Any]) -> None:
        """Write this span's trace context (`traceparent`, `tracestate`) into a request's `_meta`."""

    def activate(self) -> AbstractContextManager[None]:
        """Make this span the parent of the spans started inside the block (in this task)."""

    def end(self, error: Mapping[str, Any] | None = None, *, tool_error: bool = False) -> None:
        """The request got its response: `error` is the JSON-RPC error object when it failed."""

    def cancel(self) -> None:
        """The request ended without a response (cancelled, or its peer went away)."""


class ChatSpan(Protocol):
    """The span of one sampling exchange answered through the provider."""

    def request(self, model: str, max_tokens: int | None) -> None:
        """The model was chosen and the request built."""

    def response(self, message: Mapping[str, Any]) -> None:
        """Claude's final message (Messages API JSON, usage normalised): model, id, stop reason, usage."""

    def end(self, outcome: ChatOutcome) -> None: ...


class Telemetry(Protocol):
    enabled: bool

    def request(
        self,
        method: str,
        request_id: Any,
        params: Any,
        *,
        sender: str,
        protocol_version: str | None = None,
        session_id: str | None = None,
    ) -> RequestSpan:
        """A span for a request received from `sender` ("client" or "server"), whose parent is the
        trace context in its `params._meta` when there is one."""

    def chat(self, provider: str) -> AbstractContextManager[ChatSpan]:
        """A span for a sampling exchange, current inside the block (so that the Claude client's own
        spans, if any, become its children)."""

    def shutdown(self) -> None:
        """Export what is buffered; called once when the process ends."""


class _NoSpan:
    def inject(self, meta: dict[str, Any]) -> None:
        pass

    def activate(self) -> AbstractContextManager[None]:
        return nullcontext()

    def end(self, error: Mapping[str, Any] | None = None, *, tool_error: bool = False) -> None:
        pass

    def cancel(self) -> None:
        pass


class _NoChat:
    def request(self, model: str, max_tokens: int | None) -> None:
        pass

    def response(self, message: Mapping[str, Any]) -> None:
        pass

    def end(self, outcome: ChatOutcome) -> None:
        pass


class NoTelemetry:
    """Tracing off: nothing is recorded, nothing imported."""

    enabled = False
    _span = _NoSpan()

    def request(
        self,
        method: str,
        request_id: Any,
        params: Any,
        *,
        sender: str,
        protocol_version: str | None = None,
        session_id: str | None = None,
    ) -> RequestSpan:
        return self._span

    @contextmanager
    def chat(self, provider: str) -> Iterator[ChatSpan]:
        yield _NoChat()

    def shutdown(self) -> None:
        pass


_current: Telemetry = NoTelemetry()


def current() -> Telemetry:
    """The process's telemetry (`NoTelemetry` unless tracing was installed)."""
    return _current


def install(telemetry: Telemetry) -> Telemetry:
    """Make `telemetry` the process's; returns the one it replaces (tests put it back)."""
    global _current
    previous, _current = _current, telemetry
    return previous


# -- the standard environment ---------------------------------------------------------------------

TRACE_EXPORTERS = ("otlp", "console", "none")
OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
OTLP_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")


def traces_requested(environ: Mapping[str, str]) -> bool:
    """Do the standard `OTEL_*` variables ask for traces?

    `OTEL_SDK_DISABLED=true` turns everything off; `OTEL_TRACES_EXPORTER` (other than `none`) or an
    OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns it on.
    The SDK's own default exporter (otlp) is not assumed without one of them: a proxy started
    without any `OTEL_*` configuration must not try to reach localhost:4318.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(environ.get(name, "").strip() for name in OTLP_ENDPOINT_VARIABLES)


def export_secrets(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The credentials the OTLP exporter's variables may hold, for the log redaction: the endpoint
    URLs' user, password, their Basic form and credential-named query values (collectors that take
    their key in the URL; `?debug=true` is no secret, and redacting `true` would spoil every JSON log
    line), and
    every header value (with the bare token of a `Bearer <token>`). Each as written and
    percent-decoded: the SDK's warning about a failed export quotes the URL it tried."""
    found: list[str] = []
    for name in OTLP_ENDPOINT_VARIABLES:
        url = environ.get(name, "").strip()
        try:
            found += [urlsplit(url).username or "", *url_secrets(url)]
        except ValueError:  # not a URL the exporter can use either
            continue
    for name in OTLP_HEADER_VARIABLES:
        values = [pair.partition("=")[2].strip() for pair in environ.get(name, "").split(",")]
        found += values + [unquote(value).partition(" ")[2].strip() for value in values]
    found += [unquote(value) for value in found]
    return tuple(dict.fromkeys(value for value in found if value))


def install_from_environment(environ: Mapping[str, str] | None = None) -> Telemetry:
    """Turn tracing on when the environment asks for it and the `otel` extra is installed.

    Raises `ConfigError` for an exporter or OTLP protocol this build cannot serve; logs a warning
    (and keeps tracing off) when the variables are set but the extra is missing.
    """
    environ = os.environ if environ is None else environ
    if not traces_requested(environ):
        return _current
    try:
        from mcp_backfill.telemetry.otel import from_environment
    except ImportError as exc:
        log.warning(
            "OTEL_* variables ask for traces, but OpenTelemetry's SDK is not installed; tracing is off "
            "(install the extra: pip install 'mcp-backfill[otel]')",
            extra={"missing": exc.name},
        )
        return _current
    telemetry = from_environment(environ)
    install(telemetry)
    log.info("tracing on (OpenTelemetry)", extra={"service": telemetry.service_name})
    return telemetry
