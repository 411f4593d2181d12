"""An MCP server whose tools ask the *client's* model for help: sampling with tools.

`weather_assistant` runs a small agent loop through `sampling/createMessage`: it offers the model
a `get_weather` tool, runs every tool call the model makes against a local (fake, deterministic)
forecast table, sends the results back, and repeats until the model writes a final answer.
`summarize` is plain sampling without tools. Both use the handshake-era back-channel
(`ctx.session.create_message`). `packing_advice` does the same kind of tool loop (two rounds) with the
era-agnostic `Resolve`/`Sample` API, so it also works for clients on the stateless 2026-07-28
revision, where sampling travels inside `input_required` results.

Most MCP clients do not implement sampling. Put mcp-backfill in front of this server and the
proxy answers the sampling requests itself (with Claude, or offline with `--provider mock`):

    mcp-backfill --provider mock -- python examples/weather_server.py
    python examples/demo_client.py -- mcp-backfill --provider mock -- python examples/weather_server.py

The server speaks MCP over stdio and never writes anything but JSON-RPC to stdout.
"""

import json
import warnings
import zlib
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Resolve, Sample
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    CreateMessageResult,
    CreateMessageResultWithTools,
    SamplingMessage,
    SamplingMessageContentBlock,
    TextContent,
    Tool,
    ToolChoice,
    ToolResultContent,
    ToolUseContent,
)

# `ctx.session.create_message` is the handshake-era sampling API (protocol 2024-11-05 … 2025-11-25).
# The SDK marks it deprecated because the 2026-07-28 revision replaces server-to-client requests,
# and warns on every call. Using it is the whole point of this example, so silence that warning.
warnings.filterwarnings(
    "ignore", message="The sampling capability is deprecated", category=MCPDeprecationWarning
)

MAX_ROUNDS = 5
"""Sampling round trips allowed per question; the last one forbids tools to force an answer."""

SYSTEM_PROMPT = (
    "You are a concise weather assistant. Use the get_weather tool for every city the user asks "
    "about, then answer in two or three sentences."
)

GET_WEATHER = Tool(
    name="get_weather",
    description="Get tomorrow's forecast for a city: sky, temperature in °C and chance of rain.",
    input_schema={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name, e.g. 'Paris'"}},
        "required": ["city"],
    },
)

FORECASTS: dict[str, dict[str, Any]] = {
    "paris": {"sky": "light rain", "temp_c": 14, "rain_chance": 80},
    "oslo": {"sky": "clear", "temp_c": 6, "rain_chance": 5},
    "london": {"sky": "overcast", "temp_c": 12, "rain_chance": 40},
    "tokyo": {"sky": "sunny", "temp_c": 22, "rain_chance": 10},
    "new york": {"sky": "thunderstorms", "temp_c": 18, "rain_chance": 90},
    "san francisco": {"sky": "fog, clearing later", "temp_c": 16, "rain_chance": 15},
}
SKIES = ["sunny", "partly cloudy", "overcast", "light rain", "showers", "clear"]

server = MCPServer("weather-example", instructions="Weather questions answered with the client's model.")


def get_weather(city: str) -> dict[str, Any]:
    """The local implementation of the `get_weather` tool offered to the model."""
    known = FORECASTS.get(city.strip().lower())
    if known is not None:
        return {"city": city, **known}
    # Unknown cities get a made-up forecast derived from the name, so runs are reproducible.
    seed = zlib.crc32(city.strip().lower().encode())
    return {"city": city, "sky": SKIES[seed % len(SKIES)], "temp_c": seed % 30, "rain_chance": seed % 101}


def run_tool_call(call: ToolUseContent) -> ToolResultContent:
    """Execute one tool call requested by the model and wrap the outcome for the next turn."""
    city = call.input.get("city")
    if call.name != GET_WEATHER.name or not isinstance(city, str):
        problem = f"Cannot run {call.name!r} with input {json.dumps(call.input)}; expected get_weather(city)."
        return ToolResultContent(tool_use_id=call.id, content=[TextContent(text=problem)], is_error=True)
    forecast = get_weather(city)
    text = (
        f"{forecast['city']}: {forecast['sky']}, {forecast['temp_c']}°C, "
        f"{forecast['rain_chance']}% chance of rain"
    )
    return ToolResultContent(
        tool_use_id=call.id,
        content=[TextContent(text=text)],
        structured_content=forecast,
        is_error=False,
    )


def text_of(blocks: list[SamplingMessageContentBlock]) -> str:
    return "\n".join(block.text for block in blocks if isinstance(block, TextContent)).strip()


@server.tool()
async def weather_assistant(question: str, ctx: Context) -> str:
    """Answer a weather question; the client's model looks up forecasts with a get_weather tool."""
    messages = [SamplingMessage(role="user", content=TextContent(text=question))]
    tools_called: list[str] = []
    answer = ""
    rounds = 0
    while rounds < MAX_ROUNDS:
        rounds += 1
        last_round = rounds == MAX_ROUNDS
        result: CreateMessageResultWithTools = await ctx.session.create_message(
            messages,
            max_tokens=1000,
            system_prompt=SYSTEM_PROMPT,
            tools=[GET_WEATHER],
            # "auto" lets the model choose; on the last round "none" asks for a final answer.
            tool_choice=ToolChoice(mode="none" if last_round else "auto"),
            related_request_id=ctx.request_id,
        )
        blocks = result.content_as_list
        calls = [block for block in blocks if isinstance(block, ToolUseContent)]
        if not calls:
            answer = text_of(blocks)
            break
        # Keep the model's turn (text + tool_use blocks) and answer every call in one user turn.
        messages.append(SamplingMessage(role="assistant", content=blocks))
        results: list[SamplingMessageContentBlock] = [run_tool_call(call) for call in calls]
        messages.append(SamplingMessage(role="user", content=results))
        tools_called += [f"{call.name}({json.dumps(call.input, ensure_ascii=False)})" for call in calls]
    if not answer:
        answer = f"(no final answer after {rounds} rounds)"
    trace = f"[{rounds} sampling round(s); tools called: {', '.join(tools_called) or 'none'}]"
    return f"{answer}\n\n{trace}"


@server.tool()
async def summarize(text: str, ctx: Context) -> str:
    """Summarize a text in one sentence with the client's model (plain sampling, no tools)."""
    result: CreateMessageResult = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(text=f"Summarize in one sentence:\n\n{text}"))],
        max_tokens=200,
        related_request_id=ctx.request_id,
    )
    if isinstance(result.content, TextContent):
        return result.content.text
    return f"(the model answered with {result.content.type} content)"


PACKING_PROMPT = "You help people pack. Check the forecast with get_weather, then advise in one sentence."


def packing_question(city: str) -> SamplingMessage:
    return SamplingMessage(role="user", content=TextContent(text=f"What should I pack for {city} tomorrow?"))


async def check_forecast(city: str) -> Sample:
    """Round 1: the model may call get_weather."""
    return Sample(
        [packing_question(city)],
        max_tokens=500,
        system_prompt=PACKING_PROMPT,
        tools=[GET_WEATHER],
        tool_choice=ToolChoice(mode="auto"),
    )


async def advise(
    city: str, first: Annotated[CreateMessageResultWithTools, Resolve(check_forecast)]
) -> Sample | CreateMessageResultWithTools:
    """Round 2: the tool results go back and the model answers (no tools this time)."""
    blocks = first.content_as_list
    calls = [block for block in blocks if isinstance(block, ToolUseContent)]
    if not calls:
        return first
    results: list[SamplingMessageContentBlock] = [run_tool_call(call) for call in calls]
    return Sample(
        [
            packing_question(city),
            SamplingMessage(role="assistant", content=blocks),
            SamplingMessage(role="user", content=results),
        ],
        max_tokens=500,
        system_prompt=PACKING_PROMPT,
        tools=[GET_WEATHER],
        tool_choice=ToolChoice(mode="none"),
    )


@server.tool()
async def packing_advice(city: str, advice: Annotated[CreateMessageResultWithTools, Resolve(advise)]) -> str:
    """What to pack for a city; a two-round sampling-with-tools loop that works in both protocol eras."""
    return text_of(advice.content_as_list) or f"(the model answered with {advice.content_as_list[0].type})"


if __name__ == "__main__":
    server.run()  # stdio transport
