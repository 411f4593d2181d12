"""The shared stores of the spend ledger (`sampling.store.LedgerStore`), chosen by URL.

    memory                      this process alone (the default)
    sqlite:///path/to/file.db   every process on this machine that opens the file
    redis://host:6379/0         every process (replica) using that Redis server; also rediss://

Each backend is imported only when it is used (the Redis client is an optional dependency).
"""

from __future__ import annotations

import re

from mcp_backfill.errors import ConfigError
from mcp_backfill.options import named
from mcp_backfill.sampling.store import LedgerStore, MemoryStore

__all__ = ["open_store"]

_OPTION = named("--state-store")
"""How errors name the option."""
# A parameter redis-py's connection does not take, as its TypeError names it.
_UNKNOWN_PARAMETER = re.compile(r"unexpected keyword argument '([A-Za-z_][A-Za-z0-9_]*)'")


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
        from mcp_backfill.stores.sqlite import SqliteStore, unsafe_place

        problem = unsafe_place(path)
        if problem is not None:
            raise ConfigError(f"{_OPTION}: {problem}")
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
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{_OPTION}: Redis cannot use this URL ({_url_problem(exc)}); its form is "
            "redis://[[user]:password@]host[:port]/db[?option=value&...]"
        ) from None


def _url_problem(error: ValueError | TypeError) -> str:
    """What is wrong with a Redis URL, in words of our own: urllib's and redis-py's quote the part
    they could not read, and a password with an unencoded `/`, `#` or `?` ends up in that part."""
    text = str(error)
    if isinstance(error, TypeError):
        unknown = _UNKNOWN_PARAMETER.search(text)
        return (
            f"Redis takes no parameter {unknown.group(1)!r}" if unknown else "a parameter Redis does not take"
        )
    if "port" in text.lower():
        return (
            "its port is not a number from 0 to 65535 (a password holding '/', '#' or '?' must be "
            "percent-encoded)"
        )
    return "a parameter's value is not one Redis takes"
