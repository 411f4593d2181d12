"""What one relayed session remembers: its options, the client's profile, and requests in flight."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.logs import get_logger
from mcp_backfill.options import Approval, Era, Mode
from mcp_backfill.relay.capabilities import ClientProfile
from mcp_backfill.relay.input_required import Redeemed
from mcp_backfill.relay.progress import ROUND_PROGRESS_INTERVAL, RoundProgress

log = get_logger("relay")

WARNED_VERSIONS = 16
"""Unknown protocol revisions one session warns about (and remembers) at most."""
TAKEN_IDS = 1024
"""Ids of server requests the proxy took (answered itself) that one session remembers at most."""
CUT_IDS = 256
"""Ids of cancelled client requests whose later sampling requests one session refuses, at most."""


@dataclass(frozen=True)
class RelayOptions:
    """The relay's settings; the user-facing ones are built from `Config` by `assembly.relay_options`."""

    mode: Mode
    era: Era
    # Rounds of `input_required` the proxy drives for one client request before giving up.
    max_input_rounds: int
    # How long the proxy keeps its answers to a mixed round while the client answers its part.
    input_stash_ttl: float
    # Pause before re-sending a state-only ("retry later") round, as SDK clients do.
    state_only_backoff: tuple[float, float] = (0.05, 0.25)
    # With a key (replicas share it), mixed rounds' answers travel sealed in the requestState.
    request_state_key: bytes | None = None
    # The sealed tokens redeemed once, shared by every relay built with these options (the process's:
    # the sidecar's hubs come and go), so that a replay finds them used whichever relay takes it.
    redeemed_tokens: Redeemed = field(default_factory=Redeemed, compare=False)
    # Handshake era: the longest a task-augmented sampling request is kept (seconds).
    task_ttl_max: float = 3600.0
    # Ask the user (through the client's elicitation) before sampling, and how long to wait.
    approve: Approval = "never"
    approve_timeout: float = 300.0
    # Most messages in one client batch; a larger one is refused as a whole.
    max_batch_messages: int = 1000
    # Get the provider ready in the background once the proxy knows it answers this session's sampling.
    warm_up: bool = True
    # 2026-07-28: seconds between the progress notifications a client that asked for them is sent
    # while the proxy samples for a round of its request.
    round_progress_interval: float = ROUND_PROGRESS_INTERVAL


@dataclass
class InputChain:
    """A 2026 request whose `input_required` rounds the proxy may drive on the client's behalf."""

    method: str
    base_params: dict[str, Any]
    client: ClientProfile
    rounds: int = 0
    # While the proxy samples for a round there is no upstream request in flight.
    upstream_id: Any = None
    scope: anyio.CancelScope | None = None
    # The progress the client hears, when its request carried a progress token.
    progress: RoundProgress | None = None
    # The client cancelled the request (what the server is told, with -32800).
    cut: str | None = None


@dataclass
class PendingRequest:
    """A client request waiting for the upstream, keyed by the id it has upstream."""

    method: str
    request_id: Any  # the client's own id
    chain: InputChain | None = None
    # The upstream ids of the requests of the client's batch that carried it (this one's among them).
    batch: frozenset[jsonrpc.IdKey] | None = None


@dataclass
class RelayState:
    """Per-session protocol state; ids are tracked per direction because the two id spaces overlap."""

    client: ClientProfile = field(default_factory=ClientProfile)
    protocol_version: str | None = None
    # The server's name, from its initialize result (shown when the user is asked to approve).
    server_name: str | None = None
    # Handshake era: the proxy declared sampling tasks for this session (and answers tasks/*).
    declares_tasks: bool = False
    client_requests: dict[jsonrpc.IdKey, PendingRequest] = field(default_factory=dict)
    # Client requests whose input_required rounds the proxy is driving, by the client's id.
    driving: dict[jsonrpc.IdKey, PendingRequest] = field(default_factory=dict)
    warned_versions: set[str] = field(default_factory=set)
    # Ids of the server's latest requests the proxy took instead of the client (its sampling, its
    # tasks): a server cancel of one is the proxy's, never the client's (which never saw the id).
    taken: dict[jsonrpc.IdKey, None] = field(default_factory=dict)
    # Client requests the client cancelled, by id key, with what a sampling request the server
    # still makes for one is refused with (until the client uses the id again).
    cut: dict[jsonrpc.IdKey, str] = field(default_factory=dict)
    # Ids of the server's latest requests relayed to the client that the client has not answered
    # (nor the server cancelled): a request the proxy would answer under one of them is refused.
    with_client: dict[jsonrpc.IdKey, None] = field(default_factory=dict)

    def took(self, request_id: Any) -> None:
        """The proxy answers the server's request `request_id` itself (or refuses it: while the
        client still answers one under that id, a cancel of the id remains the client's)."""
        key = jsonrpc.id_key(request_id)
        if key not in self.with_client:
            jsonrpc.remember(self.taken, key, None, TAKEN_IDS)

    def cut_off(self, request_id: Any, refusal: str) -> None:
        """The client cancelled its request `request_id`: the server's sampling for it is refused."""
        jsonrpc.remember(self.cut, jsonrpc.id_key(request_id), refusal, CUT_IDS)

    def relayed(self, request_id: Any) -> None:
        """The server's request `request_id` goes to the client (an id the proxy took, used again)."""
        key = jsonrpc.id_key(request_id)
        if self.taken:
            self.taken.pop(key, None)
        jsonrpc.remember(self.with_client, key, None, TAKEN_IDS)

    def client_done(self, request_id: Any) -> None:
        """The client answered the server's request `request_id`, or the server cancelled it."""
        if self.with_client:
            self.with_client.pop(jsonrpc.id_key(request_id), None)

    def with_the_client(self, request_id: Any) -> bool:
        """Is the client still answering the server's request `request_id`?"""
        return bool(self.with_client) and jsonrpc.id_key(request_id) in self.with_client

    def was_taken(self, request_id: Any) -> bool:
        """Did the proxy take the server's latest request `request_id`? Its cancel is then consumed."""
        return self.taken.pop(jsonrpc.id_key(request_id), False) is None

    def check_version(self, version: str) -> None:
        """Warn once per session about a revision this proxy does not know: an `initialize` of it still
        gets sampling declared; a stateless request of it passes untouched. The client names the
        revision in each request: past `WARNED_VERSIONS` of them, no more are remembered or logged."""
        if (
            version in protocol.SUPPORTED_VERSIONS
            or version in self.warned_versions
            or len(self.warned_versions) >= WARNED_VERSIONS
        ):
            return
        self.warned_versions.add(version)
        last = len(self.warned_versions) == WARNED_VERSIONS
        log.warning(
            "protocol revision not known to this proxy version; sampling is still declared at "
            "initialize, and its stateless requests pass through untouched"
            + ("; further unknown revisions of this session are not logged" if last else ""),
            extra={"protocol_version": version if len(version) <= 64 else version[:63] + "…"},
        )
