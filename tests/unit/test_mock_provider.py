"""The mock provider: deterministic offline answers shaped like Claude messages."""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import anyio
import pytest

from mcp_backfill.errors import SamplingError
from mcp_backfill.protocol import INVALID_PARAMS
from mcp_backfill.providers.mock import MockProvider, mock_message, synthesize_arguments
from mcp_backfill.sampling.provider import Provider

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 2},
            "units": {"type": "string", "enum": ["metric", "imperial"], "default": "imperial"},
            "verbose": {"type": "boolean"},
        },
        "required": ["city", "days"],
    },
}
TIME_TOOL: dict[str, Any] = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "claude-sonnet-5",
        "max_tokens": 500,
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
    }
    base.update(overrides)
    return base


def tool_loop_messages(result_text: str = "Sunny, 21C", *, is_error: bool = False) -> list[dict[str, Any]]:
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": result_text}],
    }
    if is_error:
        result["is_error"] = True
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {"role": "user", "content": [result]},
    ]


def text_of(message: dict[str, Any]) -> str:
    return "".join(block["text"] for block in message["content"] if block["type"] == "text")


# ---- the provider ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_provider_protocol_and_message_shape() -> None:
    provider: Provider = MockProvider()
    assert provider.name == "mock"
    result = await provider.create_message(request())
    await provider.aclose()

    parsed = anthropic.types.Message.model_validate(result)  # the SDK accepts it as a real message
    assert parsed.id.startswith("msg_mock_")
    assert parsed.model == "mock/claude-sonnet-5"
    assert parsed.role == "assistant"
    assert parsed.stop_reason == "end_turn"
    assert parsed.stop_sequence is None
    assert parsed.usage.input_tokens >= 1
    assert parsed.usage.output_tokens >= 1
    assert set(result["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }


@pytest.mark.anyio
async def test_cancelled_caller_does_not_get_an_answer() -> None:
    provider = MockProvider()
    answered = False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await provider.create_message(request())
        answered = True
    assert not answered
    assert scope.cancelled_caught


def test_replies_are_deterministic_and_ids_follow_the_conversation() -> None:
    first = mock_message(request(tools=[WEATHER_TOOL]))
    assert first == mock_message(copy.deepcopy(request(tools=[WEATHER_TOOL])))
    other = mock_message(
        request(tools=[WEATHER_TOOL], messages=[{"role": "user", "content": "And in Rome?"}])
    )
    assert other["id"] != first["id"]
    assert other["content"][1]["id"] != first["content"][1]["id"]


def test_the_request_is_not_modified() -> None:
    original = request(tools=[WEATHER_TOOL], stop_sequences=["zzz"])
    snapshot = copy.deepcopy(original)
    mock_message(original)
    assert original == snapshot


# ---- tool calls -----------------------------------------------------------------------------------


def test_calls_the_first_tool_with_synthesised_arguments() -> None:
    result = mock_message(request(tools=[WEATHER_TOOL, TIME_TOOL]))
    assert result["stop_reason"] == "tool_use"
    text, tool_use = result["content"]
    assert text == {"type": "text", "text": "[mock] Calling get_weather."}
    assert tool_use["type"] == "tool_use"
    assert tool_use["id"].startswith("toolu_mock_")
    assert tool_use["name"] == "get_weather"
    assert tool_use["input"] == {"city": "sample-city", "days": 2, "units": "imperial"}


def test_tool_choice_by_name_picks_that_tool() -> None:
    result = mock_message(
        request(tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "tool", "name": "get_time"})
    )
    assert result["stop_reason"] == "tool_use"
    assert result["content"][-1]["name"] == "get_time"
    assert result["content"][-1]["input"] == {}


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "any"}, None])
def test_auto_and_any_call_the_first_tool(choice: dict[str, Any] | None) -> None:
    extra = {"tool_choice": choice} if choice else {}
    result = mock_message(request(tools=[TIME_TOOL, WEATHER_TOOL], **extra))
    assert result["content"][-1]["name"] == "get_time"


def test_tool_choice_naming_an_unknown_tool_is_invalid_params() -> None:
    with pytest.raises(SamplingError) as caught:
        mock_message(request(tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "nope"}))
    assert caught.value.code == INVALID_PARAMS


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_required_tool_is_called_after_tool_results_too(choice: dict[str, Any]) -> None:
    """Claude always calls a tool when one is required (`toolChoice: required` is `any`); the mock
    answered in text once the conversation ended in tool results."""
    result = mock_message(request(tools=[WEATHER_TOOL], tool_choice=choice, messages=tool_loop_messages()))
    assert result["stop_reason"] == "tool_use"
    assert result["content"][-1]["name"] == "get_weather"


def test_tool_choice_none_answers_in_text() -> None:
    result = mock_message(request(tools=[WEATHER_TOOL], tool_choice={"type": "none"}))
    assert result["stop_reason"] == "end_turn"
    assert [block["type"] for block in result["content"]] == ["text"]


# ---- text answers ---------------------------------------------------------------------------------


def test_without_tools_it_summarises_the_request() -> None:
    result = mock_message(request())
    assert result["stop_reason"] == "end_turn"
    assert text_of(result) == "[mock] 1 message; last request: What's the weather in Paris?"


def test_after_tool_results_it_reports_them() -> None:
    result = mock_message(request(tools=[WEATHER_TOOL], messages=tool_loop_messages()))
    assert result["stop_reason"] == "end_turn"
    text = text_of(result)
    assert text.startswith("[mock] 3 messages; tool results: get_weather → Sunny, 21C")
    assert text.endswith("last request: What's the weather in Paris?")


def test_error_results_and_string_content_are_reported() -> None:
    messages = tool_loop_messages("city not found", is_error=True)
    result = mock_message(request(tools=[WEATHER_TOOL], messages=messages))
    assert "get_weather (error) → city not found" in text_of(result)

    messages = tool_loop_messages()
    messages[-1]["content"][0]["content"] = "plain string result"
    assert "get_weather → plain string result" in text_of(
        mock_message(request(tools=[WEATHER_TOOL], messages=messages))
    )


def test_long_tool_results_are_shortened() -> None:
    result = mock_message(
        request(tools=[WEATHER_TOOL], messages=tool_loop_messages("x" * 5000), max_tokens=10_000)
    )
    assert "…" in text_of(result)
    assert len(text_of(result)) < 1000


def test_a_later_user_text_after_results_means_another_tool_call() -> None:
    messages = tool_loop_messages()
    messages[-1]["content"].append({"type": "text", "text": "Now the time please"})
    result = mock_message(request(tools=[WEATHER_TOOL], messages=messages))
    assert result["stop_reason"] == "tool_use"


# ---- limits -----------------------------------------------------------------------------------------


def test_max_tokens_truncates_the_text() -> None:
    result = mock_message(request(max_tokens=5))
    assert result["stop_reason"] == "max_tokens"
    assert text_of(result) == "[mock] 1 message; last request: What's the weather in Paris?"[:20]


def test_max_tokens_too_small_for_the_tool_call() -> None:
    result = mock_message(request(tools=[WEATHER_TOOL], max_tokens=10))
    assert result["stop_reason"] == "max_tokens"
    assert [block["type"] for block in result["content"]] == ["text"]


def test_max_tokens_zero_gives_no_content() -> None:
    result = mock_message(request(max_tokens=0))
    assert result["content"] == []
    assert result["stop_reason"] == "max_tokens"


def test_stop_sequences_cut_at_the_earliest_match() -> None:
    result = mock_message(request(stop_sequences=["Paris", "last", "absent"]))
    assert result["stop_reason"] == "stop_sequence"
    assert result["stop_sequence"] == "last"
    assert text_of(result) == "[mock] 1 message; "


def test_stop_sequence_in_the_preface_prevents_the_tool_call() -> None:
    result = mock_message(request(tools=[WEATHER_TOOL], stop_sequences=["Calling"]))
    assert result["stop_reason"] == "stop_sequence"
    assert result["content"] == [{"type": "text", "text": "[mock] "}]


@pytest.mark.parametrize(
    "bad",
    [
        {"messages": []},
        {"messages": "hello"},
        {"messages": ["hello"]},
        {"max_tokens": -1},
        {"max_tokens": "100"},
        {"max_tokens": True},
    ],
)
def test_malformed_requests_are_invalid_params(bad: dict[str, Any]) -> None:
    with pytest.raises(SamplingError) as caught:
        mock_message(request(**bad))
    assert caught.value.code == INVALID_PARAMS


# ---- argument synthesis ----------------------------------------------------------------------------


def obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or list(properties), **extra}


@pytest.mark.parametrize(
    ("prop", "expected"),
    [
        ({"type": "string"}, "sample-v"),
        ({"type": "string", "default": "d", "examples": ["e"], "enum": ["d", "x"]}, "d"),
        ({"type": "string", "examples": ["e1", "e2"], "enum": ["x"]}, "e1"),
        ({"type": "string", "enum": ["first", "second"], "const": "c"}, "first"),
        ({"const": "fixed"}, "fixed"),
        ({"type": "string", "format": "date"}, "2025-01-01"),
        ({"type": "string", "format": "email"}, "sample@example.com"),
        ({"type": "string", "format": "uri"}, "https://example.com/sample"),
        ({"type": "string", "minLength": 12}, "sample-vxxxx"),
        ({"type": "string", "maxLength": 3}, "sam"),
        ({"type": "integer"}, 1),
        ({"type": "integer", "minimum": 5}, 5),
        ({"type": "integer", "exclusiveMinimum": 5}, 6),
        ({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, 6),
        ({"type": "integer", "maximum": 0}, 0),
        ({"type": "integer", "minimum": 0, "exclusiveMaximum": 1}, 0),
        ({"type": "number", "minimum": 0.5}, 1),
        ({"type": "number", "minimum": 2.5}, 2.5),
        ({"type": "number", "maximum": 0.25}, 0.25),
        ({"type": "integer", "minimum": 1.5}, 2),
        ({"type": "integer", "exclusiveMaximum": -3}, -4),
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.5),
        ({"type": "boolean"}, True),
        ({"type": "null"}, None),
        ({"type": ["null", "integer"]}, 1),
        ({"type": "array", "items": {"type": "string"}}, []),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 2]),
        ({"type": "array", "items": {"type": "string"}, "minItems": 2}, ["sample-v", "sample-v-2"]),
        ({"type": "array", "prefixItems": [{"type": "boolean"}], "minItems": 1}, [True]),
        ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 1),
        ({"oneOf": [{"type": "boolean"}, {"type": "string"}]}, True),
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 3),
        ({}, "sample-v"),
        ({"minimum": 4}, 4),
    ],
)
def test_property_values(prop: dict[str, Any], expected: Any) -> None:
    assert synthesize_arguments(obj({"v": prop})) == {"v": expected}


def test_only_required_and_defaulted_properties_are_filled() -> None:
    schema = obj(
        {
            "needed": {"type": "string"},
            "skipped": {"type": "string"},
            "defaulted": {"type": "integer", "default": 7},
        },
        required=["needed"],
    )
    assert synthesize_arguments(schema) == {"needed": "sample-needed", "defaulted": 7}


def test_names_become_readable_placeholders() -> None:
    schema = obj({"cityName": {"type": "string"}, "zip_code": {"type": "string"}, "__": {"type": "string"}})
    assert synthesize_arguments(schema) == {
        "cityName": "sample-city-name",
        "zip_code": "sample-zip-code",
        "__": "sample-value",
    }


def test_nested_objects_and_refs_as_pydantic_emits_them() -> None:
    schema = {
        "$defs": {
            "Location": obj({"city": {"type": "string"}, "lat": {"type": "number", "minimum": -90}}),
            "Unit": {"type": "string", "enum": ["c", "f"]},
        },
        "type": "object",
        "properties": {
            "where": {"$ref": "#/$defs/Location"},
            "unit": {"anyOf": [{"$ref": "#/$defs/Unit"}, {"type": "null"}], "default": None},
            "maybe": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Location"}]},
            "legacy": {"$ref": "#/definitions/Missing"},
        },
        "required": ["where", "maybe", "legacy"],
    }
    assert synthesize_arguments(schema) == {
        "where": {"city": "sample-city", "lat": 1},
        "unit": None,
        "maybe": {"city": "sample-city", "lat": 1},
        "legacy": "sample-legacy",
    }


def test_recursive_schemas_terminate() -> None:
    schema = {
        "$defs": {"Node": obj({"name": {"type": "string"}, "child": {"$ref": "#/$defs/Node"}})},
        "$ref": "#/$defs/Node",
    }
    result = synthesize_arguments(schema)
    assert result["name"] == "sample-name"
    depth = 0
    node: Any = result
    while isinstance(node, dict) and "child" in node:
        node, depth = node["child"], depth + 1
    assert 1 < depth < 20


@pytest.mark.parametrize(
    "schema", [{}, {"type": "object"}, {"type": "string"}, {"type": "object", "properties": []}]
)
def test_degenerate_schemas_give_empty_arguments(schema: dict[str, Any]) -> None:
    assert synthesize_arguments(schema) == {}


def test_defaults_are_copied_not_shared() -> None:
    schema = obj({"tags": {"type": "array", "default": ["a"]}})
    first = synthesize_arguments(schema)
    first["tags"].append("b")
    assert synthesize_arguments(schema) == {"tags": ["a"]}
