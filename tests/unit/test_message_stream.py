"""`MessageFold` against the anthropic SDK's own accumulation of a stream (`accumulate_event`, then
`model_dump(mode="json", exclude_none=True)`, what the provider returned before the fold), on streams
shaped as the Messages API sends them; and the malformed streams where the two part ways."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_backfill.providers.message_stream import MessageFold, without_nulls

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
COUNTS = st.integers(min_value=0, max_value=10**7)
MAYBE_COUNT = st.none() | COUNTS


@st.composite
def citations(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "type": "char_location",
        "cited_text": draw(st.text(max_size=10)),
        "document_index": draw(st.integers(0, 3)),
        "document_title": draw(st.none() | st.text(max_size=8)),
        "start_char_index": 0,
        "end_char_index": draw(st.integers(0, 50)),
        "file_id": None,
    }


@st.composite
def blocks(draw: st.DrawFn) -> dict[str, Any]:
    """A content block as the finished message has it."""
    kind = draw(st.sampled_from(["text", "tool_use", "server_tool_use", "thinking", "redacted_thinking"]))
    if kind == "text":
        return {
            "type": "text",
            "text": draw(st.text(max_size=40)),
            "citations": draw(st.lists(citations(), max_size=2)),
        }
    if kind in ("tool_use", "server_tool_use"):
        name = "web_search" if kind == "server_tool_use" else draw(st.sampled_from(["lookup", "get_weather"]))
        tool_input = draw(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4))
        return {"type": kind, "id": f"toolu_{draw(st.integers(0, 999))}", "name": name, "input": tool_input}
    if kind == "thinking":
        return {
            "type": "thinking",
            "thinking": draw(st.text(max_size=30)),
            "signature": draw(st.text(max_size=8)),
        }
    return {"type": "redacted_thinking", "data": draw(st.text(min_size=1, max_size=12))}


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at arbitrary places (empty pieces included, as the API sometimes sends)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The events of one message, in the API's order."""
    start_usage = {
        "input_tokens": draw(COUNTS),
        "output_tokens": draw(st.integers(0, 5)),
        "cache_creation_input_tokens": draw(MAYBE_COUNT),
        "cache_read_input_tokens": draw(MAYBE_COUNT),
        "cache_creation": draw(
            st.none()
            | st.fixed_dictionaries(
                {"ephemeral_5m_input_tokens": COUNTS, "ephemeral_1h_input_tokens": COUNTS}
            )
        ),
        "server_tool_use": draw(st.none() | st.fixed_dictionaries({"web_search_requests": COUNTS})),
        "service_tier": draw(st.none() | st.just("standard")),
    }
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": draw(st.sampled_from(["claude-sonnet-5", "claude-haiku-5"])),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(draw(st.lists(blocks(), max_size=4))):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        start: dict[str, Any]
        if kind == "text":
            start = {"type": "text", "text": "", "citations": None}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(draw, block["text"])]
            deltas += [{"type": "citations_delta", "citation": citation} for citation in block["citations"]]
        elif kind in ("tool_use", "server_tool_use"):
            start = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces(draw, raw)]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": piece} for piece in pieces(draw, block["thinking"])
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            start = block
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events.append({"type": "content_block_stop", "index": index})
    end_usage: dict[str, int | None] = {"output_tokens": draw(COUNTS)}
    for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        end_usage[field] = draw(MAYBE_COUNT)
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": draw(st.sampled_from(["end_turn", "tool_use", "max_tokens", "stop_sequence"])),
                "stop_sequence": draw(st.none() | st.just("END")),
            },
            "usage": end_usage,
        }
    )
    events.append({"type": "message_stop"})
    return events


def sdk_fold(events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The SDK's message, and its usage after each event that carries usage, as the provider read them."""
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    usages = []
    for event in json.loads(json.dumps(events)):  # fresh copies: the SDK's models may share them
        if event["type"] == "message_stop":
            continue
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
        if event["type"] in ("message_start", "message_delta"):
            usages.append(snapshot.usage.model_dump(exclude_none=True))
    return snapshot.model_dump(mode="json", exclude_none=True), usages


def our_fold(events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]], MessageFold]:
    fold = MessageFold()
    usages = []
    for event in json.loads(json.dumps(events)):
        if fold.add(event) in ("message_start", "message_delta"):
            usages.append(fold.usage())
    return fold.message(), usages, fold


@settings(max_examples=300, deadline=None)
@given(streams())
def test_the_fold_gives_the_sdks_message_and_usage(events: list[dict[str, Any]]) -> None:
    message, usages, _ = our_fold(events)
    assert (message, usages) == sdk_fold(events)


@settings(max_examples=100, deadline=None)
@given(streams())
def test_characters_count_text_thinking_and_tool_input(events: list[dict[str, Any]]) -> None:
    _, _, fold = our_fold(events)
    expected = 0
    for event in events:
        if event["type"] == "content_block_delta":
            delta = event["delta"]
            expected += len(delta.get("text") or delta.get("partial_json") or delta.get("thinking") or "")
    assert fold.characters == expected


def test_a_tool_input_keeps_its_nulls_and_other_objects_lose_theirs() -> None:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 3, "service_tier": None},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": null, '},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '"b": [null]}'},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    message, _, _ = our_fold(events)
    assert message == {
        "id": "m",
        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": None, "b": [None]}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 9},
    }


def test_a_long_integer_in_a_tool_input_stays_exact() -> None:
    fold = MessageFold()
    fold.add({"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}})
    fold.add({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}})
    fold.add(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"n": 12345678901234567890123}'},
        }
    )
    fold.add({"type": "content_block_stop", "index": 0})
    assert fold.message()["content"][0]["input"] == {"n": 12345678901234567890123}


MALFORMED = {
    "delta before message_start": [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
    ],
    "delta of a block never started": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    ],
    "event without a type": [{"message": {}}],
    "not an object": [["message_start"]],
    "message_start without a message": [{"type": "message_start"}],
    "tool input that is not JSON": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
        {"type": "content_block_stop", "index": 0},
    ],
    "a second message_start": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
        {"type": "message_start", "message": {"content": [], "usage": {}}},
    ],
    "delta of a negative index": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": -1, "delta": {"type": "text_delta", "text": "x"}},
    ],
    "a block started twice": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ],
    "a block started past the next index": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    ],
    "a delta of a block already stopped": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": "/"}'},
        },
    ],
    "a text delta that is no string": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 123}},
    ],
    "a block's text that is no string": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": 5}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    ],
    "tool input pieces that are no strings": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": 5}},
    ],
    "content that is no list": [{"type": "message_start", "message": {"content": "abc", "usage": {}}}],
    "a stop reason that is no string": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "message_delta", "delta": {"stop_reason": {"x": 1}}, "usage": {"output_tokens": 1}},
    ],
    "tool input that is no object": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "[1, 2]"},
        },
        {"type": "content_block_stop", "index": 0},
    ],
    "a block after message_stop": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}},
    ],
    "message_delta without usage": [
        {"type": "message_start", "message": {"content": [], "usage": {}}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
    ],
}


@pytest.mark.parametrize("events", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_stream_is_a_value_error(events: list[Any]) -> None:
    """A `ValueError` (the provider's "malformed stream", retried), never another exception (the
    provider's "the client could not make the call", not retried, for a call Claude billed)."""

    def fold_all() -> None:
        fold = MessageFold()
        for event in events:
            fold.add(event)
        fold.message()

    with pytest.raises(ValueError, match=r"\S"):
        fold_all()


def test_a_message_never_started_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no message_start"):
        MessageFold().message()


def test_unknown_events_and_blocks_pass_through() -> None:
    fold = MessageFold()
    fold.add({"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}})
    fold.add(
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "future_block", "x": {"y": None, "z": 1}},
        }
    )
    fold.add({"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "text": "ab"}})
    assert fold.add({"type": "future_event"}) == "future_event"
    assert fold.message()["content"] == [{"type": "future_block", "x": {"z": 1}}]
    assert fold.characters == 2


@given(JSON_VALUES)
def test_without_nulls_leaves_no_null_field(value: Any) -> None:
    def fields(item: Any) -> list[Any]:
        if isinstance(item, dict):
            return [v for field in item.values() for v in (field, *fields(field))]
        if isinstance(item, list):
            return [v for element in item for v in fields(element)]
        return []

    cleaned = without_nulls(value)
    assert None not in fields(cleaned)
    assert without_nulls(cleaned) == cleaned


def _cut_tool_call(stop_reason: str) -> list[dict[str, Any]]:
    return [
        {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Writing."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "input": {}}},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": "a.txt", "content": "lor'},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 100}},
        {"type": "message_stop"},
    ]


@pytest.mark.parametrize("stop_reason", ["max_tokens", "refusal", "model_context_window_exceeded"])
def test_a_tool_call_cut_short_is_left_out_of_the_message(stop_reason: str) -> None:
    """Each of these stop reasons ends generation wherever it is (the token limit, a streaming refusal,
    the context window). A half-written tool call used to make a well-formed stream "malformed",
    retried (and billed) again and again; the SDK keeps what it can parse of it, which no server
    should run."""
    fold = MessageFold()
    for event in _cut_tool_call(stop_reason):
        fold.add(event)
    message = fold.message()
    assert message["stop_reason"] == stop_reason
    assert message["content"] == [{"type": "text", "text": "Writing."}]


@pytest.mark.parametrize("stop_reason", ["tool_use", "end_turn", "stop_sequence"])
def test_a_tool_call_cut_short_without_a_reason_is_malformed(stop_reason: str) -> None:
    broken = MessageFold()
    for event in _cut_tool_call(stop_reason):
        broken.add(event)
    with pytest.raises(ValueError, match="not valid JSON"):
        broken.message()
