"""The shared stores of the spend ledger (`sampling.store.LedgerStore`), chosen by URL.

    memory                      this process alone (the default)
    sqlite:///path/to/file.db   every process on this machine that opens the file
    redis://host:6379/0         every process (replica) using that Redis server; also rediss://

Each backend is imported only when it is used (the Redis client is an optional dependency).
"""

from __future__ import annotations

from mcp_backfill.credentials import url_credentials
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import option
from mcp_backfill.sampling.store import LedgerStore, MemoryStore

__all__ = ["open_store"]

_OPTION = f"--state-store ({option('state_store').env})"
"""How errors name the option."""


def open_store(url: str, *, lease_seconds: float, timeout: float) -> LedgerStore:
    """The store `url` names. Nothing is connected yet: the first operation does that."""
    if url in ("", "memory", "memory://"):
        return MemoryStore()
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        if not path or path == "/":
            raise ConfigError(
                f"{_OPTION}: a SQLite store needs a file, e.g. sqlite:///var/lib/mcp-backfill/ledger.db "
                "(three slashes and an absolute path) or sqlite://ledger.db (relative)"
            )
        from mcp_backfill.stores.sqlite import SqliteStore

        return SqliteStore(path, lease_seconds=lease_seconds, timeout=timeout)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return _redis_store(url, lease_seconds=lease_seconds, timeout=timeout)
    raise ConfigError(
        f"{_OPTION} must be memory, sqlite:///path/to/file.db or redis://host:6379/0 (rediss:// with TLS)"
    )


def _redis_store(url: str, *, lease_seconds: float, timeout: float) -> LedgerStore:
    try:
        from mcp_backfill.stores.redis import RedisStore
    except ImportError:
        raise ConfigError(
            f"{_OPTION} names Redis, but its client is not installed: pip install 'redis>=5' (or "
            "install mcp-backfill with its [redis] extra)"
        ) from None
    try:
        return RedisStore(url, lease_seconds=lease_seconds, timeout=timeout)
    except (ValueError, TypeError) as exc:  # urllib's or redis-py's word on a port, a parameter
        reason = str(exc)
        for secret in url_credentials(url):  # the URL is not repeated: it may hold a password
            reason = reason.replace(secret, "***")
        raise ConfigError(
            f"{_OPTION}: Redis cannot use this URL ({reason}); its form is "
            "redis://[[user]:password@]host[:port]/db[?option=value&...]"
        ) from None
