"""Line framing with bounded memory, and recovering the id of a message too large to parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_backfill.errors import MessageTooLarge
from mcp_backfill.jsonrpc import salvage_envelope
from mcp_backfill.transports.stdio import LineSplitter


def drain(splitter: LineSplitter) -> list[bytes | MessageTooLarge]:
    out: list[bytes | MessageTooLarge] = []
    while (item := splitter.next_line()) is not None:
        out.append(item)
    return out


def test_lines_split_across_chunks_and_blank_lines_skipped() -> None:
    splitter = LineSplitter(limit=100)
    splitter.feed(b'{"a":')
    assert drain(splitter) == []
    splitter.feed(b'1}\n\n  \r\n{"b":2}\r\n{"c"')
    assert drain(splitter) == [b'{"a":1}', b'{"b":2}']
    splitter.feed(b":3}")
    assert drain(splitter) == []
    assert splitter.finish() == b'{"c":3}'
    assert splitter.finish() is None


def test_oversized_line_is_skipped_while_streaming_and_summarised() -> None:
    splitter = LineSplitter(limit=2048)
    big = b'{"jsonrpc":"2.0","id":7,"result":{"x":"' + b"y" * 10_000 + b'"}}'
    for start in range(0, len(big), 1000):
        splitter.feed(big[start : start + 1000])
        assert drain(splitter) == []
    splitter.feed(b'\n{"ok":1}\n')
    skipped, after = drain(splitter)
    assert isinstance(skipped, MessageTooLarge)
    assert skipped.size == len(big)
    assert skipped.head == big[: MessageTooLarge.EDGE]
    assert skipped.tail == big[-MessageTooLarge.EDGE :]
    assert after == b'{"ok":1}'


def test_oversized_line_within_one_chunk() -> None:
    splitter = LineSplitter(limit=1024)
    splitter.feed(b"x" * 1500 + b"\nshort\n")
    skipped, short = drain(splitter)
    assert isinstance(skipped, MessageTooLarge)
    assert skipped.size == 1500
    assert short == b"short"


def test_oversized_unterminated_line_at_eof() -> None:
    splitter = LineSplitter(limit=1024)
    splitter.feed(b"z" * 5000)
    assert drain(splitter) == []
    skipped = splitter.finish()
    assert isinstance(skipped, MessageTooLarge)
    assert skipped.size == 5000


def big(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


PAD = {"blob": "x" * 5000, "nested": {"id": "not-this-one", "method": "nor/this"}}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # Python SDK order: jsonrpc, id, then result/method.
        (big({"jsonrpc": "2.0", "id": 3, "result": PAD}), (True, 3, False)),
        (big({"jsonrpc": "2.0", "id": "r-1", "method": "tools/call", "params": PAD}), (True, "r-1", True)),
        # TypeScript SDK order: result/method first, jsonrpc and id last.
        (big({"result": PAD, "jsonrpc": "2.0", "id": 0}), (True, 0, False)),
        (
            big({"method": "sampling/createMessage", "params": PAD, "jsonrpc": "2.0", "id": "s"}),
            (True, "s", True),
        ),
        # No top-level id to be found: a notification, or an id buried in the middle.
        (big({"jsonrpc": "2.0", "method": "notifications/x", "params": PAD}), (False, None, False)),
        (big({"result": PAD, "id": 5, "jsonrpc": "2.0"}), (False, None, False)),
        # Neither a method nor a result at its head: which it is cannot be told, so nothing is
        # answered for it (a request read as an answer failed another request with its id).
        (big({"id": 7, "params": PAD, "method": "tools/call", "jsonrpc": "2.0"}), (False, None, False)),
        (big({"jsonrpc": "2.0", "id": 7, "params": PAD, "method": "tools/call"}), (False, None, False)),
        (big({"jsonrpc": "2.0", "id": 7, "error": {"code": 1, "message": "x" * 5000}}), (True, 7, False)),
    ],
)
def test_salvage_envelope(raw: bytes, expected: tuple[bool, Any, bool]) -> None:
    skipped = MessageTooLarge.from_bytes(raw, 1024)
    assert salvage_envelope(skipped.head, skipped.tail) == expected
