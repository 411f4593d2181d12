"""Every exception mcp-backfill raises on purpose, in one hierarchy:

    BackfillError
    ├── StartupError              the proxy cannot start; `exit_code` is the process status to use
    │   ├── ConfigError           (2) a setting is wrong; the message names the flag and env variable
    │   ├── UpstreamStartError    (127) the upstream command cannot be started
    │   └── BindError             (1) `serve` cannot listen on its address
    ├── SamplingError             a sampling request gets this JSON-RPC error instead of an answer
    │   └── ProviderError         a failed Claude API call, with what the retry policy needs
    ├── StoreUnavailable          the shared state store (--state-store) did not answer
    ├── MessageTooLarge           a message over --max-message-bytes was dropped; the stream goes on
    └── SessionError              an HTTP front's session or request can no longer be served
        ├── ClientGone            the client disconnected before its request body arrived
        ├── SessionGone           the session ended while a request was being handed to it
        └── DuplicateRequestId    the client reused the id of a request still in flight

`StartupError`s end the process before (or as) it starts serving; the others are answered on the
wire and the session goes on. None of their messages ever carries a secret.
"""

from __future__ import annotations

from typing import Any

from mcp_backfill.protocol import INTERNAL_ERROR, INVALID_PARAMS


class BackfillError(Exception):
    """The base of every exception mcp-backfill raises on purpose."""


# -- startup -------------------------------------------------------------------------------------


class StartupError(BackfillError):
    """The proxy cannot start; the message says what to change."""

    exit_code = 1


class ConfigError(StartupError):
    """A configuration the proxy refuses to start with; the message tells the user what to change."""

    exit_code = 2


class UpstreamStartError(StartupError):
    """The upstream command could not be started (not found, not executable…)."""

    exit_code = 127


class BindError(StartupError):
    """The address to listen on could not be bound."""

    exit_code = 1


# -- sampling ------------------------------------------------------------------------------------


class SamplingError(BackfillError):
    """A sampling request that cannot be answered, with the JSON-RPC error to send instead.

    `code` is `INVALID_PARAMS` (-32602) when the request itself is at fault (validation, a limit,
    an API 400/413/422) and `INTERNAL_ERROR` (-32603) otherwise. `data` never carries secrets.
    """

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(message: str, **data: Any) -> SamplingError:
    return SamplingError(INVALID_PARAMS, message, data or None)


def internal_error(message: str, **data: Any) -> SamplingError:
    return SamplingError(INTERNAL_ERROR, message, data or None)


class ProviderError(SamplingError):
    """A failed API call, with what the retry policy needs to know about it.

    `retryable`: the same request may succeed later (429, 529, 5xx, a dropped connection, a
    mid-stream `overloaded_error`...). `retry_after`: the server's `retry-after`, in seconds.
    """

    def __init__(
        self,
        message: str,
        data: dict[str, Any],
        *,
        code: int = INTERNAL_ERROR,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, message, data)
        self.retryable = retryable
        self.retry_after = retry_after


# -- the state store -----------------------------------------------------------------------------


class StoreUnavailable(BackfillError):
    """The shared state store could not be reached or did not answer in time.

    The message names the store by its description (never its credentials) and the cause; the spend
    ledger refuses sampling meanwhile, or falls back to this process's own counts, as configured.
    """

    def __init__(self, store: str, cause: str) -> None:
        super().__init__(f"the state store {store} is unavailable: {cause}")
        self.store = store
        self.cause = cause


# -- transports ----------------------------------------------------------------------------------


class MessageTooLarge(BackfillError):
    """A message exceeded the size limit; it was discarded and the stream is still usable.

    Only its first and last `EDGE` bytes are kept: enough to recover the JSON-RPC id, which sits
    at one end of the object in every common serializer.
    """

    EDGE = 1024

    def __init__(self, size: int, limit: int, head: bytes = b"", tail: bytes = b"") -> None:
        super().__init__(f"message of at least {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit
        self.head = head
        self.tail = tail

    @classmethod
    def from_bytes(cls, data: bytes, limit: int) -> MessageTooLarge:
        return cls(len(data), limit, data[: cls.EDGE], data[-cls.EDGE :])

    def extend(self, more: bytes | bytearray) -> None:
        """More bytes of the same oversized message arrived (and were dropped)."""
        self.size += len(more)
        self.tail = (self.tail + bytes(more[-self.EDGE :]))[-self.EDGE :]
        self.args = (f"message of at least {self.size} bytes exceeds the limit of {self.limit} bytes",)


class SessionError(BackfillError):
    """An HTTP front's session or request can no longer be served."""


class ClientGone(SessionError):
    """The client disconnected before its request body arrived."""


class SessionGone(SessionError):
    """The session ended while a request was being handed to it."""


class DuplicateRequestId(SessionError):
    """The client reused the id of a request still in flight in this session."""


class TooManyPosts(SessionError):
    """The session already has as many POSTs waiting for their answers as it may hold."""


class TooManyStarts(SessionError):
    """A 2026-07-28 client's upstream would start again, but the client has started as many
    upstreams (and opened as many sessions) in the last minute as `--client-session-rate` allows."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds


def cannot_start(
    command: str, reason: str, path: str | None, *, not_found: bool = True
) -> UpstreamStartError:
    """The error for an upstream command that cannot be started, with what usually fixes it (when
    `not_found`: it was not found on PATH; else, out of descriptors or processes, say, no hint)."""
    hint = ""
    if not_found and "/" not in command and "\\" not in command:
        hint = (
            f"; it was looked up on PATH={path or ''} (desktop apps start servers with a minimal PATH): "
            "give its absolute path (`which " + command + "` shows it)"
        )
    return UpstreamStartError(f"cannot start upstream {command!r}: {reason}{hint}")
