"""Who may talk to the sidecar: bearer-token auth and Host/Origin checks (DNS-rebinding protection).

Host and Origin follow the MCP SDK's `TransportSecuritySettings`: a value is accepted when it
equals an allowed entry, or when the entry ends in `:*` and the value is that entry's prefix
followed by `:` and a port. A request without Origin (not from a browser) passes the Origin check;
a request without Host fails the Host check. `*` alone accepts anything. Comparisons ignore case.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class AccessPolicy:
    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    token: str | None = None


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


def bearer_ok(authorization: str | None, token: str | None) -> bool:
    """Does the `Authorization` header carry the token? Constant-time; always true without a token."""
    if token is None:
        return True
    scheme, _, presented = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())
