"""The stdio wrapper: this process's stdin/stdout <-> relay <-> the upstream server.

The upstream is a child process or a streamable-HTTP endpoint (`--upstream-url`); the lifecycle is
the same for both, only what "stopping the upstream" means differs.

* Child: client EOF, SIGTERM, SIGINT or SIGHUP close the upstream (stdin close -> SIGTERM -> SIGKILL),
  once the 2026-07-28 requests whose rounds the proxy answers have finished (up to --shutdown-grace);
  the upstream exiting ends the session, pending client requests are answered with errors, and the
  proxy exits with the upstream's status.
* HTTP: client EOF or a signal let requests in flight finish (up to --shutdown-grace; the rest are
  answered with errors), then DELETE the upstream session. An HTTP upstream never "exits": when it is
  unreachable or loses the session, each affected request is answered with a JSON-RPC error and the
  proxy keeps serving. The exit status is 0, or 1 when the upstream was unreachable or its session
  expired at some point (already reported on the wire and in the log).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio

from mcp_backfill import telemetry
from mcp_backfill.assembly import UpstreamLeg, make_sampler, open_upstream, relay_options
from mcp_backfill.config import Config
from mcp_backfill.logs import get_logger
from mcp_backfill.options import shutting_down
from mcp_backfill.relay import Relay, UpstreamAtOnce
from mcp_backfill.sampling.audit import auditing
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import SamplingSession
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.child import STOP_SIGNALS, HeldSignals, StartedChild
from mcp_backfill.transports.stdio import LineChannel, own_stdio

log = get_logger("proxy")


async def run_stdio_proxy(
    config: Config, started: StartedChild | None = None, held: HeldSignals | None = None
) -> int:
    """Run one stdio session to completion and return the exit status to use; the upstream command
    may have been `started` already, and stop signals `held` since (see `cli`)."""
    sampler = make_sampler(config)
    tracing = telemetry.install_from_environment()
    own_held = held is None  # run without `cli`: the shutdown's signals are held all the same
    held = HeldSignals() if held is None else held
    try:
        async with (
            auditing(sampler.audit),
            sampler.spend.upkeep(),
            own_stdio(config.max_message_bytes) as client,
            open_upstream(config, started) as (upstream, about),
        ):
            log.info("relaying", extra={**about, "mode": config.mode, "provider": config.provider})
            session = sampler.spend.new_session("stdio")
            status = await relay_session(config, sampler, session, client, upstream, held)
            log.debug("relay ended; finishing the shutdown", extra={"status": status})
        _summary(sampler)  # once the audit log is closed: the lines of the last exchanges are counted
        return status
    finally:
        await sampler.provider.aclose()
        tracing.shutdown()
        if own_held:
            held.restore()


def _summary(sampler: Sampler) -> None:
    budget = sampler.spend.budget
    dropped = sampler.audit.dropped if sampler.audit is not None else 0
    if budget.exchanges or sampler.spend.refused or dropped:  # nothing to say otherwise
        summary: dict[str, object] = {"calls": budget.exchanges, "tokens": budget.used}
        if sampler.spend.refused:
            summary["refused"] = sampler.spend.refused  # by the limit that refused
        if dropped:
            summary["audit_lines_dropped"] = dropped
        log.info("sampling summary", extra=summary)


async def relay_session(
    config: Config,
    sampler: Sampler,
    session: SamplingSession,
    client: MessageChannel,
    upstream: UpstreamLeg,
    held: HeldSignals | None = None,
) -> int:
    """Relay until the upstream side ends; client EOF and signals stop the upstream first."""
    relay = Relay(relay_options(config), sampler, client, upstream.channel, session=session)
    sides = ((client, relay.from_client_now), (upstream.channel, relay.from_upstream_now))
    for channel, at_once in sides:
        if isinstance(channel, LineChannel):
            channel.offload_writes(relay.crowded)  # see transports/pipe_writer.py
            channel.deliver_at_once(at_once)  # relayed from the read callback when it can be (relay.Relay)
    if config.upstream_url is not None:  # (imported by then: `open_upstream` opened it)
        from mcp_backfill.transports.http_upstream import HttpUpstream

        if isinstance(upstream.channel, HttpUpstream):  # its answers read from the callback too
            upstream.channel.deliver_at_once(UpstreamAtOnce(relay))
    stopping = anyio.Event()

    async def stop_upstream() -> None:
        stopping.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, stopping, held)
        tg.start_soon(_stop_when_asked, stopping, upstream, config.shutdown_grace, relay.drives_rounds)
        await relay.run(on_client_closed=stop_upstream)
        # The upstream side ended: let it exit, or stop it the usual way.
        status = await upstream.stop(config.shutdown_grace)
        if not stopping.is_set():
            log.error("upstream server exited", extra={"status": status})
        # Every request still waiting gets its answer, also when the client closed its input first:
        # it may still read its output (`echo request | mcp-backfill -- server`).
        # An HTTP upstream does not exit: its stop ended the session, and says why. A child did, but
        # a request whose round the proxy still answered when the proxy stopped it was cut by that.
        reason = upstream.stop_reason or f"Upstream MCP server exited (status {status})"
        cut = shutting_down("the request was not answered", "--shutdown-grace", config.shutdown_grace)
        rounds = cut if stopping.is_set() else None
        await relay.fail_pending(reason, rounds_reason=rounds)
        relay.rounds.abandon_questions()  # approval questions still open: their lines
        relay.traces.close()
        tg.cancel_scope.cancel()
    return status


async def _watch_signals(stopping: anyio.Event, held: HeldSignals | None) -> None:
    """Stop for a signal while the relay runs. Once it has ended, the signals are `held` again for
    the rest of the shutdown (the last answers flushed to the client, the store settlements, the
    audit log's close, each bounded): leaving the receiver puts the default handlers back, and a
    SIGTERM then (the mcp SDK's client sends one 2 s after closing our stdin) cut all that short.
    A second signal there still acts as it would have by default."""
    try:
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            for signum in held.take() if held is not None else ():  # came while the proxy started
                _stop_for(signum, stopping)
            async for signum in signals:
                _stop_for(signum, stopping)
    finally:
        if held is not None:
            held.install()


def _stop_for(signum: int, stopping: anyio.Event) -> None:
    log.info("signal received; shutting down", extra={"signal": signal.Signals(signum).name})
    stopping.set()


async def _stop_when_asked(
    stopping: anyio.Event, upstream: UpstreamLeg, grace: float, drives_rounds: Callable[[], bool]
) -> None:
    await stopping.wait()
    # A request whose rounds the proxy answers with Claude is in flight as much as one the upstream
    # works on: the stop gives it the same grace (a child's stdin stays open for its request).
    await upstream.stop(grace, in_flight_elsewhere=drives_rounds)
