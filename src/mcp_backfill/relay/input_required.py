"""The stateless 2026-07-28 revision, as pure functions: envelopes, `input_required` rounds, stash.

In this revision a client re-declares its capabilities in `params._meta` on every request, and a
server asks for sampling by answering `tools/call`, `prompts/get` or `resources/read` with
`{"resultType": "input_required", "inputRequests": {key: request}, "requestState": "..."}`; the
client answers by re-sending the same request with `inputResponses` (same keys) and the
`requestState` echoed verbatim. The relay drives that loop; this module holds its decisions.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from mcp_backfill import jsonrpc, protocol

# A `requestState` the proxy hands to the client when it keeps some answers of a round itself.
STATE_PREFIX = "mcp-backfill.v1."


def envelope(params: Any) -> dict[str, Any] | None:
    """The request's `_meta` when it carries a 2026-style envelope (a protocol version), else None."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get(protocol.META_PROTOCOL_VERSION), str):
        return meta
    return None


def declared_capabilities(meta: dict[str, Any]) -> dict[str, Any]:
    capabilities = meta.get(protocol.META_CLIENT_CAPABILITIES)
    return capabilities if isinstance(capabilities, dict) else {}


def with_capabilities(message: dict[str, Any], capabilities: dict[str, Any]) -> dict[str, Any]:
    """A copy of a request whose envelope declares `capabilities`; everything else is shared."""
    params = message["params"]
    meta = {**params["_meta"], protocol.META_CLIENT_CAPABILITIES: capabilities}
    return {**message, "params": {**params, "_meta": meta}}


def is_input_required(result: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(result, dict) and result.get("resultType") == protocol.INPUT_REQUIRED


@dataclass(frozen=True)
class Round:
    """One `input_required` result, split between the proxy and the client."""

    mine: dict[str, dict[str, Any]]  # key -> sampling params the proxy answers
    theirs: dict[str, Any]  # key -> input request left to the client, as the server sent it
    has_state: bool
    state: Any  # the server's `requestState`, echoed verbatim (only meaningful when has_state)

    @property
    def state_only(self) -> bool:
        """ "Retry later": no questions, only state."""
        return not self.mine and not self.theirs


def split_round(result: dict[str, Any], proxy_answers: Callable[[dict[str, Any]], bool]) -> Round:
    """Which input requests of a round the proxy answers (sampling it should take) and which not."""
    requests = result.get("inputRequests")
    mine: dict[str, dict[str, Any]] = {}
    theirs: dict[str, Any] = {}
    if isinstance(requests, dict):
        for key, request in requests.items():
            params = request.get("params") if isinstance(request, dict) else None
            if (
                isinstance(request, dict)
                and request.get("method") == protocol.SAMPLING
                and isinstance(params, dict)
                and proxy_answers(params)
            ):
                mine[key] = params
            else:
                theirs[key] = request
    return Round(mine, theirs, "requestState" in result, result.get("requestState"))


def base_params(params: dict[str, Any]) -> dict[str, Any]:
    """A request's params without the answers of a previous round."""
    return {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}


def retry_params(
    base: dict[str, Any], responses: dict[str, Any], has_state: bool, state: Any
) -> dict[str, Any]:
    """The params of the next round: the same request plus the answers and the echoed state."""
    params = dict(base)
    if responses:
        params["inputResponses"] = responses
    if has_state:
        params["requestState"] = state
    return params


def reduced_result(result: dict[str, Any], theirs: dict[str, Any], token: str) -> dict[str, Any]:
    """The round as the client sees it: only its own questions, and the proxy's state token."""
    return {**result, "inputRequests": theirs, "requestState": STATE_PREFIX + token}


def stash_token(params: dict[str, Any]) -> str | None:
    """The proxy's token when a client retry echoes a state the proxy handed out."""
    state = params.get("requestState")
    if isinstance(state, str) and state.startswith(STATE_PREFIX):
        return state[len(STATE_PREFIX) :]
    return None


@dataclass
class StashedRound:
    """What the proxy keeps while the client answers its part of a mixed round."""

    answers: dict[str, Any]
    has_state: bool
    state: Any
    rounds: int
    expires: float
    # Sampling questions the proxy has not answered yet: they wait for the user's approval.
    pending: dict[str, Any] = field(default_factory=dict)
    # A sealed token's nonce (hex), by which replicas sharing a ledger store claim it once.
    nonce: str = ""
    # The key of the approval question among the round's (one no question of the server's has).
    approval_key: str = ""
    # The client request the approval question was asked for (for the logs; `Stash` only).
    asked_for: Any = None


@dataclass
class Stash:
    """The proxy's own answers to mixed rounds, keyed by the token given to the client, with a TTL.

    `expired` hears of each entry dropped because its time ran out (never of one taken in time),
    once, with its token: an approval question's sampling requests are then refused. `abandoned`
    hears of each entry still open when the stash is let go (`abandon`, the proxy stopping)."""

    ttl: float
    clock: Callable[[], float] = time.monotonic
    entries: dict[str, StashedRound] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=itertools.count)
    expired: Callable[[str, StashedRound], None] = lambda token, entry: None
    abandoned: Callable[[str, StashedRound], None] = lambda token, entry: None

    def put(
        self,
        answers: dict[str, Any],
        has_state: bool,
        state: Any,
        rounds: int,
        pending: dict[str, Any] | None = None,
        ttl: float | None = None,
        approval_key: str = "",
        asked_for: Any = None,
    ) -> str:
        """`ttl`: this entry's, when shorter than the stash's (an approval question's);
        `approval_key`: the key the approval question of `pending` was asked under; `asked_for`: the
        client request it was asked for."""
        self._drop_expired()
        now = self.clock()
        # Unguessable, so one client cannot redeem another's answers on a shared proxy.
        token = f"{next(self._serial)}.{secrets.token_urlsafe(12)}"
        expires = now + (self.ttl if ttl is None else ttl)
        self.entries[token] = StashedRound(
            answers,
            has_state,
            state,
            rounds,
            expires,
            pending or {},
            approval_key=approval_key,
            asked_for=asked_for,
        )
        return token

    def take(self, token: str) -> StashedRound | None:
        entry = self.entries.pop(token, None)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self.expired(token, entry)
            return None
        return entry

    def holds(self) -> bool:
        """Does it hold an entry not expired yet? (Those expired are dropped.)"""
        self._drop_expired()
        return bool(self.entries)

    def expires(self, token: str) -> float | None:
        """When the entry of `token` expires (by `clock`), or None when it is gone."""
        entry = self.entries.get(token)
        return None if entry is None else entry.expires

    def _drop_expired(self) -> None:
        now = self.clock()
        gone = [token for token, entry in self.entries.items() if entry.expires <= now]
        for token in gone:
            self.expired(token, self.entries.pop(token))

    def abandon(self) -> None:
        """Let every entry go (the proxy stops): those expired are `expired`, the others `abandoned`."""
        self._drop_expired()
        entries, self.entries = self.entries, {}
        for token, entry in entries.items():
            self.abandoned(token, entry)


MAX_REDEEMED = 100_000
"""Redeemed sealed tokens one process remembers at once (a few MB). Beyond it such a retry is
refused until some expire, rather than one forgotten: a forgotten token could be replayed."""


@dataclass
class Redeemed:
    """The nonces of the sealed tokens already redeemed that carried questions awaiting approval,
    each until its token expires. The retry of such a token samples (and bills): a replay must find
    it used. The memory is one process's; with a shared ledger store the relay claims the token
    there as well (`RoundDriver`), for the replicas sharing it."""

    limit: int = MAX_REDEEMED
    expiries: dict[bytes, float] = field(default_factory=dict)

    def claim(self, nonce: bytes, expires: float, now: float) -> bool:
        """True the first time a token is redeemed; False when it was before, or the memory is full."""
        self._forget(now)
        if nonce in self.expiries or len(self.expiries) >= self.limit:
            return False
        self.expiries[nonce] = expires
        return True

    def release(self, nonce: bytes) -> None:
        """Forget a claim whose redemption did not go ahead (the shared store could not be asked)."""
        self.expiries.pop(nonce, None)

    def _forget(self, now: float) -> None:
        """Drop the expired: from the oldest on (with one TTL they expire in the order they came),
        and all through when the memory is full (another replica's TTL may differ)."""
        while self.expiries:
            nonce, expires = next(iter(self.expiries.items()))
            if expires > now:
                break
            del self.expiries[nonce]
        if len(self.expiries) >= self.limit:
            self.expiries = {nonce: expires for nonce, expires in self.expiries.items() if expires > now}


class SealedStash:
    """The proxy's own answers to mixed rounds, sealed into the token the client echoes (AES-256-GCM),
    so that any replica holding the same key can take the retry; nothing is kept in memory but the
    tokens redeemed once (below).

    The token names the client identity it was given to (as authenticated data: another client's
    retry cannot open it) and when it expires. Unlike `Stash`, a token of a mixed round can be
    redeemed more than once before it expires; a replay re-sends the same answers and spends
    nothing. A token carrying questions awaiting approval redeems once (`redeemed`, shared by the
    process's stashes): its retry samples, and a replay would sample again.
    """

    def __init__(
        self,
        key: bytes,
        ttl: float,
        scope: str,
        wall_clock: Callable[[], float] = time.time,
        redeemed: Redeemed | None = None,
    ) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self._invalid = (ValueError, InvalidTag)
        self.ttl = ttl
        self._scope = scope.encode()
        self._clock = wall_clock
        self._redeemed = redeemed if redeemed is not None else Redeemed()

    def put(
        self,
        answers: dict[str, Any],
        has_state: bool,
        state: Any,
        rounds: int,
        pending: dict[str, Any] | None = None,
        ttl: float | None = None,
        approval_key: str = "",
        asked_for: Any = None,  # not sealed: nothing here hears of a token expiring
    ) -> str:
        expires = self._clock() + (self.ttl if ttl is None else ttl)
        fields = {"a": answers, "h": has_state, "s": state, "r": rounds, "e": expires, "p": pending or {}}
        if approval_key:
            fields["k"] = approval_key
        payload = jsonrpc.encode(fields)  # keeps the text of numbers a double cannot hold (`1e400`)
        nonce = secrets.token_bytes(12)
        sealed = self._aead.encrypt(nonce, payload, self._scope)
        return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def take(self, token: str) -> StashedRound | None:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            payload = jsonrpc.decode(self._aead.decrypt(raw[:12], raw[12:], self._scope))
        except self._invalid:
            return None
        now, pending = self._clock(), payload.get("p", {})
        if payload["e"] <= now:
            return None
        if pending and not self._redeemed.claim(raw[:12], payload["e"], now):
            return None
        answers, has_state, state, rounds = payload["a"], payload["h"], payload["s"], payload["r"]
        key = payload.get("k", "")
        return StashedRound(answers, has_state, state, rounds, payload["e"], pending, raw[:12].hex(), key)

    def give_back(self, stashed: StashedRound) -> None:
        """A taken token whose redemption did not go ahead may be redeemed again."""
        self._redeemed.release(bytes.fromhex(stashed.nonce))


def request_state_key(secret: str) -> bytes:
    """The AES-256 key for `SealedStash`, derived from the operator's `--request-state-key`."""
    return hashlib.sha256(b"mcp-backfill request state\0" + secret.encode()).digest()


def client_answers(params: dict[str, Any]) -> dict[str, Any]:
    answers = params.get("inputResponses")
    return answers if isinstance(answers, dict) else {}


def restore_params(params: dict[str, Any], stashed: StashedRound) -> dict[str, Any]:
    """A client's retry of a mixed round, with the proxy's answers merged and the server's state back."""
    answers = {**client_answers(params), **stashed.answers}
    return retry_params(base_params(params), answers, stashed.has_state, stashed.state)
