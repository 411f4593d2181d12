"""The wiring both fronts share: the sampler, the relay's options and the upstream, built from `Config`.

The stdio front (`stdio_front`) and the HTTP sidecar (`sidecar.server`) differ in how clients reach
the proxy; everything they build from the configuration is built here, once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from mcp_backfill.config import Config, upstream_environment, upstream_header_secrets
from mcp_backfill.credentials import shown_args
from mcp_backfill.providers import ProviderSettings, make_provider
from mcp_backfill.providers.retry import RetryPolicy
from mcp_backfill.relay import RelayOptions
from mcp_backfill.relay.input_required import request_state_key
from mcp_backfill.sampling.audit import AuditLog
from mcp_backfill.sampling.convert import ConversionOptions
from mcp_backfill.sampling.limits import RequestLimits
from mcp_backfill.sampling.provider import AttemptObserver
from mcp_backfill.sampling.sampler import Sampler, SamplerSettings, SamplingObserver
from mcp_backfill.sampling.spend import Spend, SpendSettings
from mcp_backfill.sampling.store import LedgerStore
from mcp_backfill.stores import open_store
from mcp_backfill.transports.base import MessageChannel, nothing_elsewhere
from mcp_backfill.transports.child import StartedChild
from mcp_backfill.transports.stdio import UpstreamProcess, spawn_upstream

if TYPE_CHECKING:  # imported when used: a child upstream's startup does without httpx2 (~100 ms)
    from mcp_backfill.transports.http_upstream import HttpUpstreamSettings


def make_sampler(
    config: Config, observer: SamplingObserver | None = None, attempts: AttemptObserver | None = None
) -> Sampler:
    """The sampler with the configured provider, limits, spending controls and audit log;
    `observer` hears of every sampling request, `attempts` of every attempt at a Claude call.

    Raises `ConfigError` when the audit log cannot be opened, before anything is relayed (the stdio
    wrapper's upstream may have started: it is stopped then).
    """
    audit = (
        AuditLog(config.audit_log, include_content=config.audit_content, secrets=config.secrets())
        if config.audit_log
        else None
    )
    return Sampler(
        make_provider(provider_settings(config), attempts),
        sampler_settings(config),
        spend=Spend(spend_settings(config), ledger_store(config)),
        audit=audit,
        observer=observer,
    )


# -- the domain's settings, each read from `Config` here and nowhere else ------------------------


def sampler_settings(config: Config) -> SamplerSettings:
    return SamplerSettings(
        conversion=conversion_options(config),
        default_model=config.model,
        allowed_models=config.allowed_models,
        limits=request_limits(config),
        allow_model_upgrade=config.allow_model_upgrade,
    )


def conversion_options(config: Config) -> ConversionOptions:
    return ConversionOptions(
        max_tokens_cap=config.max_tokens_cap, audio=config.audio, prompt_cache=config.prompt_cache
    )


def request_limits(config: Config) -> RequestLimits:
    return RequestLimits(
        max_messages=config.max_messages,
        max_text_bytes=config.max_text_bytes,
        max_binary_bytes=config.max_binary_bytes,
        max_tools=config.max_tools,
        max_tool_calls=config.max_tool_calls,
        max_content_blocks=config.max_content_blocks,
    )


def spend_settings(config: Config) -> SpendSettings:
    """The ledger's settings; a client's own rate limit and slots default to half the process's when
    clients are told apart, and to none of their own (the process's apply) when there is one."""
    several = clients_told_apart(config)
    return SpendSettings(
        rate_limit=config.rate_limit,
        max_concurrent=config.max_concurrent_sampling,
        budget=config.budget_tokens,
        session_budget=config.session_budget_tokens,
        client_budget=config.client_budget_tokens,
        client_rate_limit=config.client_rate_limit or (-(-config.rate_limit // 2) if several else 0),
        client_max_concurrent=config.client_max_concurrent_sampling
        or (-(-config.max_concurrent_sampling // 2) if several else 0),
        store_outage=config.state_store_outage,
        max_waiting=config.max_waiting_sampling,
    )


def ledger_store(config: Config) -> LedgerStore:
    """Where the ledger counts (`--state-store`); raises `ConfigError` for a URL it cannot use."""
    url = config.state_store.value if config.state_store is not None else "memory"
    return open_store(url, lease_seconds=config.state_store_lease, timeout=config.state_store_timeout)


def client_session_rate(config: Config) -> int:
    """Upstream starts a minute for one client (its new sessions and its 2026-07-28 upstream's
    starts): `--client-session-rate`, else 60 when clients are told apart, else no limit (0)."""
    return config.client_session_rate or (60 if clients_told_apart(config) else 0)


def clients_told_apart(config: Config) -> bool:
    """Can requests come from more than one client identity (see the README's "Who pays")?"""
    return config.front == "http" and (config.forward_authorization or bool(config.client_tokens))


def retry_policy(config: Config) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=config.retry_max_attempts,
        base_delay=config.retry_base_delay,
        max_delay=config.retry_max_delay,
        deadline=config.sampling_timeout or None,
    )


def provider_settings(config: Config) -> ProviderSettings:
    return ProviderSettings(
        name=config.provider,
        retry=retry_policy(config),
        secrets=config.secrets(),
        api_key=config.api_key.value if config.api_key else None,
        base_url=config.api_base_url,
        headers=config.api_headers,
        vertex_access_token=config.vertex_access_token.value if config.vertex_access_token else None,
        bedrock_api_key=config.bedrock_api_key.value if config.bedrock_api_key else None,
    )


def relay_options(config: Config) -> RelayOptions:
    return RelayOptions(
        mode=config.mode,
        era=config.era,
        max_input_rounds=config.max_input_rounds,
        max_batch_messages=config.max_batch_messages,
        input_stash_ttl=config.input_stash_ttl,
        task_ttl_max=config.task_ttl_max,
        approve=config.approve,
        approve_timeout=config.approve_timeout,
        warm_up=config.warm_up,
        request_state_key=(
            request_state_key(config.request_state_key.value) if config.request_state_key else None
        ),
    )


class UpstreamLeg(Protocol):
    """The upstream side of a session (a child process or an HTTP session): its channel, and how to
    end it.

    `stop` ends it in the same order for both: first it waits, up to `grace` seconds in all, until
    no request is in flight that still needs the upstream open, neither one `in_flight_elsewhere()`
    says the proxy drives (`Relay.drives_rounds`: the rounds it answers itself, whose request is
    sent again upstream) nor, for an HTTP session, a POST of its own (a child finishes its own
    requests after its stdin closes); then it ends the upstream its way and returns the exit status.
    Idempotent. `stop_reason` is then what the requests the stop cut short are told, or None when
    the upstream's exit is what they are told about.
    """

    @property
    def channel(self) -> MessageChannel: ...

    @property
    def stop_reason(self) -> str | None: ...

    async def stop(
        self, grace: float, *, in_flight_elsewhere: Callable[[], bool] = nothing_elsewhere
    ) -> int: ...


@asynccontextmanager
async def open_upstream(
    config: Config, started: StartedChild | None = None
) -> AsyncIterator[tuple[UpstreamLeg, dict[str, Any]]]:
    """The configured upstream (a child process, `started` already or not, or an HTTP endpoint), and
    what to log about it."""
    if config.upstream_url is not None:
        from mcp_backfill.transports.http_upstream import display_url, open_http_upstream

        async with open_http_upstream(http_upstream_settings(config)) as http:
            yield http, {"upstream_url": display_url(config.upstream_url)}
        return
    async with spawn_child(config, started) as process:
        yield process, {"upstream": shown_args(config.upstream_command), "pid": process.pid}


def http_upstream_settings(
    config: Config, extra_headers: tuple[tuple[str, str], ...] = ()
) -> HttpUpstreamSettings:
    """How to reach `--upstream-url`; `extra_headers` go after the configured ones."""
    from mcp_backfill.transports.http_upstream import HttpUpstreamSettings

    assert config.upstream_url is not None
    return HttpUpstreamSettings(
        url=config.upstream_url,
        headers=(*config.upstream_headers, *extra_headers),
        max_message_bytes=config.max_message_bytes,
        secrets=config.secrets() + upstream_header_secrets(extra_headers),
    )


@asynccontextmanager
async def spawn_child(config: Config, started: StartedChild | None = None) -> AsyncIterator[UpstreamProcess]:
    """The upstream command as a child process, without the proxy's credentials in its environment."""
    async with spawn_upstream(
        config.upstream_command,
        upstream_environment(os.environ),
        config.max_message_bytes,
        config.shutdown_grace,
        started,
    ) as process:
        yield process
