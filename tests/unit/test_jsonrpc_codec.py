"""The relay's JSON codec: orjson speed without giving up what `json` accepted or kept exact."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from mcp_backfill import jsonrpc


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":[1,2.5,null]}}}',
        b'{"jsonrpc":"2.0","id":"\\u00e9-\\ud83d\\ude00","result":{"text":"caf\xc3\xa9 \\"q\\"\\n"}}',
        b'  {"a": 1e300, "b": -0.0, "c": 9223372036854775807, "d": -9223372036854775808}  ',
        b"[]",
    ],
)
def test_decode_matches_the_standard_library(raw: bytes) -> None:
    assert jsonrpc.decode(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "number",
    [
        "18446744073709551616",  # 2**64: orjson alone would return a float
        "-9223372036854775809",
        "123456789012345678901234567890",
    ],
)
def test_integers_beyond_64_bits_stay_exact(number: str) -> None:
    message = jsonrpc.decode(f'{{"jsonrpc":"2.0","id":{number},"result":{{}}}}'.encode())
    assert message["id"] == int(number)
    assert isinstance(message["id"], int)
    assert jsonrpc.encode(message) == f'{{"jsonrpc":"2.0","id":{number},"result":{{}}}}'.encode()


def test_long_integer_found_across_the_scan_windows() -> None:
    # 20 digits, 10 on each side of the 1 MiB boundary of the chunked scan: neither window alone
    # holds the 19 that trigger the exact parser.
    prefix = b'{"pad":"' + b"x" * ((1 << 20) - 24) + b'","n":'
    assert len(prefix) == (1 << 20) - 10
    value = jsonrpc.decode(prefix + b"98765432109876543210}")["n"]
    assert value == 98765432109876543210
    assert isinstance(value, int)


def test_inputs_only_the_standard_library_accepts_still_parse() -> None:
    assert math.isnan(jsonrpc.decode(b'{"x":NaN}')["x"])
    assert jsonrpc.decode(b'"\\ud800"') == "\ud800"  # a lone surrogate


@pytest.mark.parametrize("raw", [b'{"a":1', b"\xff\xfe", b"", b"{'a':1}"])
def test_malformed_input_raises_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - both codecs' errors are ValueErrors
        jsonrpc.decode(raw)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 7, "result": {"text": "café ☃", "n": [1, 2.5, None, True]}},
        {"id": 10**30, "key": {"nested": "ü"}},
    ],
)
def test_encode_is_compact_utf8_like_the_sdks(message: Any) -> None:
    assert jsonrpc.encode(message) == json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"result":{"x":1}}', (True, 1)),
        (b'{"jsonrpc":"2.0","id":"1","error":{"code":1}}', (True, "1")),
        (b'{ "jsonrpc" : "2.0" , "id" : "a\\"b" , "result" : {}}', (True, 'a"b')),
        (b'{"jsonrpc":"2.0","id":0,"result":null}', (True, 0)),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}', (False, None)),
        (b'{"id":1,"jsonrpc":"2.0","result":{}}', (False, None)),
        (b'[{"jsonrpc":"2.0","id":1,"result":{}}]', (False, None)),
    ],
)
def test_response_head_id_reads_only_plain_responses(raw: bytes, expected: tuple[bool, object]) -> None:
    assert jsonrpc.response_head_id(raw) == expected


@pytest.mark.parametrize(
    "number",
    ["1e400", "-1e400", "1.00000000000000000000001", "-0.1234567890123456789012e-5", "NaN", "-Infinity"],
)
def test_numbers_a_double_cannot_hold_are_written_back_as_they_came(number: str) -> None:
    raw = f'{{"jsonrpc":"2.0","id":1,"params":{{"a":[{number}],"b":{{"c":{number}}}}}}}'.encode()
    message = jsonrpc.decode(raw)
    value = message["params"]["b"]["c"]
    assert isinstance(value, float)  # read as the nearest double
    assert value == float(number) or math.isnan(value)
    message["method"] = "rewritten"
    assert jsonrpc.encode(message) == raw[:-1] + b',"method":"rewritten"}'


def test_numbers_a_double_holds_stay_plain_floats() -> None:
    message = jsonrpc.decode(b'{"a":[1.5,0.1,1E2,-0.0],"n":"' + b"1" * 19 + b'"}')  # the exact path
    assert [type(v) for v in message["a"]] == [float] * 4
    assert jsonrpc.encode(message["a"]) == b"[1.5,0.1,100.0,-0.0]"
    slow = b'[1E-400,"' + b"1" * 19 + b'"]'  # 1e-400 is kept when the message takes the exact path
    assert jsonrpc.encode(jsonrpc.decode(slow)) == slow


def test_what_orjson_refuses_is_written_as_json_writes_it_with_exact_numbers() -> None:
    value: Any = {"s": "caf\u00e9 \ud800", "big": 2**70, "x": [None, True, False, 1.5, {}, [], (1, 2)]}
    value[3] = "a key json.dumps writes as text"
    value["n"] = jsonrpc.decode(b"1e400")
    expected = json.dumps(value, separators=(",", ":")).replace("Infinity", "1e400")
    assert jsonrpc.encode(value) == expected.encode()
    deep = jsonrpc.decode(b"[" * 900 + b"1e400," + b"1" * 30 + b"]" * 900)
    assert jsonrpc.encode(deep) == b"[" * 900 + b"1e400," + b"1" * 30 + b"]" * 900
