"""JSON-RPC 2.0 helpers: decoding for routing, compact encoding, and error construction."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

import orjson

Id = int | str | float | None
IdKey = tuple[bool | None, Any]
V = TypeVar("V")

CODEC = "orjson"  # which JSON library decode/encode use (reported by the benchmarks)


class ExactNumber(float):
    """A number a double cannot hold as written (`1e400`, `1e-400`, more digits than it keeps, or
    the `NaN`/`Infinity` some senders write): the nearest double for whoever reads its value, its
    text for `encode` to write back, so that a message the relay rewrites keeps it as it came."""

    __slots__ = ("text",)
    text: str


def _exact(text: str, value: float) -> float:
    number = ExactNumber(value)
    number.text = text
    return number


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isfinite(value) and (repr(value) == text or Decimal(text) == Decimal(repr(value))):
        return value  # what encode writes for it is the same number
    return _exact(text, value)


def _parse_constant(text: str) -> float:
    return _exact(text, float(text))


def decode(raw: bytes) -> Any:
    """Parse one message; raises `ValueError` (incl. `UnicodeDecodeError`) on malformed input.

    orjson parses the messages the relay routes 2-5x faster than `json`. Inputs it refuses but
    `json` accepts (lone surrogates, NaN) get `json`, and so do numbers that may not fit in a 64-bit
    integer or a double, which orjson would change: ids and rewritten messages stay exact (a number
    a double cannot hold is an `ExactNumber`, written back as it came).
    """
    if len(raw) <= _SCAN_CHUNK:  # `_may_hold_inexact_number`, inline for the messages of every call
        if _LONG_RUN in raw.translate(_NUMBER_MARKS):
            return _json_loads(raw)
    elif _may_hold_inexact_number(raw):
        return _json_loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _json_loads(raw)


def _json_loads(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_float=_parse_float, parse_constant=_parse_constant)
    except RecursionError:  # orjson refuses it too: nesting beyond its 1024 levels
        raise ValueError("JSON nested too deeply") from None


# Every digit becomes "0", so a run of 19 zeros marks 19 digits in a row: the shortest number that
# can overflow orjson's 64-bit integers (-9223372036854775809), or a fraction of more digits than a
# double keeps. Strings with such runs only cost speed. orjson refuses a number beyond a double's
# range (`1e400`); shorter numbers it reads inexactly (`1e-400` as 0, a 17-digit fraction written
# by no shortest-form serializer) are kept as they came only when the message takes this path.
_NUMBER_MARKS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_SCAN_CHUNK = 1 << 20


def _may_hold_inexact_number(raw: bytes) -> bool:
    if len(raw) <= _SCAN_CHUNK:
        return _LONG_RUN in raw.translate(_NUMBER_MARKS)
    overlap = len(_LONG_RUN) - 1
    with memoryview(raw) as view:
        for start in range(0, len(raw), _SCAN_CHUNK):
            window = bytes(view[max(start - overlap, 0) : start + _SCAN_CHUNK])
            if _LONG_RUN in window.translate(_NUMBER_MARKS):
                return True
    return False


# One encoder, made once (`json.dumps` with any option but the defaults builds a new one per call).
_COMPACT_TEXT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def compact_text(value: Any) -> str:
    """`value` as compact JSON text, non-ASCII characters as they are and anything JSON has no form
    for as its `str()`: what a value's size is measured on (the limits, the token estimate)."""
    return _COMPACT_TEXT.encode(value)


def encode(message: Any) -> bytes:
    """Compact UTF-8 JSON, as every MCP SDK writes it; an `ExactNumber` as it came."""
    try:
        return orjson.dumps(message, default=_fragment)
    except TypeError:  # beyond orjson: integers over 64 bits, non-string keys, lone surrogates, depth
        pass
    try:
        return _encode_slowly(message, _STRING).encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form; its \u escape is valid JSON
        return _encode_slowly(message, _ASCII_STRING).encode()


def _fragment(value: Any) -> orjson.Fragment:
    if type(value) is ExactNumber:
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_STRING: Callable[[str], str] = json.encoder.encode_basestring
_ASCII_STRING: Callable[[str], str] = json.encoder.encode_basestring_ascii


class _Text:
    """JSON text already written, on `_encode_slowly`'s stack (punctuation, an object's keys)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_COMMA, _CLOSE_OBJECT, _CLOSE_ARRAY = _Text(","), _Text("}"), _Text("]")


def _encode_slowly(message: Any, string: Callable[[str], str]) -> str:
    """`encode` for what orjson refuses, as compact as `json.dumps` writes it, with each
    `ExactNumber` as it came, and without recursion (at any depth `decode` returned). Each object
    or array inside is given to orjson first: only those holding what it refuses are written here."""
    parts: list[str] = []
    stack: list[Any] = [message]
    while stack:
        item = stack.pop()
        if item is not message and isinstance(item, dict | list):
            try:
                parts.append(orjson.dumps(item, default=_fragment).decode())
                continue
            except TypeError:
                pass
        if type(item) is _Text:
            parts.append(item.text)
        elif isinstance(item, str):
            parts.append(string(item))
        elif item is None or item is True or item is False:
            parts.append("null" if item is None else "true" if item else "false")
        elif type(item) is ExactNumber:
            parts.append(item.text)
        elif isinstance(item, int):
            parts.append(int.__repr__(item))
        elif isinstance(item, float):
            parts.append(float.__repr__(item) if math.isfinite(item) else "null")  # as orjson
        elif isinstance(item, dict):
            parts.append("{")
            following: list[Any] = []
            for key, value in item.items():
                following += (_COMMA, _Text(_key(key, string) + ":"), value)
            stack.append(_CLOSE_OBJECT)
            stack.extend(reversed(following[1:]))
        elif isinstance(item, list | tuple):
            parts.append("[")
            following = []
            for value in item:
                following += (_COMMA, value)
            stack.append(_CLOSE_ARRAY)
            stack.extend(reversed(following[1:]))
        else:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
    return "".join(parts)


def _key(key: Any, string: Callable[[str], str]) -> str:
    """An object's key as `json.dumps` writes it (a number, boolean or null as its text)."""
    if isinstance(key, str):
        return string(key)
    if key is None or key is True or key is False:
        return string("null" if key is None else "true" if key else "false")
    if isinstance(key, int):
        return string(int.__repr__(key))
    if isinstance(key, float):
        return string(key.text if type(key) is ExactNumber else float.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def remember(latest: dict[IdKey, V], key: IdKey, value: V, limit: int) -> None:
    """Put `key` in `latest` as its newest entry, the oldest dropped past `limit` entries: the
    bounded memories of ids a session keeps (ids are chosen by the peers, so none may grow)."""
    latest.pop(key, None)
    latest[key] = value
    if len(latest) > limit:
        del latest[next(iter(latest))]


def id_key(request_id: Any) -> IdKey:
    """A dict key that keeps `1` and `"1"` apart (they are different JSON-RPC ids). An id JSON-RPC
    does not allow (an object, an array, a boolean) is keyed by its JSON text: it can be neither
    unhashable, which would end the session, nor equal to a valid one (`true` is not `1`)."""
    kind = type(request_id)
    if kind is int or kind is str or request_id is None:
        return (kind is str, request_id)
    if kind is float or kind is ExactNumber:
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
        request_id = decode(match.group(1))  # exact: a long decimal id keeps its digits
    except ValueError:
        return False, None, False
    return True, request_id, request


_BATCH_HEAD = re.compile(rb"\A\s*\[\s*")
_BATCH_TAIL = re.compile(rb"\s*\]\s*\Z")


def is_batch(head: bytes) -> bool:
    """Does a message start as a batch (a JSON array)?"""
    return _BATCH_HEAD.match(head) is not None


def salvage_batch(head: bytes, tail: bytes) -> tuple[bool, Id, bool]:
    """`salvage_envelope` for a batch, from the messages at its two ends (its first one's head, its
    last one's tail): what one of them is, and its id."""
    return salvage_envelope(_BATCH_HEAD.sub(b"", head, count=1), _BATCH_TAIL.sub(b"", tail, count=1))


_EDGE = 1024  # bytes read at each end of a message that is not JSON (as `MessageTooLarge.EDGE`)


def salvage_unparsed(raw: bytes, *, batch: bool = False) -> tuple[bool, Id, bool]:
    """`salvage_envelope` for a whole message that is not JSON, read at its two ends (`batch`:
    `salvage_batch`)."""
    return (salvage_batch if batch else salvage_envelope)(raw[:_EDGE], raw[-_EDGE:])


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
        return True, decode(match.group(1))
    except ValueError:
        return False, None
