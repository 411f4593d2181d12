"""JSON-RPC 2.0 helpers: decoding for routing, compact encoding, and error construction."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

Id = int | str | float | None
IdKey = tuple[bool | None, Any]

CODEC = "orjson"  # which JSON library decode/encode use (reported by the benchmarks)


def decode(raw: bytes) -> Any:
    """Parse one message; raises `ValueError` (incl. `UnicodeDecodeError`) on malformed input.

    orjson parses the messages the relay routes 2-5x faster than `json`. Inputs it refuses but
    `json` accepts (lone surrogates, NaN) get `json`, and so do integers that may not fit in 64
    bits, which orjson would turn into floats: ids and rewritten messages stay exact.
    """
    if _may_hold_long_integer(raw):
        return _json_loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _json_loads(raw)


def _json_loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:  # orjson refuses it too: nesting beyond its 1024 levels
        raise ValueError("JSON nested too deeply") from None


# Every digit becomes "0", so a run of 19 zeros marks 19 digits in a row: the shortest number that
# can overflow orjson's 64-bit integers (-9223372036854775809). Strings with such runs only cost speed.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_SCAN_CHUNK = 1 << 20


def _may_hold_long_integer(raw: bytes) -> bool:
    if len(raw) <= _SCAN_CHUNK:
        return _LONG_RUN in raw.translate(_DIGITS_AS_ZERO)
    overlap = len(_LONG_RUN) - 1
    with memoryview(raw) as view:
        for start in range(0, len(raw), _SCAN_CHUNK):
            window = bytes(view[max(start - overlap, 0) : start + _SCAN_CHUNK])
            if _LONG_RUN in window.translate(_DIGITS_AS_ZERO):
                return True
    return False


# One encoder, made once (`json.dumps` with any option but the defaults builds a new one per call).
_COMPACT_TEXT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def compact_text(value: Any) -> str:
    """`value` as compact JSON text, non-ASCII characters as they are and anything JSON has no form
    for as its `str()`: what a value's size is measured on (the limits, the token estimate)."""
    return _COMPACT_TEXT.encode(value)


def encode(message: Any) -> bytes:
    """Compact UTF-8 JSON, as every MCP SDK writes it."""
    try:
        return orjson.dumps(message)
    except TypeError:  # beyond orjson: integers over 64 bits, non-string keys, lone surrogates
        text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form; its \u escape is valid JSON
        return json.dumps(message, separators=(",", ":")).encode()


def id_key(request_id: Any) -> IdKey:
    """A dict key that keeps `1` and `"1"` apart (they are different JSON-RPC ids). An id JSON-RPC
    does not allow (an object, an array, a boolean) is keyed by its JSON text: it can be neither
    unhashable, which would end the session, nor equal to a valid one (`true` is not `1`)."""
    kind = type(request_id)
    if kind is int or kind is str or request_id is None:
        return (kind is str, request_id)
    if kind is float:
        return (False, request_id)
    return (None, compact_text(request_id))


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
_HEAD_ENVELOPE = rb'\A\s*\{(?:\s*"(?:jsonrpc|id)"\s*:\s*' + _ID_VALUE + rb"\s*,)*\s*"
_HEAD_METHOD = re.compile(_HEAD_ENVELOPE + rb'"method"')
_HEAD_ANSWER = re.compile(_HEAD_ENVELOPE + rb'"(?:result|error)"')


def salvage_envelope(head: bytes, tail: bytes) -> tuple[bool, Id, bool]:
    """From the two ends of a message too large to parse: (id found, the id, is it a request?).

    Lets the relay answer for a message it had to drop, so that no request waits forever. What it
    is must show at its head (`method`, or `result`/`error`, after at most its envelope): one that
    shows neither is not salvaged, since answering a request as an answer fails another request.
    """
    match = _HEAD_ID.search(head) or _TAIL_ID.search(tail)
    if match is None:
        return False, None, False
    request = _HEAD_METHOD.search(head) is not None
    if not request and _HEAD_ANSWER.search(head) is None:
        return False, None, False
    try:
        request_id = json.loads(match.group(1))
    except ValueError:
        return False, None, False
    return True, request_id, request


_EDGE = 1024  # bytes read at each end of a message that is not JSON (as `MessageTooLarge.EDGE`)


def salvage_unparsed(raw: bytes) -> tuple[bool, Id, bool]:
    """`salvage_envelope` for a whole message that is not JSON, read at its two ends."""
    return salvage_envelope(raw[:_EDGE], raw[-_EDGE:])


# `{"jsonrpc":"2.0","id":<id>,"result":` (or `"error":`), the head every common serializer writes.
_RESPONSE_HEAD = re.compile(
    rb'\A\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _ID_VALUE + rb'\s*,\s*"(?:result|error)"\s*:'
)


def response_head_id(raw: bytes) -> tuple[bool, Id]:
    """The id of a response, read from its first bytes only: (found, id)."""
    match = _RESPONSE_HEAD.match(raw[:1024])
    if match is None:
        return False, None
    try:
        return True, json.loads(match.group(1))
    except ValueError:
        return False, None
