"""MCPServer (stdio) whose tools sample through the era-agnostic `Resolve`/`Sample` API.

Run it as `python tests/servers/resolve_server.py` (stdio) or with `--http 127.0.0.1:0` (streamable
HTTP, see tests/servers/http_serving.py). On a 2026-07-28 connection the SDK turns each
`Sample` into an `input_required` round and seals `requestState` (AES-GCM, bound to the tool and
its arguments), so a retry whose state or arguments differ by one byte fails; on a handshake-era
connection the same code sends `sampling/createMessage` requests. Tools return one JSON text block.

* `weather(city)`: a two-round sampling-with-tools loop. Round 1 offers `get_weather(city)`; if the
  model calls it, round 2 sends the `tool_use` and its `tool_result` back. Returns `{"first":
  {"stopReason", "toolUseIds"}, "final": {"stopReason", "text", "model"}, "rounds": 1 | 2}`.
* `summarize(text)`: sampling without tools. Returns `{"text", "model", "contentType"}`.
* `summarize_with_progress(text)`: as `summarize`, reporting progress 1 and 2 of 2 (under the
  request's progress token, if any) once it has the summary. Returns `{"text"}`.
* `summarize_counting(text)`: as `summarize`, its resolver reporting progress 1 of 3 "started"
  each time it runs (on every round: the SDK runs a resolver again on each), the tool 2 of 3
  "sampled" once it has the summary. Returns `{"text"}`.
* `echo(text)`: no sampling. Returns `{"text"}`.
* `confirm_and_ask(question)`: an elicitation (`ok: bool`) and a sampling-with-tools request in
  one round. Returns `{"ok", "text"}`.

`RESOLVE_STATE_KEY` in the environment seals `requestState` under that key instead of one made at
start, as a server deployed on several instances does: a state survives the server's restart.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp.server.request_state import RequestStateSecurity
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
from pydantic import BaseModel

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

GET_WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SYSTEM = "You are a weather assistant. Use get_weather."

_STATE_KEY = os.environ.get("RESOLVE_STATE_KEY")
server = MCPServer(
    "resolve-test-server",
    request_state_security=RequestStateSecurity(keys=[_STATE_KEY]) if _STATE_KEY else None,
)


def _blocks(result: CreateMessageResultWithTools) -> list[Any]:
    return result.content if isinstance(result.content, list) else [result.content]


def _text(result: CreateMessageResult | CreateMessageResultWithTools) -> str:
    blocks = result.content if isinstance(result.content, list) else [result.content]
    return "".join(block.text for block in blocks if isinstance(block, TextContent))


def _question(city: str) -> SamplingMessage:
    return SamplingMessage(role="user", content=TextContent(text=f"What is the weather in {city}?"))


async def first_turn(city: str) -> Sample:
    return Sample(
        [_question(city)],
        max_tokens=300,
        system_prompt=SYSTEM,
        tools=[GET_WEATHER],
        tool_choice=ToolChoice(mode="auto"),
    )


async def second_turn(
    city: str, first: Annotated[CreateMessageResultWithTools, Resolve(first_turn)]
) -> Sample | CreateMessageResultWithTools:
    calls = [block for block in _blocks(first) if isinstance(block, ToolUseContent)]
    if not calls:
        return first
    results: list[SamplingMessageContentBlock] = [
        ToolResultContent(
            tool_use_id=call.id,
            content=[TextContent(text=f"Sunny, 21C in {call.input.get('city', city)}")],
            structured_content={"city": call.input.get("city", city), "temp_c": 21},
        )
        for call in calls
    ]
    return Sample(
        [
            _question(city),
            SamplingMessage(role="assistant", content=_blocks(first)),
            SamplingMessage(role="user", content=results),
        ],
        max_tokens=300,
        system_prompt=SYSTEM,
        tools=[GET_WEATHER],
        tool_choice=ToolChoice(mode="auto"),
    )


@server.tool()
async def weather(
    city: str,
    first: Annotated[CreateMessageResultWithTools, Resolve(first_turn)],
    final: Annotated[CreateMessageResultWithTools, Resolve(second_turn)],
) -> str:
    """Two-round sampling-with-tools loop through Resolve/Sample."""
    calls = [block.id for block in _blocks(first) if isinstance(block, ToolUseContent)]
    return json.dumps(
        {
            "first": {"stopReason": first.stop_reason, "toolUseIds": calls},
            "final": {"stopReason": final.stop_reason, "text": _text(final), "model": final.model},
            "rounds": 2 if calls else 1,
        }
    )


@server.tool()
async def echo(text: str) -> str:
    """No sampling: the text back."""
    return json.dumps({"text": text})


async def ask_summary(text: str) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(text=f"Summarize: {text}"))], max_tokens=100
    )


@server.tool()
async def summarize(text: str, summary: Annotated[CreateMessageResult, Resolve(ask_summary)]) -> str:
    """Plain sampling (no tools) through Resolve/Sample."""
    content = summary.content
    return json.dumps(
        {"text": _text(summary), "model": summary.model, "contentType": getattr(content, "type", None)}
    )


@server.tool()
async def summarize_with_progress(
    text: str, summary: Annotated[CreateMessageResult, Resolve(ask_summary)], ctx: Context
) -> str:
    """Plain sampling, then progress reported for the request that brought the answer."""
    await ctx.report_progress(1, 2, "half way")
    await ctx.report_progress(2, 2, "done")
    return json.dumps({"text": _text(summary)})


async def ask_summary_counting(text: str, ctx: Context) -> Sample:
    await ctx.report_progress(1, 3, "started")
    return await ask_summary(text)


@server.tool()
async def summarize_counting(
    text: str, summary: Annotated[CreateMessageResult, Resolve(ask_summary_counting)], ctx: Context
) -> str:
    """Plain sampling, progress reported by the resolver each time it runs and by the tool."""
    await ctx.report_progress(2, 3, "sampled")
    return json.dumps({"text": _text(summary)})


class Confirmation(BaseModel):
    ok: bool


async def ask_confirmation() -> Elicit[Confirmation]:
    return Elicit("Go ahead?", Confirmation)


async def ask_model(question: str) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(text=question))],
        max_tokens=100,
        tools=[GET_WEATHER],
        tool_choice=ToolChoice(mode="none"),
    )


@server.tool()
async def confirm_and_ask(
    question: str,
    confirmation: Annotated[Confirmation, Resolve(ask_confirmation)],
    answer: Annotated[CreateMessageResultWithTools, Resolve(ask_model)],
) -> str:
    """An elicitation and a sampling-with-tools request, batched into one round."""
    return json.dumps({"ok": confirmation.ok, "text": _text(answer)})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.servers.http_serving import serve_http

        serve_http(server, sys.argv[2])
    else:
        server.run()
