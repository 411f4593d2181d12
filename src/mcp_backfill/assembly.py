"""The wiring both fronts share: the sampler, the relay's options and the upstream, built from `Config`.

The stdio front (`stdio_front`) and the HTTP sidecar (`sidecar.server`) differ in how clients reach
the proxy; everything they build from the configuration is built here, once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from mcp_backfill.config import Config, upstream_environment
from mcp_backfill.providers import make_provider
from mcp_backfill.relay import RelayOptions
from mcp_backfill.sampling.audit import AuditLog
from mcp_backfill.sampling.convert import ConversionOptions
from mcp_backfill.sampling.limits import RequestLimits
from mcp_backfill.sampling.sampler import Sampler, SamplerSettings, SamplingObserver
from mcp_backfill.sampling.spend import Spend, SpendSettings
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_upstream import HttpUpstreamSettings, display_url, open_http_upstream
from mcp_backfill.transports.stdio import UpstreamProcess, spawn_upstream


def make_sampler(config: Config, observer: SamplingObserver | None = None) -> Sampler:
    """The sampler with the configured limits, spending controls and audit log.

    Raises `ConfigError` when the audit log cannot be opened, before anything else is started.
    """
    audit = (
        AuditLog(config.audit_log, include_content=config.audit_content, secrets=config.secrets())
        if config.audit_log
        else None
    )
    return Sampler(
        make_provider(config),
        SamplerSettings(
            conversion=ConversionOptions(
                max_tokens_cap=config.max_tokens_cap, audio=config.audio, prompt_cache=config.prompt_cache
            ),
            default_model=config.model,
            allowed_models=config.allowed_models,
            limits=RequestLimits(
                max_messages=config.max_messages,
                max_text_bytes=config.max_text_bytes,
                max_binary_bytes=config.max_binary_bytes,
                max_tools=config.max_tools,
                max_tool_calls=config.max_tool_calls,
            ),
        ),
        spend=Spend(
            SpendSettings(
                rate_limit=config.rate_limit,
                max_concurrent=config.max_concurrent_sampling,
                budget_tokens=config.budget_tokens,
                session_budget_tokens=config.session_budget_tokens,
            )
        ),
        audit=audit,
        observer=observer,
    )


def relay_options(config: Config) -> RelayOptions:
    return RelayOptions(
        mode=config.mode,
        era=config.era,
        max_input_rounds=config.max_input_rounds,
        input_stash_ttl=config.input_stash_ttl,
    )


class UpstreamLeg(Protocol):
    """The upstream side of a session: its channel, and how to end it (returns the exit status)."""

    @property
    def channel(self) -> MessageChannel: ...

    async def stop(self, grace: float) -> int: ...


@asynccontextmanager
async def open_upstream(config: Config) -> AsyncIterator[tuple[UpstreamLeg, dict[str, Any]]]:
    """The configured upstream (a child process or an HTTP endpoint), and what to log about it."""
    if config.upstream_url is not None:
        async with open_http_upstream(http_upstream_settings(config)) as http:
            yield http, {"upstream_url": display_url(config.upstream_url)}
        return
    async with spawn_child(config) as process:
        yield process, {"upstream": list(config.upstream_command), "pid": process.pid}


def http_upstream_settings(
    config: Config, extra_headers: tuple[tuple[str, str], ...] = ()
) -> HttpUpstreamSettings:
    """How to reach `--upstream-url`; `extra_headers` go after the configured ones."""
    assert config.upstream_url is not None
    return HttpUpstreamSettings(
        url=config.upstream_url,
        headers=(*config.upstream_headers, *extra_headers),
        max_message_bytes=config.max_message_bytes,
    )


@asynccontextmanager
async def spawn_child(config: Config) -> AsyncIterator[UpstreamProcess]:
    """The upstream command as a child process, without the proxy's credentials in its environment."""
    async with spawn_upstream(
        config.upstream_command,
        upstream_environment(os.environ),
        config.max_message_bytes,
        config.shutdown_grace,
    ) as process:
        yield process
