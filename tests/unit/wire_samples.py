"""MCP sampling/createMessage wire samples and builders shared by the validate and convert tests.

The constants are shared objects: a test that changes what it is given must pass a `copy.deepcopy`.
"""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

# The 2025-11-25 wire shape, as the mcp SDK writes it.
RELEASED_TOOL_LOOP: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": {"type": "text", "text": "What's the weather in Paris? Use the tool."}},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "name": "get_weather", "id": "toolu_01", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "toolUseId": "toolu_01",
                    "content": [{"type": "text", "text": "Sunny, 21C in Paris"}],
                    "structuredContent": {"temp_c": 21, "sky": "sunny"},
                    "isError": False,
                }
            ],
        },
    ],
    "systemPrompt": "You are a weather bot.",
    "maxTokens": 200,
    "tools": [WEATHER_TOOL],
    "toolChoice": {"mode": "auto"},
}


def text(value: str = "hi") -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(tool_use_id: str, name: str = "get_weather", **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def params(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """sampling/createMessage params: the messages, maxTokens 100, and any other fields."""
    return {"messages": list(messages), "maxTokens": 100, **extra}
