"""Label values a provider or gateway chooses stay a bounded set on `/metrics`."""

from __future__ import annotations

import pytest

from mcp_backfill.sidecar.metrics import MODEL_LABEL_CHARACTERS, MODEL_LABELS, Metrics
from tests.defaults import CONFIG


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_error_types_a_gateway_invents_count_as_other() -> None:
    metrics = Metrics()
    for n in range(500):
        metrics.attempt_done(provider="anthropic", outcome="retried", error_type=f"gateway_error_{n}")
    metrics.attempt_done(provider="anthropic", outcome="retried", error_type="overloaded_error")
    metrics.attempt_done(provider="anthropic", outcome="failed", error_type="timeout")
    metrics.attempt_done(provider="anthropic", outcome="failed", error_type="502")
    metrics.attempt_done(provider="anthropic", outcome="failed", error_type="99999999")
    metrics.attempt_done(provider="anthropic", outcome="ok", error_type=None)
    lines = _series(metrics.render(), "mcp_backfill_claude_attempts_total")
    attempts = "mcp_backfill_claude_attempts_total"
    assert f'{attempts}{{outcome="retried",provider="anthropic",type="other"}} 500' in lines
    assert any('type="overloaded_error"' in line for line in lines)
    assert any('type="timeout"' in line for line in lines)
    assert any('type="502"' in line for line in lines)  # a status without a type: bounded (100-599)
    assert f'{attempts}{{outcome="failed",provider="anthropic",type="other"}} 1' in lines
    assert len(lines) == 6


def test_every_error_type_the_providers_name_is_a_label_of_its_own() -> None:
    """The types the proxy's providers give their own errors are in the label set, not `other`."""
    import re
    from pathlib import Path

    import mcp_backfill.providers.anthropic as provider

    source = Path(provider.__file__).read_text()
    named = set(re.findall(r'"provider": self\.name, "type": "([a-z_]+)"', source))
    named |= set(re.findall(r'\n\s+"([a-z_]+)",\n\s+request_id,', source))
    assert {"credentials_unavailable", "client_error", "connection_error"} <= named
    metrics = Metrics()
    for error_type in sorted(named):
        metrics.attempt_done(provider="vertex", outcome="retried", error_type=error_type)
    lines = _series(metrics.render(), "mcp_backfill_claude_attempts_total")
    assert not [line for line in lines if 'type="other"' in line], lines


def test_model_ids_a_gateway_reports_are_bounded() -> None:
    metrics = Metrics(models=("claude-sonnet-4-5",))
    for n in range(1000):
        metrics.sampling_done(
            outcome="answered", model=f"gw-model-{n}", latency=0.1, tokens={"output_tokens": 1}, client="a"
        )
    metrics.sampling_done(
        outcome="answered", model="claude-sonnet-4-5", latency=0.1, tokens={"output_tokens": 1}, client="a"
    )
    text = metrics.render()
    requests = _series(text, "mcp_backfill_sampling_requests_total")
    assert len(requests) == MODEL_LABELS + 2  # the operator's model, MODEL_LABELS others, then `other`
    assert any('model="claude-sonnet-4-5"' in line for line in requests)
    assert any('model="other"' in line and line.endswith(f" {1000 - MODEL_LABELS}") for line in requests)
    latency = "mcp_backfill_claude_latency_seconds_count"
    counts = [line for line in text.splitlines() if line.startswith(latency)]
    assert len(counts) == MODEL_LABELS + 2
    assert len(_series(text, "mcp_backfill_sampling_tokens_total")) == MODEL_LABELS + 2


def test_a_model_id_a_gateway_reports_is_cut_to_a_bounded_length() -> None:
    metrics = Metrics(models=("claude-sonnet-4-5",))
    huge = "m" * 1_000_000  # a gateway's JSON may name any model, of any length
    for model in (huge, huge + "-other"):
        metrics.sampling_done(
            outcome="answered", model=model, latency=0.1, tokens={"output_tokens": 1}, client="a"
        )
    text = metrics.render()
    assert len(text) < 10 * MODEL_LABEL_CHARACTERS + 10_000
    requests = _series(text, "mcp_backfill_sampling_requests_total")
    cut = "m" * (MODEL_LABEL_CHARACTERS - 1) + "…"
    # Both names begin alike: one series for the two, with the length a label has at most.
    assert requests == [
        f'mcp_backfill_sampling_requests_total{{client="a",model="{cut}",outcome="answered"}} 2'
    ]


def test_a_model_that_is_no_string_does_not_break_the_scrape() -> None:
    metrics = Metrics()
    metrics.sampling_done(
        outcome="answered",
        model={"id": "x"},  # type: ignore[arg-type]  # what a gateway's JSON may hold
        latency=0.1,
        tokens={"output_tokens": 1},
        client="a",
    )
    assert 'model="other"' in metrics.render()


@pytest.mark.anyio
async def test_a_response_model_that_is_no_string_is_not_reported_or_relayed() -> None:
    from tests.unit.test_sampler_ledger import PARAMS, Scripted, paused, sampler_for

    message = paused(1, "end_turn")
    message["model"] = {"id": "gateway"}
    sampler, _ = sampler_for(Scripted(message))
    heard: list[object] = []

    class Hears:
        def sampling_done(self, *, model: str, **_: object) -> None:
            heard.append(model)

    sampler.observer = Hears()
    result = await sampler.sample(dict(PARAMS))
    assert result["model"] == CONFIG.model  # the model the proxy asked for
    assert heard == [CONFIG.model]


@pytest.mark.anyio
async def test_the_latency_histogram_counts_only_requests_that_went_to_claude() -> None:
    """`mcp_backfill_claude_latency_seconds` is "the time to answer one sampling request through
    Claude" (deploy/observability/README.md; the dashboard's percentiles and the slow-sampling alert):
    a request refused before any call (here by the budget) is a sampling request, not a latency."""
    from dataclasses import replace

    from mcp_backfill import assembly
    from mcp_backfill.errors import SamplingError
    from mcp_backfill.options import Allowance
    from mcp_backfill.sampling.sampler import Sampler
    from mcp_backfill.sampling.spend import Spend
    from tests.defaults import SPEND
    from tests.unit.test_sampler_ledger import PARAMS, Scripted, paused

    metrics = Metrics()
    spend = Spend(replace(SPEND, rate_limit=0, budget=(Allowance(40),)))
    sampler = Sampler(
        Scripted(paused(5, "end_turn")), assembly.sampler_settings(CONFIG), spend=spend, observer=metrics
    )
    await sampler.sample(dict(PARAMS))
    for _ in range(3):
        with pytest.raises(SamplingError, match="budget is exhausted"):
            await sampler.sample(dict(PARAMS))
    text = metrics.render()
    outcomes = _series(text, "mcp_backfill_sampling_requests_total")
    assert any('outcome="refused"' in line and line.endswith(" 3") for line in outcomes), outcomes
    counts = _series(text, "mcp_backfill_claude_latency_seconds_count")
    assert [line.rsplit(" ", 1)[1] for line in counts] == ["1"], counts


def test_model_names_with_lone_surrogates_are_one_series_written_in_utf8() -> None:
    """A gateway's JSON may report a model with a lone surrogate (`\\ud800`): the scrape is still
    UTF-8, and two names written alike (U+FFFD) are one series, not two lines with the same labels."""
    metrics = Metrics()
    for model in ("gw-\ud800", "gw-\udfff", "gw-\ufffd"):
        metrics.sampling_done(outcome="answered", model=model, latency=0.1, tokens={}, client="a")
    text = metrics.render().encode("utf-8").decode("utf-8")
    assert _series(text, "mcp_backfill_sampling_requests_total") == [
        'mcp_backfill_sampling_requests_total{client="a",model="gw-\ufffd",outcome="answered"} 3'
    ]
