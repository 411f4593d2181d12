"""Per-request limits: what is counted, where the boundary is, and what the errors say."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from mcp_backfill.errors import SamplingError
from mcp_backfill.protocol import INTERNAL_ERROR, INVALID_PARAMS
from mcp_backfill.sampling.limits import check_request, check_response, measure_request
from tests.defaults import LIMITS as DEFAULT_LIMITS


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def b64(size: int) -> str:
    return base64.b64encode(bytes(size)).decode()


def request(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": list(messages), "maxTokens": 10, **extra}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def test_text_bytes_count_utf8_of_every_text_part() -> None:
    tool = {"name": "f", "inputSchema": {"type": "object"}}
    params = request(
        user(text("héllo")),  # 6 bytes
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]},
        user(
            [
                {
                    "type": "tool_result",
                    "toolUseId": "t",
                    "content": [text("ok"), {"type": "resource", "resource": {"uri": "u", "text": "€"}}],
                    "structuredContent": {"v": 2},
                }
            ]
        ),
        systemPrompt="sys",  # 3 bytes
        tools=[tool],
    )
    size = measure_request(params)
    expected = (
        6
        + 3
        + len(json.dumps(tool, separators=(",", ":")))
        + len('{"a":1}')
        + len("t") * 2  # the tool use's id, and the tool result's
        + len("f")  # the tool's name in the tool use
        + 2
        + 3  # "€" is 3 bytes
        + len('{"v":2}')
    )
    assert size.text_bytes == expected
    assert (size.messages, size.tools, size.binary_bytes) == (3, 1, 0)


def test_binary_bytes_are_decoded_sizes_wherever_the_data_is() -> None:
    params = request(
        user({"type": "image", "data": b64(1000), "mimeType": "image/png"}),
        {"role": "assistant", "content": text("a")},
        user({"type": "audio", "data": "data:audio/wav;base64," + b64(10), "mimeType": "audio/wav"}),
    )
    assert measure_request(params).binary_bytes == 1010
    nested = request(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        user(
            [
                {
                    "type": "tool_result",
                    "toolUseId": "t",
                    "content": [
                        {"type": "image", "data": b64(7), "mimeType": "image/png"},
                        {"type": "resource", "resource": {"uri": "u", "blob": b64(5)}},
                    ],
                }
            ]
        ),
    )
    assert measure_request(nested).binary_bytes == 12


def test_whitespace_in_base64_is_not_counted() -> None:
    data = b64(300)
    wrapped = "\n".join(data[i : i + 76] for i in range(0, len(data), 76))
    params = request(user({"type": "image", "data": wrapped, "mimeType": "image/png"}))
    assert measure_request(params).binary_bytes == 300


@pytest.mark.parametrize(
    "params",
    [None, [], "x", {"messages": "nope"}, {"messages": [1, None, {"content": 5}]}, {"tools": {"a": 1}}],
)
def test_malformed_params_are_measured_without_crashing(params: Any) -> None:
    size = measure_request(params)
    assert size.text_bytes >= 0
    check_request(params, DEFAULT_LIMITS)  # validation, not the limits, reports malformed params


LIMITS = replace(DEFAULT_LIMITS, max_messages=2, max_text_bytes=10, max_binary_bytes=100, max_tools=1)


@pytest.mark.parametrize(
    ("params", "option", "env", "actual"),
    [
        (request(user(text("a")), user(text("b")), user(text("c"))), "--max-messages", "MAX_MESSAGES", 3),
        (request(user(text("x" * 11))), "--max-text-bytes", "MAX_TEXT_BYTES", 11),
        (
            request(user({"type": "image", "data": b64(101), "mimeType": "image/png"})),
            "--max-binary-bytes",
            "MAX_BINARY_BYTES",
            101,
        ),
        (
            request(user(text("q")), tools=[{"name": "a"}, {"name": "b"}]),
            "--max-tools",
            "MAX_TOOLS",
            2,
        ),
    ],
    ids=["messages", "text", "binary", "tools"],
)
def test_a_request_over_a_limit_is_invalid_params_naming_the_option(
    params: dict[str, Any], option: str, env: str, actual: int
) -> None:
    with pytest.raises(SamplingError) as caught:
        check_request(params, LIMITS)
    error = caught.value
    assert error.code == INVALID_PARAMS
    assert option in error.message
    assert f"MCP_BACKFILL_{env}" in error.message
    assert error.data is not None
    assert error.data["option"] == option
    assert error.data["actual"] == actual


def test_exactly_at_the_limits_passes() -> None:
    params = request(
        user(text("x" * 10)),
        {"role": "assistant", "content": {"type": "image", "data": b64(100), "mimeType": "image/png"}},
        tools=[],
    )
    limits = replace(DEFAULT_LIMITS, max_messages=2, max_text_bytes=10, max_binary_bytes=100)
    size = check_request(params, limits)
    assert (size.messages, size.text_bytes, size.binary_bytes) == (2, 10, 100)


def tool_calls(count: int) -> dict[str, Any]:
    content = [{"type": "tool_use", "id": f"t{n}", "name": "f", "input": {}} for n in range(count)]
    return {"content": [{"type": "text", "text": "calling"}, *content]}


def test_a_response_with_too_many_tool_calls_is_an_internal_error() -> None:
    limits = replace(DEFAULT_LIMITS, max_tool_calls=2)
    check_response(tool_calls(2), limits)
    with pytest.raises(SamplingError) as caught:
        check_response(tool_calls(3), limits)
    assert caught.value.code == INTERNAL_ERROR
    assert "--max-tool-calls" in caught.value.message
    assert "MCP_BACKFILL_MAX_TOOL_CALLS" in caught.value.message
    expected = {"limit": "max_tool_calls", "option": "--max-tool-calls", "max": 2, "actual": 3}
    assert caught.value.data == expected


def _tool_result(content: object, tool_use_id: str = "t1") -> dict[str, Any]:
    return request(
        {"role": "assistant", "content": [{"type": "tool_use", "id": tool_use_id, "name": "t", "input": {}}]},
        user([{"type": "tool_result", "toolUseId": tool_use_id, "content": content}]),
    )


@pytest.mark.parametrize(
    "params",
    [
        _tool_result({"data": "x" * 50_000}),  # a draft-shape tool result: any JSON value
        # Objects with a block's type but not its fields: the tool's own JSON, sent as text.
        _tool_result({"type": "image", "data": "A" * 50_000}),
        _tool_result({"type": "audio", "data": "A" * 50_000, "mimeType": 7}),
        _tool_result({"type": "resource", "resource": {"blob": "A" * 50_000}}),
        _tool_result([{"type": "custom", "blob": "x" * 50_000}]),  # a block of no known type
        _tool_result([], tool_use_id="i" * 50_000),  # ids go to Claude as they are, twice
        {**request(user(text("go"))), "stopSequences": ["s" * 50_000]},
    ],
    ids=[
        "draft-object-data",
        "draft-image-shaped",
        "draft-audio-shaped",
        "draft-resource-shaped",
        "unknown-block-blob",
        "tool-use-id",
        "stop-sequences",
    ],
)
def test_everything_that_goes_to_claude_as_text_counts_as_text(params: dict[str, Any]) -> None:
    """Data in a block of no known type was counted as binary (against the larger limit) though it
    goes to Claude as JSON text; ids and stop sequences were not counted: 50 KB of text passed a
    10 KB `--max-text-bytes`."""
    with pytest.raises(SamplingError, match="text bytes"):
        check_request(params, replace(DEFAULT_LIMITS, max_text_bytes=10_000))


def test_a_request_nested_too_deeply_to_measure_is_invalid_params() -> None:
    """JSON nested ~1,000 levels (the decoder takes 1,024) overflowed the measuring: -32603 and a
    traceback, instead of the -32602 for a bad request."""
    from mcp_backfill.jsonrpc import decode

    deep = decode(b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}")
    params = request(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": deep}]}
    )
    with pytest.raises(SamplingError, match="nested too deeply") as raised:
        check_request(params, DEFAULT_LIMITS)
    assert raised.value.code == INVALID_PARAMS


def test_content_blocks_are_bounded_before_any_conversion() -> None:
    """One message of a million one-letter text blocks (26 MiB, under `--max-message-bytes`) passed
    every limit and was converted (1.6 s of the event loop's CPU, every session waiting) and sent;
    past `--max-content-blocks` it is refused, counting blocks inside tool results too."""
    limits = replace(DEFAULT_LIMITS, max_content_blocks=10)
    text = {"type": "text", "text": "a"}
    check_request({"messages": [{"role": "user", "content": [text] * 10}]}, limits)
    for params in (
        {"messages": [{"role": "user", "content": [text] * 11}]},
        {"messages": [{"role": "user", "content": [text] * 6}, {"role": "user", "content": [text] * 5}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "toolUseId": "t", "content": [text] * 10}],
                }
            ]
        },
    ):
        with pytest.raises(SamplingError) as caught:
            check_request(params, limits)
        assert caught.value.code == INVALID_PARAMS
        assert "--max-content-blocks" in caught.value.message
        assert "MCP_BACKFILL_MAX_CONTENT_BLOCKS" in caught.value.message
        assert caught.value.data is not None
        assert caught.value.data["limit"] == "max_content_blocks"


def test_the_default_content_block_limit_refuses_a_million_blocks() -> None:
    params = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 1_000_000}]}
    with pytest.raises(SamplingError, match="--max-content-blocks"):
        check_request(params, DEFAULT_LIMITS)
