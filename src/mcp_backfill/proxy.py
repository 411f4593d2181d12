"""The stdio wrapper: this process's stdin/stdout <-> relay <-> the upstream server as a child.

Lifecycle: client EOF or SIGTERM/SIGINT close the upstream (stdin close -> SIGTERM -> SIGKILL);
the upstream exiting ends the session, pending client requests are answered with errors, and the
proxy exits with the upstream's status.
"""

from __future__ import annotations

import os
import signal

import anyio

from mcp_backfill.config import Config, upstream_environment
from mcp_backfill.logs import get_logger
from mcp_backfill.providers import make_provider
from mcp_backfill.relay import Relay, RelayOptions
from mcp_backfill.sampling.convert import ConversionOptions
from mcp_backfill.sampling.sampler import Sampler, SamplerSettings, SamplingObserver
from mcp_backfill.transports.stdio import UpstreamProcess, own_stdio, spawn_upstream

log = get_logger("proxy")


def make_sampler(config: Config, observer: SamplingObserver | None = None) -> Sampler:
    return Sampler(
        make_provider(config),
        SamplerSettings(
            conversion=ConversionOptions(max_tokens_cap=config.max_tokens_cap, audio=config.audio),
            default_model=config.model,
            allowed_models=config.allowed_models,
        ),
        observer,
    )


def relay_options(config: Config) -> RelayOptions:
    return RelayOptions(
        mode=config.mode,
        era=config.era,
        max_input_rounds=config.max_input_rounds,
        input_stash_ttl=config.input_stash_ttl,
    )


async def run_stdio_proxy(config: Config) -> int:
    """Run one stdio session to completion and return the exit status to use."""
    sampler = make_sampler(config)
    try:
        async with (
            own_stdio(config.max_message_bytes) as client,
            spawn_upstream(
                config.upstream_command,
                upstream_environment(os.environ),
                config.max_message_bytes,
                config.shutdown_grace,
            ) as upstream,
        ):
            log.info(
                "relaying",
                extra={
                    "upstream": list(config.upstream_command),
                    "pid": upstream.pid,
                    "mode": config.mode,
                    "provider": config.provider,
                },
            )
            relay = Relay(relay_options(config), sampler, client, upstream.channel)
            stopping = anyio.Event()

            async def stop_upstream() -> None:
                stopping.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_signals, stopping)
                tg.start_soon(_stop_when_asked, stopping, upstream, config.shutdown_grace)
                await relay.run(on_client_closed=stop_upstream)
                # The upstream closed its stdout: let it exit, or stop it the usual way.
                status = await upstream.stop(config.shutdown_grace)
                if not stopping.is_set():
                    log.error("upstream server exited", extra={"status": status})
                    await relay.fail_pending(f"Upstream MCP server exited (status {status})")
                tg.cancel_scope.cancel()
            return status
    finally:
        await sampler.provider.aclose()


async def _watch_signals(stopping: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal received; shutting down", extra={"signal": signal.Signals(signum).name})
            stopping.set()


async def _stop_when_asked(stopping: anyio.Event, upstream: UpstreamProcess, grace: float) -> None:
    await stopping.wait()
    await upstream.stop(grace)
