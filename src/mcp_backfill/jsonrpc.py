"""JSON-RPC 2.0 helpers: decoding for routing, compact encoding, and error construction."""

from __future__ import annotations

import json
import re
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

Id = int | str | float | None
IdKey = tuple[bool, Any]

CODEC = "json"  # which JSON library decode/encode use (reported by the benchmarks)


def decode(raw: bytes) -> Any:
    """Parse one message; raises `ValueError` (incl. `UnicodeDecodeError`) on malformed input."""
    return json.loads(raw)


def encode(message: Any) -> bytes:
    """Compact UTF-8 JSON, as every MCP SDK writes it."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def id_key(request_id: Any) -> IdKey:
    """A dict key that keeps `1` and `"1"` apart (they are different JSON-RPC ids)."""
    return (isinstance(request_id, str), request_id)


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


_ID_VALUE = rb'(-?\d+(?:\.\d+)?|"(?:[^"\\]|\\.)*"|null)'
# A top-level "id" is the first key (optionally after "jsonrpc") or the last one: both ends of the object.
_HEAD_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID_VALUE)
_TAIL_ID = re.compile(rb',\s*"id"\s*:\s*' + _ID_VALUE + rb"\s*\}\s*\Z")
_HEAD_METHOD = re.compile(rb'\A\s*\{(?:\s*"(?:jsonrpc|id)"\s*:\s*' + _ID_VALUE + rb"\s*,)*\s*\"method\"")


def salvage_envelope(head: bytes, tail: bytes) -> tuple[bool, Id, bool]:
    """From the two ends of a message too large to parse: (id found, the id, is it a request?).

    Lets the relay answer for a message it had to drop, so that no request waits forever.
    """
    match = _HEAD_ID.search(head) or _TAIL_ID.search(tail)
    if match is None:
        return False, None, False
    try:
        request_id = json.loads(match.group(1))
    except ValueError:
        return False, None, False
    return True, request_id, _HEAD_METHOD.search(head) is not None
