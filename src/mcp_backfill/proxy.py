"""The stdio wrapper: this process's stdin/stdout <-> relay <-> the upstream server.

The upstream is a child process or a streamable-HTTP endpoint (`--upstream-url`); the lifecycle is
the same for both, only what "stopping the upstream" means differs.

* Child: client EOF or SIGTERM/SIGINT close the upstream (stdin close -> SIGTERM -> SIGKILL); the
  upstream exiting ends the session, pending client requests are answered with errors, and the
  proxy exits with the upstream's status.
* HTTP: client EOF or a signal let requests in flight finish (up to --shutdown-grace; the rest are
  answered with errors), then DELETE the upstream session. An HTTP upstream never "exits": when it is
  unreachable or loses the session, each affected request is answered with a JSON-RPC error and the
  proxy keeps serving. The exit status is 0, or 1 when the upstream was unreachable or its session
  expired at some point (already reported on the wire and in the log).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio

from mcp_backfill.config import Config, upstream_environment
from mcp_backfill.logs import get_logger
from mcp_backfill.providers import make_provider
from mcp_backfill.relay import Relay, RelayOptions
from mcp_backfill.sampling.audit import AuditLog
from mcp_backfill.sampling.convert import ConversionOptions
from mcp_backfill.sampling.limits import RequestLimits
from mcp_backfill.sampling.sampler import Sampler, SamplerSettings, SamplingObserver
from mcp_backfill.sampling.spend import SamplingSession, Spend, SpendSettings
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_client import HttpUpstreamSettings, display_url, open_http_upstream
from mcp_backfill.transports.stdio import own_stdio, spawn_upstream

log = get_logger("proxy")


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


@asynccontextmanager
async def _auditing(audit: AuditLog | None) -> AsyncIterator[None]:
    if audit is None:
        yield
        return
    async with audit.running():
        yield


class UpstreamLeg(Protocol):
    """The upstream side of a session: its channel, and how to end it (returns the exit status)."""

    @property
    def channel(self) -> MessageChannel: ...

    async def stop(self, grace: float) -> int: ...


@asynccontextmanager
async def open_upstream(config: Config) -> AsyncIterator[tuple[UpstreamLeg, dict[str, Any]]]:
    """The configured upstream (a child process or an HTTP endpoint), and what to log about it."""
    if config.upstream_url is not None:
        settings = HttpUpstreamSettings(
            url=config.upstream_url,
            headers=config.upstream_headers,
            max_message_bytes=config.max_message_bytes,
        )
        async with open_http_upstream(settings) as http:
            yield http, {"upstream_url": display_url(config.upstream_url)}
        return
    async with spawn_upstream(
        config.upstream_command,
        upstream_environment(os.environ),
        config.max_message_bytes,
        config.shutdown_grace,
    ) as process:
        yield process, {"upstream": list(config.upstream_command), "pid": process.pid}


async def run_stdio_proxy(config: Config) -> int:
    """Run one stdio session to completion and return the exit status to use."""
    sampler = make_sampler(config)
    try:
        async with (
            _auditing(sampler.audit),
            own_stdio(config.max_message_bytes) as client,
            open_upstream(config) as (upstream, about),
        ):
            log.info("relaying", extra={**about, "mode": config.mode, "provider": config.provider})
            session = sampler.spend.new_session("stdio")
            status = await relay_session(config, sampler, session, client, upstream)
            log.info("sampling spend", extra={"spend": sampler.spend.snapshot(), **session.snapshot()})
            return status
    finally:
        await sampler.provider.aclose()


async def relay_session(
    config: Config, sampler: Sampler, session: SamplingSession, client: MessageChannel, upstream: UpstreamLeg
) -> int:
    """Relay until the upstream side ends; client EOF and signals stop the upstream first."""
    relay = Relay(relay_options(config), sampler, client, upstream.channel, session=session)
    stopping = anyio.Event()

    async def stop_upstream() -> None:
        stopping.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, stopping)
        tg.start_soon(_stop_when_asked, stopping, upstream, config.shutdown_grace)
        await relay.run(on_client_closed=stop_upstream)
        # The upstream side ended: let it exit, or stop it the usual way.
        status = await upstream.stop(config.shutdown_grace)
        if not stopping.is_set():
            log.error("upstream server exited", extra={"status": status})
            await relay.fail_pending(f"Upstream MCP server exited (status {status})")
        tg.cancel_scope.cancel()
    return status


async def _watch_signals(stopping: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal received; shutting down", extra={"signal": signal.Signals(signum).name})
            stopping.set()


async def _stop_when_asked(stopping: anyio.Event, upstream: UpstreamLeg, grace: float) -> None:
    await stopping.wait()
    await upstream.stop(grace)
