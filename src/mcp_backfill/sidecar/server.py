"""`mcp-backfill serve`: uvicorn serving the sidecar app, inside the proxy's anyio task group.

The listening socket is bound here (so `--port 0` can log the port it got), then handed to uvicorn,
whose own signal handling is replaced by ours. On SIGTERM, SIGINT or SIGHUP the sidecar drains: new sessions
and 2026-07-28 requests are refused (503, and `/readyz` says so), the streams that never end by
themselves (standalone GET streams, 2026-07-28 `subscriptions/listen`) end, and the requests in flight
get up to `--drain-timeout` seconds to finish. Meanwhile connections are still accepted: a request in
flight may wait for its client's answer (sampling the client does itself, an elicitation), which the
client POSTs on a new connection. When the time is up, the requests still in flight are answered
with a JSON-RPC error by their sessions and hubs, which stop (`SidecarApp.end_requests`). Once
nothing is in flight (or `ANSWER_SECONDS` later) uvicorn stops accepting connections and cancels
what is left; then every session is closed and every upstream stopped. A second signal skips the
wait.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import uvicorn

from mcp_backfill import telemetry
from mcp_backfill.assembly import client_session_rate, make_sampler, relay_options
from mcp_backfill.config import Config
from mcp_backfill.credentials import shown_args
from mcp_backfill.errors import BindError, StoreUnavailable, cannot_start
from mcp_backfill.logs import get_logger
from mcp_backfill.options import BUDGET_WINDOWS, Allowance, env_var, shutting_down
from mcp_backfill.relay import Relay
from mcp_backfill.sampling.audit import auditing
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.sidecar.app import MCP_PATHS, SidecarApp
from mcp_backfill.sidecar.connections import guarded_protocol
from mcp_backfill.sidecar.handshake import HandshakeFront
from mcp_backfill.sidecar.http_io import FrontSettings
from mcp_backfill.sidecar.lane import Lane
from mcp_backfill.sidecar.metrics import Labels, Metrics, client_label, labels_key
from mcp_backfill.sidecar.security import (
    SHARED_IDENTITY,
    AccessPolicy,
    default_allowed_hosts,
    default_allowed_origins,
)
from mcp_backfill.sidecar.sessions import OpeningRate, SessionSettings, SessionTable
from mcp_backfill.sidecar.stateless import StatelessFront, StatelessHub, StatelessHubs
from mcp_backfill.sidecar.upstreams import UpstreamFactory, child_process_upstreams, http_upstreams
from mcp_backfill.transports.base import MessageChannel
from mcp_backfill.transports.http_upstream import display_url

log = get_logger("sidecar")

# Once `--drain-timeout` is over, how long the requests still in flight, answered with an error, get
# to write their answers before uvicorn cancels what is left.
ANSWER_SECONDS = 1.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the sidecar decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        # Say TCP explicitly: asyncio turns on TCP_NODELAY only for sockets whose protocol is
        # IPPROTO_TCP, and without it an SSE event can wait 40 ms for the client's delayed ACK.
        sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = f"; choose another with --port N ({env_var('--port')}), or --port 0 for a free one"
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from exc
    return sock


def upstream_factory(config: Config) -> UpstreamFactory:
    """Where each session's upstream comes from: a new HTTP session or a new child process."""
    if config.upstream_url is not None:
        return http_upstreams(config)
    if shutil.which(config.upstream_command[0]) is None:
        raise cannot_start(config.upstream_command[0], "command not found", os.environ.get("PATH"))
    return child_process_upstreams(config)


async def run_sidecar(config: Config) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP; returns the exit status."""
    metrics = Metrics(models=(config.model, *config.allowed_models))
    sampler = make_sampler(config, metrics, metrics)
    tracing = telemetry.install_from_environment()
    open_upstream = upstream_factory(config)
    options = relay_options(config)

    relays = itertools.count(1)

    if config.mode != "off" and not (config.budget_tokens or config.client_budget_tokens):
        log.warning(
            "no token budget: this sidecar spends on Claude without limit for every client; set one "
            "with --budget-tokens (MCP_BACKFILL_BUDGET_TOKENS) and/or --client-budget-tokens "
            "(MCP_BACKFILL_CLIENT_BUDGET_TOKENS), e.g. 2000000/day"
        )

    def make_relay(client: MessageChannel, upstream: MessageChannel, identity: str) -> Relay:
        # Each relay is one client session (or a client's 2026 hub): its own session budget, and
        # the budget, rate limit and slots of the client identity it belongs to.
        session = sampler.spend.new_session(f"http-{next(relays)}", client=identity)
        return Relay(options, sampler, client, upstream, session=session)

    directions: dict[str, Labels] = {}

    def count(direction: str) -> None:
        key = directions.get(direction)
        if key is None:
            key = directions[direction] = labels_key(direction=direction)
        metrics.messages.add(key)

    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    policy = AccessPolicy(
        allowed_hosts=config.allowed_hosts or default_allowed_hosts(port),
        allowed_origins=config.allowed_origins or default_allowed_origins(),
        tokens=client_credentials(config),
        forward_authorization=config.forward_authorization,
        metrics_token=config.metrics_token.value if config.metrics_token is not None else None,
    )
    if not policy.authenticates:
        reason = "--allow-unauthenticated" if config.allow_unauthenticated else "no --auth-token"
        log.warning(
            f"serving without authentication ({reason}): anyone who can reach {config.host}:{port} can "
            "use the upstream and spend on Claude; set MCP_BACKFILL_AUTH_TOKEN (or --auth-token) unless "
            "something in front of the sidecar authenticates clients"
        )
    # `--max-sessions` counts upstream processes: handshake sessions and 2026-07-28 hubs together.
    stop_timeout = 3 * config.shutdown_grace + 1  # how long an upstream may take to stop
    # One budget of upstream starts per client: its handshake sessions' and its 2026-07-28 hub's.
    opening = OpeningRate(client_session_rate(config))
    hubs = StatelessHubs(
        lambda identity: StatelessHub(open_upstream, make_relay, count, identity, opening),
        max_upstreams=config.max_sessions,
        idle_timeout=config.session_idle_timeout,
        others=lambda: sessions.upstreams,
        stop_timeout=stop_timeout,
        opening=opening,
    )
    sessions = SessionTable(
        config.max_sessions,
        SessionSettings(config.session_idle_timeout, stop_timeout=stop_timeout),
        open_upstream,
        make_relay,
        count,
        others=lambda: hubs.upstreams,
        make_room=hubs.make_room,
    )
    front = FrontSettings(
        config.max_message_bytes, body_timeout=config.body_timeout, max_batch=config.max_batch_messages
    )
    spend = sampler.spend
    spend.link.observer = metrics.store_call
    readiness = Readiness(spend, config.state_store_timeout)
    app = SidecarApp(
        policy,
        HandshakeFront(sessions, front, opening),
        StatelessFront(hubs, front),
        metrics,
        readiness.check,
    )
    spend_gauges(metrics, spend)
    metrics.gauge(
        "mcp_backfill_active_sessions", "open handshake-era client sessions", lambda: [((), len(sessions))]
    )
    metrics.gauge(
        "mcp_backfill_replay_buffer_bytes",
        "bytes of server messages kept for SSE resumption, over every session",
        lambda: [((), sum(session.router.buffered_bytes for session in sessions.all()))],
    )
    metrics.gauge(
        "mcp_backfill_requests_in_flight_2026",
        "2026-07-28 requests waiting for their answer",
        lambda: [((), hubs.in_flight)],
    )
    server = _Server(
        uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            ws="none",
            http=guarded_protocol(config.header_timeout, config.max_connections, Lane(app, MCP_PATHS)),
            timeout_graceful_shutdown=math.ceil(config.drain_timeout),
            server_header=False,
        )
    )
    audit = sampler.audit
    if audit is not None:
        metrics.gauge(
            "mcp_backfill_audit_lines_dropped_total",
            "audit log lines dropped: the disk could not keep up or refused the write",
            lambda: [((), audit.dropped)],
            kind="counter",
        )
    try:
        async with auditing(audit), spend.upkeep(), anyio.create_task_group() as tg:
            sessions.start(tg)
            hubs.start(tg)
            tg.start_soon(_watch_signals, server, app, config.drain_timeout)
            url = f"http://{_url_host(config.host)}:{port}/mcp"
            log.info(
                "serving streamable HTTP",
                extra={
                    "url": url,
                    "port": port,
                    "upstream": display_url(config.upstream_url)
                    if config.upstream_url
                    else shown_args(config.upstream_command),
                    "auth": policy.authenticates,
                    "clients": len(policy.tokens),
                    "mode": config.mode,
                    "provider": config.provider,
                },
            )
            await server.serve(sockets=[sock])
            log.info("stopping every session", extra={"sessions": len(sessions)})
            with anyio.CancelScope(shield=True):
                hubs.stop()
                await sessions.close_all()
            tg.cancel_scope.cancel()
    finally:
        sock.close()
        await sampler.provider.aclose()
        tracing.shutdown()
    log.info("stopped")
    return 0


async def _watch_signals(server: _Server, app: SidecarApp, drain_timeout: float) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if app.draining:
                    log.info("second signal: not waiting for requests in flight")
                    server.force_exit = True
                    server.should_exit = True
                    continue
                log.info(
                    "signal received; draining requests in flight",
                    extra={"signal": signal.Signals(signum).name},
                )
                app.drain()
                tg.start_soon(_stop_when_idle, server, app, drain_timeout)


async def _stop_when_idle(server: _Server, app: SidecarApp, drain_timeout: float) -> None:
    """Stop accepting connections once no request is in flight, or `drain_timeout` is over; uvicorn
    then cancels the requests still running when the rest of the time is up."""
    deadline = anyio.current_time() + drain_timeout
    with anyio.move_on_after(drain_timeout):
        await app.wait_idle()
    if app.busy:  # the time is up: what is still in flight is answered, as far as it can be
        log.info("drain timeout over; ending the requests still in flight")
        app.end_requests(shutting_down("the request was not answered", "--drain-timeout", drain_timeout))
        with anyio.move_on_after(ANSWER_SECONDS):
            await app.wait_idle()
    server.config.timeout_graceful_shutdown = math.ceil(max(0.0, deadline - anyio.current_time()))
    server.should_exit = True


class Readiness:
    """`/readyz`: can this replica sample? Asks a shared store, one request at a time; an answer
    holds for a second, unless sampling has found the store unavailable since it was given (then
    the next request asks again). `/readyz` needs no credentials: however many come, the store is
    asked at most once a second, outage or not."""

    def __init__(self, spend: Spend, timeout: float) -> None:
        self._spend = spend
        self._timeout = timeout
        # When, the answer, and whether the ledger knew of an outage then.
        self._last: tuple[float, bool, dict[str, Any], bool] | None = None
        self._asking = anyio.Lock()

    def _cached(self) -> tuple[bool, dict[str, Any]] | None:
        last = self._last
        if last is None or anyio.current_time() - last[0] >= 1.0:
            return None
        if self._spend.link.outage is not None and not last[3]:
            return None  # sampling found the store unavailable since
        return last[1], last[2]

    async def check(self) -> tuple[bool, dict[str, Any]]:
        store = self._spend.store
        if not store.shared:
            return True, {"store": store.description}
        cached = self._cached()
        if cached is not None:
            return cached
        async with self._asking:
            cached = self._cached()
            if cached is not None:
                return cached
            ready, about = await self._ask()
            self._last = (anyio.current_time(), ready, about, self._spend.link.outage is not None)
            return ready, about

    async def _ask(self) -> tuple[bool, dict[str, Any]]:
        store = self._spend.store
        try:
            with anyio.fail_after(self._timeout):
                await store.ping()
        except (StoreUnavailable, TimeoutError) as exc:
            local = self._spend.settings.store_outage == "local"
            return local, {
                "store": store.description,
                "store_status": "unavailable",
                "error": exc.cause if isinstance(exc, StoreUnavailable) else "timed out",
                "sampling": "counted locally" if local else "refused",
            }
        return True, {"store": store.description, "store_status": "ok"}


def spend_gauges(metrics: Metrics, spend: Spend) -> None:
    """Budgets (each allowance of the process's and every client's, with what this replica last saw
    used against it) and refusals by limit, read from the ledger when scraped.

    The callers told apart by a forwarded Authorization header share one label (`forwarded`), so
    their budgets make one series per window: the most any of them has used, beside their common
    allowance. used / limit then still reads as a share of one caller's budget (the alert on a client
    nearly out of budget fires for the most spent of them); what they spend together is in
    `mcp_backfill_sampling_tokens_total{client="forwarded"}`.
    """

    def budgets(read: Callable[[Allowance, int], float]) -> list[tuple[Labels, float]]:
        payers = [("process", "", spend.budget)] + [
            ("client", client_label(name), account.budget) for name, account in spend.clients.items()
        ]
        series: dict[Labels, float] = {}
        for kind, client, budget in payers:
            for allowance, used in budget.usage():
                labels = (("budget", kind), ("client", client), ("window", allowance.window or "total"))
                value = read(allowance, used)
                series[labels] = max(value, series.get(labels, value))
        return list(series.items())

    windows = ", ".join(("total", *BUDGET_WINDOWS))
    metrics.gauge(
        "mcp_backfill_budget_limit_tokens",
        f"token allowance of a budget (budget: process or client; window: {windows})",
        lambda: budgets(lambda allowance, _: allowance.tokens),
    )
    metrics.gauge(
        "mcp_backfill_budget_used_tokens",
        "tokens used against a budget's allowance in its current window, as this replica last saw it",
        lambda: budgets(lambda _, used: used),
    )
    metrics.gauge(
        "mcp_backfill_sampling_refusals_total",
        "sampling requests refused by a limit before any Claude call (one failed by a limit after its "
        "call counts as failed), by the limit's option (budget_tokens, rate_limit...)",
        lambda: [((("limit", limit),), count) for limit, count in sorted(spend.refused.items())],
        kind="counter",
    )


def client_credentials(config: Config) -> tuple[tuple[str, str], ...]:
    """(client identity, token) for the shared `--auth-token` and every named client token."""
    shared = ((SHARED_IDENTITY, config.auth_token.value),) if config.auth_token is not None else ()
    return shared + tuple((entry.name, entry.token.value) for entry in config.client_tokens)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
