"""Who may talk to the sidecar, and who each caller is: bearer tokens, client identities, and the
Host/Origin checks (DNS-rebinding protection).

A caller's **client identity** is what the ledger charges and what a session is bound to:
the name of the named token it presented (`--client-tokens`), `default` for the shared
`--auth-token`, `anonymous` when the sidecar authenticates nobody, and with `--forward-authorization`
(where the upstream authenticates) a digest of the `Authorization` header it sent — never the
credential itself.

Host and Origin follow the MCP SDK's `TransportSecuritySettings`: a value is accepted when it
equals an allowed entry, or when the entry ends in `:*` and the value is that entry's prefix
followed by `:` and a port. A request without Origin (not from a browser) passes the Origin check;
a request without Host fails the Host check. `*` alone accepts anything. Comparisons ignore case.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field

from mcp_backfill.options import SHARED_CLIENT

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


SHARED_IDENTITY = SHARED_CLIENT
ANONYMOUS = "anonymous"
FORWARDED_PREFIX = "authorization:"
"""Identities from a forwarded Authorization header: this prefix and a digest."""


@dataclass(frozen=True)
class AccessPolicy:
    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """(client identity, bearer token) pairs; none: no authentication."""
    forward_authorization: bool = False
    metrics_token: str | None = field(default=None, repr=False)
    """The one token `/metrics` takes, when set (else any client's)."""

    @property
    def authenticates(self) -> bool:
        return bool(self.tokens)

    def reads_metrics(self, authorization: str | None) -> bool:
        """May this caller read `/metrics`? With a metrics token, only its holder; else any client."""
        if self.metrics_token is None:
            return self.identify(authorization) is not None
        scheme, _, presented = (authorization or "").strip().partition(" ")
        candidate = _wire_bytes(presented.strip())
        return scheme.lower() == "bearer" and hmac.compare_digest(candidate, self.metrics_token.encode())

    def identify(self, authorization: str | None) -> str | None:
        """The caller's client identity, or None when a token is required and this is not one."""
        if not self.tokens:
            if self.forward_authorization and authorization:
                digest = hashlib.sha256(authorization.strip().encode("utf-8", "surrogatepass"))
                return f"{FORWARDED_PREFIX}{digest.hexdigest()[:16]}"
            return ANONYMOUS
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        candidate = _wire_bytes(presented.strip())
        found: str | None = None
        for name, token in self.tokens:  # every token is compared: the time says nothing of which
            if hmac.compare_digest(candidate, token.encode()):
                found = name
        return found


def _wire_bytes(value: str) -> bytes:
    """A header value's bytes as they arrived: headers reach the app decoded as latin-1, so a token
    sent as UTF-8 is compared as the UTF-8 bytes it was, not encoded twice."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # not decoded from the wire
        return value.encode("utf-8", "surrogatepass")


def default_allowed_hosts(port: int) -> tuple[str, ...]:
    """Loopback names with the bound port (and bare, for port 80, where clients omit it)."""
    hosts = tuple(f"{name}:{port}" for name in LOOPBACK_NAMES)
    return (*hosts, *LOOPBACK_NAMES) if port == 80 else hosts


def default_allowed_origins() -> tuple[str, ...]:
    """Pages served from this machine, on any port (a local web UI calling the local sidecar)."""
    return tuple(f"http://{name}:*" for name in LOOPBACK_NAMES) + tuple(
        f"http://{name}" for name in LOOPBACK_NAMES
    )


def matches(value: str, allowed: Sequence[str]) -> bool:
    value = value.strip().lower()
    for entry in allowed:
        entry = entry.strip().lower()
        if entry == "*" or value == entry:
            return True
        if entry.endswith(":*") and value.startswith(entry[:-1]) and value[len(entry) - 1 :].isdigit():
            return True
    return False


def host_allowed(host: str | None, policy: AccessPolicy) -> bool:
    return bool(host) and matches(host or "", policy.allowed_hosts)


def origin_allowed(origin: str | None, policy: AccessPolicy) -> bool:
    return not origin or matches(origin, policy.allowed_origins)
