"""Prometheus metrics for the sidecar, rendered in the text exposition format (version 0.0.4).

A few counters, gauges and one histogram do not justify a dependency: the format is small and
stable. One `Metrics` object per process is created by the server and handed to what records.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mcp_backfill.sidecar.security import FORWARDED_PREFIX

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Claude calls take from a fraction of a second to minutes (long tool-use turns).
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 2.5)

Labels = tuple[tuple[str, str], ...]

# A code point UTF-8 cannot encode: a lone surrogate, which a JSON string (the model a gateway
# reports) may hold as `\ud800`.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

OTHER = "other"
"""The label value of everything past a label's bounded set of values."""
CLAUDE_ERROR_TYPES = frozenset(
    {
        # The Messages API's error types (https://docs.claude.com/en/api/errors).
        "invalid_request_error",
        "authentication_error",
        "billing_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "overloaded_error",
        # The proxy's own, for what the API did not name.
        "timeout",
        "client_error",
        "connection_error",
        "credentials_unavailable",
        "name_resolution",
        "incomplete_stream",
        "malformed_response",
        "unknown",
    }
)
"""The `type` label values of `mcp_backfill_claude_attempts_total`: anything else a provider or a
gateway reports counts as `other` (besides an HTTP status, 100-599, for an error without a type),
so a gateway inventing error types cannot grow `/metrics` and the process's memory without bound."""
MODEL_LABELS = 32
"""How many model ids besides the operator's (`--model`, `--allowed-models`) the `model` label
names; the model is the one the response reports (a gateway's may be anything), and the ones
past the first `MODEL_LABELS` count as `other`."""
MODEL_LABEL_CHARACTERS = 200
"""The longest a `model` label value a response reported is (a Bedrock inference profile's ARN
is about 100): a longer one is cut, ending in an ellipsis, so that a gateway naming models of a
megabyte cannot make every scrape (and the process's memory) that large. The operator's own models
are shown as given."""


def labels_key(**labels: str) -> Labels:
    """A series' key: its labels' pairs, sorted by name (`Counter.add` takes one made once)."""
    return tuple(sorted(labels.items()))


def _labels(labels: Labels, extra: Labels = ()) -> str:
    pairs = (*labels, *extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def _escape(value: str) -> str:
    if not value.isascii():  # a lone surrogate cannot be written in UTF-8 (the whole scrape failed)
        value = _LONE_SURROGATE.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class Counter:
    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.add(labels_key(**labels), amount)

    def add(self, key: Labels, amount: float = 1.0) -> None:
        """`inc` by the labels' key (their pairs, sorted by name), made once by a caller that counts
        the same series on every message."""
        self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(labels)} {_number(value)}"


@dataclass
class Gauge:
    """A value read when the metrics are scraped (`kind` "counter" for a total kept elsewhere)."""

    name: str
    help: str
    read: Callable[[], Iterable[tuple[Labels, float]]]
    kind: str = "gauge"

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.read():
            yield f"{self.name}{_labels(labels)} {_number(value)}"


@dataclass
class _Series:
    counts: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class Histogram:
    name: str
    help: str
    buckets: Sequence[float]
    series: dict[Labels, _Series] = field(default_factory=dict)

    def observe(self, value: float, **labels: str) -> None:
        key = labels_key(**labels)
        series = self.series.setdefault(key, _Series([0] * len(self.buckets)))
        index = bisect_left(self.buckets, value)
        if index < len(self.buckets):
            series.counts[index] += 1
        series.total += value
        series.count += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, series in sorted(self.series.items()):
            cumulative = 0
            for bound, count in zip(self.buckets, series.counts, strict=True):
                cumulative += count
                yield f"{self.name}_bucket{_labels(labels, (('le', _number(bound)),))} {cumulative}"
            yield f"{self.name}_bucket{_labels(labels, (('le', '+Inf'),))} {series.count}"
            yield f"{self.name}_sum{_labels(labels)} {_number(series.total)}"
            yield f"{self.name}_count{_labels(labels)} {series.count}"


def _error_type_label(error_type: object) -> str:
    if not error_type:
        return ""
    if not isinstance(error_type, str):
        return OTHER
    if error_type in CLAUDE_ERROR_TYPES:
        return error_type
    if error_type.isascii() and error_type.isdigit() and 100 <= int(error_type) <= 599:
        return error_type
    return OTHER


FORWARDED_CLIENT = "forwarded"


def client_label(identity: str) -> str:
    """A client identity as a label value: its name, or `forwarded` for every caller told apart by a
    forwarded Authorization header (digests are unbounded; a label must not be)."""
    return FORWARDED_CLIENT if identity.startswith(FORWARDED_PREFIX) else identity


class Metrics:
    """Everything `/metrics` shows; also the sampler's observer (`sampling_done`)."""

    def __init__(self, models: Iterable[str] = ()) -> None:
        self._models = set(models)
        self._other_models = 0
        self.messages = Counter(
            "mcp_backfill_messages_total",
            "JSON-RPC messages (or batches) relayed, by direction "
            "(from_client, to_client, from_upstream, to_upstream)",
        )
        self.http_requests = Counter(
            "mcp_backfill_http_requests_total", "HTTP requests answered, by method and status code"
        )
        self.sampling_requests = Counter(
            "mcp_backfill_sampling_requests_total",
            "sampling requests the proxy handled, by outcome (answered, refused, failed, timed_out, "
            "cancelled), model and paying client",
        )
        self.tokens = Counter(
            "mcp_backfill_sampling_tokens_total",
            "tokens charged to the budgets for the proxy's Claude calls, however they ended, by usage "
            "counter (input_tokens, cache_creation_input_tokens, cache_read_input_tokens, "
            "output_tokens), model and paying client; their sum is what the budgets count",
        )
        self.attempts = Counter(
            "mcp_backfill_claude_attempts_total",
            "attempts at a Claude API call, by outcome (ok; retried: failed, another attempt follows; "
            "failed: the call gave up; cancelled: the request was cancelled while it ran, or before its "
            "retry was made) and error type (the API's, e.g. overloaded_error, or timeout)",
        )
        self.latency = Histogram(
            "mcp_backfill_claude_latency_seconds",
            "time to answer one sampling request through Claude (requests refused before any call "
            "are not counted), by model",
            LATENCY_BUCKETS,
        )
        self.store_seconds = Histogram(
            "mcp_backfill_state_store_seconds",
            "time one operation on the shared state store took, by operation",
            STORE_BUCKETS,
        )
        self.store_errors = Counter(
            "mcp_backfill_state_store_errors_total",
            "operations on the shared state store that failed (unreachable or timed out), by operation",
        )
        self._gauges: list[Gauge] = []

    def gauge(
        self,
        name: str,
        help_text: str,
        read: Callable[[], Iterable[tuple[Labels, float]]],
        kind: str = "gauge",
    ) -> None:
        self._gauges.append(Gauge(name, help_text, read, kind))

    def sampling_done(
        self, *, outcome: str, model: str, latency: float | None, tokens: Mapping[str, int], client: str
    ) -> None:
        payer = client_label(client)
        model = self._model_label(model)
        self.sampling_requests.inc(outcome=outcome, model=model, client=payer)
        if latency is not None:  # a Claude call was made: the histogram is the time through Claude
            self.latency.observe(latency, model=model)
        for counter, count in tokens.items():
            if count:
                self.tokens.inc(count, counter=counter, model=model, client=payer)

    def attempt_done(self, *, provider: str, outcome: str, error_type: str | None) -> None:
        self.attempts.inc(outcome=outcome, type=_error_type_label(error_type), provider=provider)

    def _model_label(self, model: object) -> str:
        if not isinstance(model, str):
            return OTHER
        if not model.isascii():  # as `_escape` writes it: one series for the names written alike
            model = _LONE_SURROGATE.sub("\ufffd", model)
        if model in self._models:
            return model
        if len(model) > MODEL_LABEL_CHARACTERS:
            model = model[: MODEL_LABEL_CHARACTERS - 1] + "…"
            if model in self._models:
                return model
        if self._other_models < MODEL_LABELS:
            self._other_models += 1
            self._models.add(model)
            return model
        return OTHER

    def store_call(self, operation: str, seconds: float, ok: bool) -> None:
        self.store_seconds.observe(seconds, operation=operation)
        if not ok:
            self.store_errors.inc(operation=operation)

    def render(self) -> str:
        lines: list[str] = []
        counters = (
            self.messages,
            self.http_requests,
            self.sampling_requests,
            self.tokens,
            self.attempts,
            self.store_errors,
        )
        for counter in counters:
            lines.extend(counter.render())
        lines.extend(self.latency.render())
        lines.extend(self.store_seconds.render())
        for gauge in self._gauges:
            lines.extend(gauge.render())
        return "\n".join(lines) + "\n"
