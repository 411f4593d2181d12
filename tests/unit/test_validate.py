"""validate_params: every rule answers -32602 with a message that says what and where."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from mcp_types.methods import parse_server_request

from mcp_backfill.errors import SamplingError
from mcp_backfill.jsonrpc import decode
from mcp_backfill.protocol import INVALID_PARAMS
from mcp_backfill.sampling.validate import (
    ToolChoice,
    as_block_list,
    block_path,
    read_tool_choice,
    validate_params,
)
from tests.unit.wire_samples import RELEASED_TOOL_LOOP, WEATHER_TOOL, assistant, params, text, tool_use, user

# The SEP-1577 draft shape (seeds 000/001): snake_case tool_choice, single-object content,
# tool_result content as an arbitrary JSON object.
DRAFT_TOOL_LOOP: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": {"type": "text", "text": "What's the weather in SF?"}},
        {
            "role": "assistant",
            "content": {
                "type": "tool_use",
                "id": "tool_1",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA"},
            },
        },
        {
            "role": "user",
            "content": {
                "type": "tool_result",
                "toolUseId": "tool_1",
                "content": {"temperature": 65, "condition": "Partly cloudy", "humidity": 70},
                "isError": True,
            },
        },
    ],
    "tools": [WEATHER_TOOL],
    "tool_choice": {"mode": "auto", "disable_parallel_tool_use": True},
    "maxTokens": 1000,
}


def tool_result(tool_use_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "toolUseId": tool_use_id, "content": [text("ok")]}


def rejected(value: Any, *fragments: str, audio: Any = "reject") -> SamplingError:
    """Assert validation fails with -32602 and a message containing every fragment."""
    with pytest.raises(SamplingError) as caught:
        validate_params(value, audio=audio)
    error = caught.value
    assert error.code == INVALID_PARAMS
    for fragment in fragments:
        assert fragment in error.message, error.message
    return error


# --- accepted shapes ------------------------------------------------------------------------------


def test_released_shape_is_accepted_and_really_is_2025_11_25_wire() -> None:
    parse_server_request("sampling/createMessage", "2025-11-25", RELEASED_TOOL_LOOP)
    validate_params(RELEASED_TOOL_LOOP)


def test_draft_shape_is_accepted() -> None:
    validate_params(DRAFT_TOOL_LOOP)


def test_minimal_request_is_accepted() -> None:
    validate_params({"messages": [{"role": "user", "content": text()}], "maxTokens": 1})


def test_validation_does_not_modify_params() -> None:
    given = copy.deepcopy(RELEASED_TOOL_LOOP)
    validate_params(given)
    assert given == RELEASED_TOOL_LOOP


def test_draft_tool_result_with_single_block_content_is_accepted() -> None:
    result = {"type": "tool_result", "toolUseId": "a", "content": text("42")}
    validate_params(params(user(text()), assistant(tool_use("a")), user(result)))


@pytest.mark.parametrize(
    "content",
    [
        {"type": "text", "value": "tool output", "score": 3},
        {"type": "text"},
        {"type": "image", "url": "https://example.com/a.png"},
        {"type": "resource_link", "name": "no uri"},
        {"type": "resource", "resource": "not an object"},
    ],
)
def test_draft_object_content_with_a_block_type_key_is_accepted(content: dict[str, Any]) -> None:
    """The draft's `content` is "any JSON-serializable object" (seeds 000/001): an object with a
    block's `type` but not that block's fields is such an object, not a malformed block."""
    result = {"type": "tool_result", "toolUseId": "a", "content": content}
    validate_params(params(user(text()), assistant(tool_use("a")), user(result)))


def test_tool_result_without_content_is_accepted() -> None:
    validate_params(params(assistant(tool_use("a")), user({"type": "tool_result", "toolUseId": "a"})))


def test_unknown_nested_tool_result_block_is_accepted() -> None:
    result = {"type": "tool_result", "toolUseId": "a", "content": [{"type": "future_block", "x": 1}]}
    validate_params(params(assistant(tool_use("a")), user(result)))


def test_parallel_tool_uses_answered_together_in_any_order() -> None:
    validate_params(
        params(
            user(text()),
            assistant(text("two calls"), tool_use("a"), tool_use("b")),
            user(tool_result("b"), tool_result("a")),
            assistant(text("done")),
        )
    )


def test_audio_is_accepted_under_placeholder_policy() -> None:
    audio = {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}
    validate_params(params(user(audio)), audio="placeholder")


def test_audio_inside_tool_result_is_accepted_under_reject_policy() -> None:
    audio = {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}
    result = {"type": "tool_result", "toolUseId": "a", "content": [audio]}
    validate_params(params(assistant(tool_use("a")), user(result)), audio="reject")


def test_null_optional_fields_count_as_absent() -> None:
    validate_params(params(user(text()), tools=None, toolChoice=None, systemPrompt=None, stopSequences=None))


# --- params and messages ----------------------------------------------------------------------------


@pytest.mark.parametrize("params", [None, [], "x", 3])
def test_params_must_be_an_object(params: Any) -> None:
    rejected(params, "params must be an object")


def test_messages_missing() -> None:
    rejected({"maxTokens": 10}, "messages is required")


@pytest.mark.parametrize("messages", [{"role": "user"}, "hello", 3])
def test_messages_not_an_array(messages: Any) -> None:
    rejected({"messages": messages, "maxTokens": 10}, "messages must be an array")


def test_messages_empty() -> None:
    rejected({"messages": [], "maxTokens": 10}, "messages must not be empty")


def test_message_not_an_object() -> None:
    rejected(params(user(text()), "hi"), "messages[1] must be an object")  # type: ignore[arg-type]


@pytest.mark.parametrize("role", ["system", "tool", None, 1])
def test_bad_role(role: Any) -> None:
    rejected(
        params(user(text()), {"role": role, "content": text()}), "messages[1].role", "'user' or 'assistant'"
    )


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": None}])
def test_content_missing(message: dict[str, Any]) -> None:
    rejected(params(message), "messages[0].content is required")


@pytest.mark.parametrize("content", ["plain string", 42, True])
def test_content_of_wrong_shape(content: Any) -> None:
    rejected(params({"role": "user", "content": content}), "messages[0].content must be a content block")


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        (
            "Patient Jane Roe, DOB 1970-01-01",
            "content must be a content block or an array of blocks, got <string, 32 characters>",
        ),
        (["Jane Roe"], "content[0] must be a content block object, got <string, 8 characters>"),
        ({"type": "Jane Roe"}, "unknown content type <string, 8 characters>"),
        ({"text": "Jane"}, "unknown content type null"),
        (42, "got 42"),
        (True, "got true"),
    ],
)
def test_a_bad_value_is_described_not_quoted(content: Any, shown: str) -> None:
    """The message reaches the server, the logs, the span status and the audit log, and a misplaced
    string is often the prompt itself: strings are described by their length, never quoted."""
    error = rejected(params({"role": "user", "content": content}), shown)
    assert "Jane" not in error.message


def test_unknown_block_type_names_the_block() -> None:
    rejected(
        params(user(text()), assistant(text(), {"type": "thinking", "thinking": "hmm"})),
        'messages[1].content[1]: unknown content type "thinking"',
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("get_weather", '"get_weather"'),
        ("toolu_01A:b/c@d.e-f", '"toolu_01A:b/c@d.e-f"'),
        ("call the weather tool for Jane", "<string, 30 characters>"),
        ("x" * 65, "<string, 65 characters>"),
    ],
)
def test_a_name_is_quoted_only_when_it_is_shaped_like_one(value: str, shown: str) -> None:
    """Tool names and ids tell the server's author which one is wrong; a string with a name's
    shape is quoted, anything else (prose, which may be the prompt) is described as any value."""
    tools = [{"name": value, "inputSchema": {"type": "object"}}] * 2
    rejected({**params(user(text())), "tools": tools}, f"tools[1].name {shown} duplicates tools[0].name")


def test_unknown_single_block_type_uses_single_object_path() -> None:
    rejected(
        params({"role": "user", "content": {"type": "video"}}), "messages[0].content: unknown content type"
    )


def test_block_not_an_object() -> None:
    rejected(params({"role": "user", "content": ["hi"]}), "messages[0].content[0] must be a content block")


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"type": "text"}, "text content needs a string 'text'"),
        ({"type": "text", "text": 5}, "text content needs a string 'text'"),
        ({"type": "image", "mimeType": "image/png"}, "image content needs a string 'data'"),
        ({"type": "image", "data": "AAAA"}, "image content needs a string 'mimeType'"),
        ({"type": "audio", "data": "AAAA"}, "audio content needs a string 'mimeType'"),
    ],
)
def test_media_blocks_need_their_fields(block: dict[str, Any], fragment: str) -> None:
    rejected(params(user(text(), block)), "messages[0].content[1]: " + fragment)


def test_errors_carry_the_path_as_data() -> None:
    error = rejected(params(user(text(), {"type": "nope"})), "unknown content type")
    assert error.data == {"path": "messages[0].content[1]"}


# --- maxTokens ----------------------------------------------------------------------------------


def test_max_tokens_missing() -> None:
    rejected({"messages": [user(text())]}, "maxTokens is required")


@pytest.mark.parametrize("value", ["100", 1.5, float("inf"), float("nan"), None, True, False, [1]])
def test_max_tokens_not_an_integer(value: Any) -> None:
    rejected({"messages": [user(text())], "maxTokens": value}, "maxTokens must be an integer")


@pytest.mark.parametrize("value", [100.0, 1e3])
def test_max_tokens_written_with_a_fraction_or_exponent_is_an_integer(value: float) -> None:
    """The spec's schema types `maxTokens` as `"integer"`, which JSON Schema matches for any number
    without a fractional part (`100.0`, `1e3`); the MCP SDK reads it so: a server writing its
    integers as floats (Python's `json.dumps(100.0)`) was refused with -32602."""
    request = {"messages": [user(text())], "maxTokens": value}
    parse_server_request("sampling/createMessage", "2025-11-25", request)
    validate_params(request)


@pytest.mark.parametrize(
    ("written", "integer"),
    [("100.00000000000000000001", False), ("1.0000000000000000000e2", True), ("1e400", False)],
)
def test_max_tokens_is_judged_by_its_digits_not_the_nearest_double(written: str, integer: bool) -> None:
    messages = '[{"role": "user", "content": {"type": "text", "text": "hi"}}]'
    request = decode(f'{{"messages": {messages}, "maxTokens": {written}}}'.encode())
    if integer:
        validate_params(request)
    else:
        rejected(request, "maxTokens must be an integer")


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_below_one(value: int) -> None:
    rejected({"messages": [user(text())], "maxTokens": value}, "maxTokens must be at least 1", str(value))


def test_other_scalars() -> None:
    rejected(params(user(text()), systemPrompt=["x"]), "systemPrompt must be a string")
    rejected(params(user(text()), stopSequences="END"), "stopSequences must be an array of strings")
    rejected(params(user(text()), stopSequences=["END", 3]), "stopSequences must be an array of strings")


# --- tool protocol --------------------------------------------------------------------------------


def test_tool_results_mixed_with_other_content() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), user(tool_result("a"), text("and also"))),
        "messages[2]: Tool results mixed with other content",
    )


def test_tool_use_answered_by_plain_user_message() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), user(text("never mind"))),
        'messages[1]: Tool result missing in request: tool_use id(s) "a" must',
        "messages[2] does not answer them all",
    )


def test_tool_use_followed_by_assistant_message() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), assistant(text("well"))),
        "Tool result missing in request",
        "must be a user message",
    )


def test_tool_use_in_last_message() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a"))),
        "messages[1]: Tool result missing in request",
        "it is the last message",
    )


def test_partially_answered_parallel_tool_uses() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a"), tool_use("b")), user(tool_result("a"))),
        'Tool result missing in request: tool_use id(s) "b" must',
    )


def test_tool_result_answered_two_messages_later() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), user(text("wait")), user(tool_result("a"))),
        "Tool result missing in request",
    )


def test_tool_result_for_unknown_id() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), user(tool_result("a"), tool_result("zzz"))),
        'messages[2].content[1]: tool_result toolUseId "zzz" matches no preceding tool_use',
    )


def test_tool_result_without_any_tool_use() -> None:
    rejected(params(user(tool_result("a"))), 'toolUseId "a" matches no preceding tool_use')


def test_tool_result_for_an_already_answered_id() -> None:
    rejected(
        params(
            user(text()),
            assistant(tool_use("a")),
            user(tool_result("a")),
            assistant(text("ok")),
            user(tool_result("a")),
        ),
        'messages[4].content[0]: tool_result toolUseId "a" was answered earlier',
    )


def test_duplicate_tool_result_in_one_message() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a")), user(tool_result("a"), tool_result("a"))),
        'messages[2].content[1]: duplicate tool_result for tool_use id "a"',
    )


def test_duplicate_tool_use_ids_in_one_message() -> None:
    rejected(
        params(user(text()), assistant(tool_use("a"), tool_use("a"))),
        'messages[1].content[1]: duplicate tool_use id "a"',
    )


def test_duplicate_tool_use_ids_across_turns() -> None:
    rejected(
        params(
            user(text()),
            assistant(tool_use("a")),
            user(tool_result("a")),
            assistant(tool_use("a")),
            user(tool_result("a")),
        ),
        'messages[3].content[0]: duplicate tool_use id "a" (already used in messages[1])',
    )


def test_tool_use_in_user_message() -> None:
    rejected(params(user(tool_use("a"))), "messages[0].content[0]: tool_use is only allowed in assistant")


def test_tool_result_in_assistant_message() -> None:
    rejected(
        params(user(text()), assistant(tool_result("a"))),
        "messages[1].content[0]: tool_result is only allowed in user messages",
    )


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"type": "tool_use", "name": "x", "input": {}}, "tool_use.id must be a non-empty string"),
        ({"type": "tool_use", "id": "", "name": "x"}, "tool_use.id must be a non-empty string"),
        ({"type": "tool_use", "id": "a", "name": 3}, "tool_use.name must be a non-empty string"),
        ({"type": "tool_use", "id": "a", "name": "x", "input": [1]}, "tool_use.input must be an object"),
    ],
)
def test_malformed_tool_use(block: dict[str, Any], fragment: str) -> None:
    rejected(params(user(text()), assistant(block)), "messages[1].content[0]: " + fragment)


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"type": "tool_result", "content": []}, "tool_result.toolUseId must be a non-empty string"),
        (
            {"type": "tool_result", "toolUseId": "a", "isError": "yes"},
            "tool_result.isError must be a boolean",
        ),
        (
            {"type": "tool_result", "toolUseId": "a", "content": ["raw"]},
            ".content[0] must be a content block",
        ),
        (
            {"type": "tool_result", "toolUseId": "a", "content": [{"type": "image", "data": "AAAA"}]},
            ".content[0]: image content needs a string 'mimeType'",
        ),
        (
            {"type": "tool_result", "toolUseId": "a", "content": [{"type": "resource_link", "name": "x"}]},
            "resource_link needs a string 'uri'",
        ),
        (
            {
                "type": "tool_result",
                "toolUseId": "a",
                "content": [{"type": "resource", "resource": {"uri": "x"}}],
            },
            "resource needs a 'resource' object",
        ),
    ],
)
def test_malformed_tool_result(block: dict[str, Any], fragment: str) -> None:
    rejected(params(assistant(tool_use("a")), user(block)), fragment)


# --- tools and toolChoice ---------------------------------------------------------------------------


def test_tool_choice_required_without_tools() -> None:
    rejected(params(user(text()), toolChoice={"mode": "required"}), "toolChoice mode 'required' needs")


def test_tool_choice_required_with_empty_tools() -> None:
    rejected(params(user(text()), tools=[], toolChoice={"mode": "required"}), "needs a non-empty tools array")


def test_draft_tool_choice_required_without_tools() -> None:
    rejected(params(user(text()), tool_choice={"mode": "required"}), "'required' needs")


def test_draft_tool_choice_type_any_without_tools() -> None:
    rejected(params(user(text()), tool_choice={"type": "any"}), "'required' needs")


def test_required_with_tools_is_fine() -> None:
    validate_params(params(user(text()), tools=[WEATHER_TOOL], toolChoice={"mode": "required"}))


def test_auto_and_none_without_tools_are_fine() -> None:
    validate_params(params(user(text()), toolChoice={"mode": "auto"}))
    validate_params(params(user(text()), toolChoice={"mode": "none"}))
    validate_params(params(user(text()), toolChoice={}))


@pytest.mark.parametrize("mode", ["any", "always", "tool", 1, True])
def test_unknown_tool_choice_mode(mode: Any) -> None:
    rejected(
        params(user(text()), tools=[WEATHER_TOOL], toolChoice={"mode": mode}),
        "toolChoice.mode must be one of 'auto', 'required', 'none'",
    )


def test_tool_choice_not_an_object() -> None:
    rejected(params(user(text()), toolChoice="auto"), "toolChoice must be an object")


def test_draft_tool_choice_unknown_type() -> None:
    rejected(
        params(user(text()), tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "x"}),
        "tool_choice.type must be one of 'auto', 'any', 'none'",
    )


def test_disable_parallel_must_be_boolean() -> None:
    rejected(
        params(
            user(text()), tools=[WEATHER_TOOL], tool_choice={"mode": "auto", "disable_parallel_tool_use": 1}
        ),
        "tool_choice.disable_parallel_tool_use must be a boolean",
    )


def test_tools_not_an_array() -> None:
    rejected(params(user(text()), tools={"name": "x"}), "tools must be an array")


def test_tool_not_an_object() -> None:
    rejected(params(user(text()), tools=[WEATHER_TOOL, "x"]), "tools[1] must be an object")


@pytest.mark.parametrize("tool", [{}, {"name": ""}, {"name": 7}, {"title": "no name"}])
def test_tool_without_string_name(tool: dict[str, Any]) -> None:
    rejected(params(user(text()), tools=[tool]), "tools[0].name must be a non-empty string")


def test_duplicate_tool_names() -> None:
    rejected(
        params(user(text()), tools=[WEATHER_TOOL, {"name": "x"}, {"name": "get_weather"}]),
        'tools[2].name "get_weather" duplicates tools[0].name',
    )


@pytest.mark.parametrize("schema", ["object", [], 1])
def test_input_schema_not_an_object(schema: Any) -> None:
    rejected(
        params(user(text()), tools=[{"name": "x", "inputSchema": schema}]),
        "tools[0].inputSchema must be an object",
    )


@pytest.mark.parametrize("keyword", ["anyOf", "oneOf", "allOf"])
def test_input_schema_with_a_top_level_combinator(keyword: str) -> None:
    """Claude answers 400 "input_schema does not support oneOf, allOf, or anyOf at the top level"
    (what zod unions produce in MCP servers)."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        keyword: [{"required": ["a"]}, {"required": ["b"]}],
    }
    error = rejected(
        params(user(text()), tools=[WEATHER_TOOL, {"name": "pick", "inputSchema": schema}]),
        f'tools[1].inputSchema (tool "pick") has a top-level {keyword}',
        "inside its properties",
    )
    assert error.data == {"path": "tools[1]"}


@pytest.mark.parametrize(
    ("kind", "shown"),
    [("string", '"string"'), ("array", '"array"'), (["object", "null"], "<array, 2 items>"), (None, "null")],
)
def test_input_schema_of_a_type_other_than_object(kind: Any, shown: str) -> None:
    error = rejected(
        params(user(text()), tools=[{"name": "pick", "inputSchema": {"type": kind}}]),
        f'tools[0].inputSchema.type (tool "pick") must be "object", got {shown}',
    )
    assert error.data == {"path": "tools[0]"}


@pytest.mark.parametrize("schema", [{}, {"type": "object"}, {"properties": {"anyOf": {"type": "string"}}}])
def test_object_input_schemas_are_accepted(schema: dict[str, Any]) -> None:
    validate_params(params(user(text()), tools=[{"name": "x", "inputSchema": schema}]))


# --- audio ------------------------------------------------------------------------------------------


def test_audio_rejected_names_the_option() -> None:
    audio = {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}
    error = rejected(params(user(text(), audio)), "messages[0].content[1]", "audio", "--audio placeholder")
    assert error.data == {"path": "messages[0].content[1]"}


def test_audio_in_single_object_content_is_rejected() -> None:
    rejected(
        params({"role": "assistant", "content": {"type": "audio", "data": "AAAA", "mimeType": "audio/mp3"}}),
        "messages[0].content: audio",
    )


# --- helpers --------------------------------------------------------------------------------------


def test_read_tool_choice_shapes() -> None:
    assert read_tool_choice({}) is None
    assert read_tool_choice({"toolChoice": None}) is None
    assert read_tool_choice({"toolChoice": {}}) == ToolChoice("auto")
    assert read_tool_choice({"toolChoice": {"mode": "none"}}) == ToolChoice("none")
    assert read_tool_choice(
        {"tool_choice": {"mode": "required", "disable_parallel_tool_use": True}}
    ) == ToolChoice("required", True)
    assert read_tool_choice({"toolChoice": {"mode": "auto", "disableParallelToolUse": True}}) == ToolChoice(
        "auto", True
    )
    assert read_tool_choice({"tool_choice": {"type": "any"}}) == ToolChoice("required")
    assert read_tool_choice({"tool_choice": {"type": "none"}}) == ToolChoice("none")
    # The released spelling wins when both are present.
    assert read_tool_choice(
        {"toolChoice": {"mode": "none"}, "tool_choice": {"mode": "required"}}
    ) == ToolChoice("none")


def test_block_helpers() -> None:
    assert as_block_list({"type": "text"}) == [{"type": "text"}]
    assert as_block_list([]) == []
    assert block_path(2, 0, single=True) == "messages[2].content"
    assert block_path(2, 3, single=False) == "messages[2].content[3]"
