"""The one exception type the sampling path raises; the relay turns it into a JSON-RPC error."""

from __future__ import annotations

from typing import Any

from mcp_backfill.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS

__all__ = ["INTERNAL_ERROR", "INVALID_PARAMS", "SamplingError", "internal_error", "invalid_params"]


class SamplingError(Exception):
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
