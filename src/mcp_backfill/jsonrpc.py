"""JSON-RPC 2.0 helpers: decoding for routing, compact encoding, and error construction."""

from __future__ import annotations

import json
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

Id = int | str | float | None
IdKey = tuple[bool, Any]


def decode(raw: bytes) -> Any:
    """Parse one message; raises `ValueError` (incl. `UnicodeDecodeError`) on malformed input."""
    return json.loads(raw)


def encode(message: Any) -> bytes:
    """Compact UTF-8 JSON, as every MCP SDK writes it."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def id_key(request_id: Any) -> IdKey:
    """A dict key that keeps `1` and `"1"` apart (they are different JSON-RPC ids)."""
    return (isinstance(request_id, str), request_id)


def is_request(message: dict[str, Any]) -> bool:
    return "method" in message and "id" in message


def is_notification(message: dict[str, Any]) -> bool:
    return "method" in message and "id" not in message


def is_response(message: dict[str, Any]) -> bool:
    return "method" not in message and "id" in message and ("result" in message or "error" in message)


def error_response(request_id: Id, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result_response(request_id: Id, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def preview(raw: bytes, limit: int = 200) -> str:
    """A short, safe rendering of a (possibly binary) message for log lines."""
    text = raw[:limit].decode("utf-8", errors="replace")
    return text + ("…" if len(raw) > limit else "")
