"""Properties of the relay's JSON codec: exact round trips, and ids recovered from raw bytes.

`same` compares JSON values strictly (1 is not 1.0, -0.0 is not 0.0, key order counts), since
the relay must hand every message and id on exactly as it came.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill import jsonrpc
from mcp_backfill.errors import MessageTooLarge

BOUNDARY_INTS = (
    0,
    -1,
    1,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64 - 1,
    2**64,
    -(2**64),
    10**30,
)
INTS: st.SearchStrategy[int] = st.one_of(
    st.integers(), st.integers(-(2**80), 2**80), st.sampled_from(BOUNDARY_INTS)
)
FLOATS: st.SearchStrategy[float] = st.floats(allow_nan=False, allow_infinity=False)
LONE_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# What JSON escapes, plus the characters that end a string or an escape.
_AWKWARD = st.text(st.sampled_from('"\\/\n\t\x00\x7fu0é😀'), max_size=8)
TEXT = st.one_of(st.text(max_size=30), _AWKWARD)  # no lone surrogates: see the test at the end
# A high surrogate followed by a low one is no lone surrogate: JSON reads "\ud800\udc00" as U+10000.
_SURROGATE_PAIR = re.compile("([\ud800-\udbff])([\udc00-\udfff])")


def _split_pairs(text: str) -> str:
    return _SURROGATE_PAIR.sub(r"\1-\2", text)


# Any code point, lone surrogates included (JSON carries them as \ud800 escapes). Built from a list:
# st.text() leaves surrogates out of any alphabet.
ANY_TEXT: st.SearchStrategy[str] = st.one_of(
    st.lists(st.characters() | LONE_SURROGATES, max_size=30).map("".join).map(_split_pairs), _AWKWARD
)


def json_values(strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | INTS | FLOATS | strings,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(strings, children, max_size=4),
        max_leaves=12,
    )


VALUES = json_values(TEXT)
ANY_VALUES = json_values(ANY_TEXT)
IDS: st.SearchStrategy[Any] = st.one_of(INTS, TEXT, FLOATS)


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def has_lone_surrogate(value: Any) -> bool:
    text = json.dumps(value, ensure_ascii=False)
    return any(0xD800 <= ord(char) <= 0xDFFF for char in text)


@st.composite
def serialized(draw: st.DrawFn, message: Any) -> bytes:
    """`message` as the relay may receive it: from orjson, or `json` compact, spaced or indented."""
    styles = ["json ascii", "json spaced", "json indented"]
    if not has_lone_surrogate(message):
        styles += ["jsonrpc", "json utf-8"]
    style = draw(st.sampled_from(styles))
    if style == "jsonrpc":
        return jsonrpc.encode(message)
    if style == "json utf-8":
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    if style == "json spaced":
        return json.dumps(message).encode()
    if style == "json indented":
        return json.dumps(message, indent=2).encode()
    return json.dumps(message, separators=(",", ":")).encode()


# --- encode / decode ----------------------------------------------------------------------------


@given(VALUES)
def test_encode_then_decode_is_exact(value: Any) -> None:
    assert same(jsonrpc.decode(jsonrpc.encode(value)), value)


@given(VALUES)
def test_encode_is_compact_json_that_the_standard_library_reads_back(value: Any) -> None:
    raw = jsonrpc.encode(value)
    assert same(json.loads(raw), value)
    if not any(isinstance(leaf, float) for leaf in _leaves(value)):  # floats may be spelled 1e16 or 1e+16
        assert raw == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


@given(ANY_VALUES, st.data())
def test_decode_reads_what_the_standard_library_reads(value: Any, data: st.DataObject) -> None:
    raw = data.draw(serialized(value))
    assert same(jsonrpc.decode(raw), json.loads(raw))


@given(IDS, st.sampled_from(["request", "result", "error"]), VALUES)
def test_message_ids_survive_the_codec(request_id: Any, kind: str, payload: Any) -> None:
    if kind == "request":
        message = {"jsonrpc": "2.0", "id": request_id, "method": "sampling/createMessage", "params": payload}
    elif kind == "result":
        message = jsonrpc.result_response(request_id, {"value": payload})
    else:
        message = jsonrpc.error_response(request_id, -32603, "failed", payload)
    decoded = jsonrpc.decode(jsonrpc.encode(message))
    assert same(decoded["id"], request_id)
    assert jsonrpc.id_key(decoded["id"]) == jsonrpc.id_key(request_id)


@given(st.one_of(st.binary(max_size=40), VALUES.map(jsonrpc.encode)), st.data())
def test_decode_fails_only_with_value_error(raw: bytes, data: st.DataObject) -> None:
    """Malformed input (random bytes, truncated or spliced JSON) is a ValueError the relay answers."""
    cut = data.draw(st.integers(0, len(raw)))
    raw = data.draw(
        st.sampled_from([raw, raw[:cut], raw[:cut] + data.draw(st.binary(max_size=3)) + raw[cut:]])
    )
    with contextlib.suppress(ValueError):
        jsonrpc.decode(raw)


# --- ids ----------------------------------------------------------------------------------------


@given(st.one_of(INTS, TEXT), st.one_of(INTS, TEXT))
def test_id_key_equal_exactly_for_the_same_id(a: Any, b: Any) -> None:
    assert (jsonrpc.id_key(a) == jsonrpc.id_key(b)) == (type(a) is type(b) and a == b)
    assert len({jsonrpc.id_key(a), jsonrpc.id_key(b)}) == (1 if type(a) is type(b) and a == b else 2)


@given(INTS)
def test_id_key_keeps_a_number_and_its_string_apart(number: int) -> None:
    assert jsonrpc.id_key(number) != jsonrpc.id_key(str(number))
    assert jsonrpc.id_key(number) == jsonrpc.id_key(jsonrpc.decode(jsonrpc.encode(number)))


SALVAGEABLE_IDS: st.SearchStrategy[Any] = st.one_of(INTS, ANY_TEXT, st.none())


@given(SALVAGEABLE_IDS | FLOATS, st.sampled_from(["result", "error"]), VALUES, st.data())
def test_response_head_id_reads_the_id_of_a_response(
    request_id: Any, key: str, payload: Any, data: st.DataObject
) -> None:
    raw = data.draw(serialized({"jsonrpc": "2.0", "id": request_id, key: payload}))
    found, head_id = jsonrpc.response_head_id(raw)
    if found:
        assert same(head_id, request_id)
    else:
        assert head_id is None
        # Only float ids in exponent notation are beyond the fast path (they are not valid ids anyway).
        assert isinstance(request_id, float)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[dict[str, Any], bool, bool]:
    """(message, has an id, is a request): padded so that the id is at one end only, with decoys."""
    request_id = draw(SALVAGEABLE_IDS)
    method = draw(st.sampled_from(["", "tools/call", "notifications/progress"]))
    pad = {"blob": "x" * draw(st.integers(0, 5000)), "nested": {"id": "decoy", "method": "decoy/method"}}
    pad.update(draw(st.dictionaries(TEXT, VALUES, max_size=3)))
    body = {"method": method, "params": pad} if method else {"result": pad}
    has_id = method != "notifications/progress"
    envelope = {"jsonrpc": "2.0", "id": request_id} if has_id else {"jsonrpc": "2.0"}
    order = draw(st.sampled_from(["envelope first", "id first", "envelope last"]))
    if order == "envelope first":
        message = {**envelope, **body}
    elif order == "id first":
        message = {**dict(reversed(envelope.items())), **body}
    else:
        message = {**body, **envelope}
    return message, has_id, bool(method)


@given(envelopes(), st.data())
def test_salvage_envelope_finds_the_id_at_either_end(
    envelope: tuple[dict[str, Any], bool, bool], data: st.DataObject
) -> None:
    message, has_id, is_request = envelope
    raw = data.draw(serialized(message))
    too_large = MessageTooLarge.from_bytes(raw, limit=1024)
    found, request_id, request = jsonrpc.salvage_envelope(too_large.head, too_large.tail)
    if has_id:
        assert (found, request) == (True, is_request)
        assert same(request_id, message["id"])
    else:
        assert (found, request_id, request) == (False, None, False)


# --- found by these properties, fixed: lone surrogates crashed encode, deep nesting crashed decode ---


@given(st.builds(lambda a, s, b: a + s + b, TEXT, LONE_SURROGATES, TEXT))
def test_lone_surrogates_survive_the_codec(request_id: str) -> None:
    message = {"jsonrpc": "2.0", "id": request_id, "result": {}}
    raw = json.dumps(message).encode()  # what a client may send: valid JSON, \ud800 escapes
    assert same(jsonrpc.decode(raw), message)
    assert same(jsonrpc.decode(jsonrpc.encode(jsonrpc.decode(raw))), message)


@given(st.integers(1_100, 5_000), st.sampled_from([("[", "]"), ('{"a":', "}")]))
def test_deeply_nested_json_fails_with_value_error(depth: int, brackets: tuple[str, str]) -> None:
    opening, closing = brackets
    raw = (opening * depth + "1" + closing * depth).encode()
    with contextlib.suppress(ValueError):
        jsonrpc.decode(raw)


class _Opaque:
    def __str__(self) -> str:
        return "opaque ü"


@given(st.one_of(VALUES, st.lists(st.builds(_Opaque), max_size=2)))
def test_compact_text_is_compact_json_with_everything_else_as_text(value: Any) -> None:
    """The size the limits and the estimate measure: `json.dumps`' compact, non-ASCII form."""
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    assert jsonrpc.compact_text(value) == expected
