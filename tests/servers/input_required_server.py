"""Lowlevel SDK `Server` (stdio) that asks for input the 2026-07-28 way, by returning `InputRequiredResult`.

Run it as `python tests/servers/input_required_server.py`. Its `requestState` is plaintext JSON, and
every state it hands out is remembered: a retry whose state is not byte-for-byte one it issued fails
the call with "requestState was not echoed exactly". Tool results are one JSON text block.

Tools (all need a 2026-07-28 connection):

* `loop(question, rounds=2)`: a sampling-with-tools loop (tool `lookup(key)`), one sampling request
  per round, up to `rounds` rounds; the history travels in `requestState`. Returns `{"rounds":
  [{"stopReason", "model", "toolUseIds", "text"}...], "finalText", "states": <states received>}`.
* `plain(prompt)`: one sampling request without tools. Returns `{"text", "model", "contentType"}`.
* `wait_then_sample(prompt)`: first a state-only round ("retry later"), then a sampling round.
  Returns `{"text", "waited": true}`.
* `endless()`: asks for sampling in every round, forever.
* `mixed(prompt)`: one round with an elicitation (`confirm`) and a sampling-with-tools request
  (`ask`). Returns `{"confirmed", "answerText", "keys"}`.
* `progress(prompt)`: one sampling round; the retry reports progress 1 and 2 of 2 (under the
  request's progress token, if any) before it returns `{"text"}`.
* `progress_each_round(prompt)`: one sampling round; every call (the first and the retry) reports
  progress 1 of 3 "started" first, as a handler run again from the start on each round does; the
  retry then reports 2 of 3 "sampled" and returns `{"text"}`.
* `hold(prompt, marker)`: one sampling round, then the retry blocks until cancelled (writing the
  file `<marker>.started` as it starts waiting); on cancellation it writes the JSON-RPC id of the
  cancelled request to the file `marker`.

The prompt `ask` (`prompts/get`) and the resource `ir://note` (`resources/read`) each need one
sampling round before they answer with the model's text.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    GetPromptRequestParams,
    GetPromptResult,
    InputRequiredResult,
    ListPromptsResult,
    ListResourcesResult,
    ListToolsResult,
    PaginatedRequestParams,
    Prompt,
    PromptMessage,
    ReadResourceRequestParams,
    ReadResourceResult,
    Resource,
    TextContent,
    TextResourceContents,
    Tool,
    ToolChoice,
)

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

LOOKUP = Tool(
    name="lookup",
    description="Look up the value stored under a key.",
    input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)
TOOLS = [
    Tool(name=name, description=name, input_schema={"type": "object", "additionalProperties": True})
    for name in (
        "loop",
        "plain",
        "wait_then_sample",
        "endless",
        "mixed",
        "hold",
        "progress",
        "progress_each_round",
    )
]
issued_states: set[str] = set()


def _state(payload: Any) -> str:
    state = json.dumps(payload, separators=(",", ":"))
    issued_states.add(state)
    return state


def _received_state(
    params: CallToolRequestParams | GetPromptRequestParams | ReadResourceRequestParams,
) -> Any:
    if params.request_state is None:
        return None
    if params.request_state not in issued_states:
        raise ValueError(f"requestState was not echoed exactly: {params.request_state[:80]!r}")
    return json.loads(params.request_state)


def _answers(
    params: CallToolRequestParams | GetPromptRequestParams | ReadResourceRequestParams,
) -> dict[str, Any]:
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        for key, value in (params.input_responses or {}).items()
    }


def _sampling(messages: list[dict[str, Any]], *, tools: bool, max_tokens: int = 200) -> CreateMessageRequest:
    params: dict[str, Any] = {"messages": messages, "maxTokens": max_tokens}
    if tools:
        params["tools"] = [LOOKUP.model_dump(by_alias=True, exclude_none=True)]
        params["toolChoice"] = ToolChoice(mode="auto").model_dump(by_alias=True, exclude_none=True)
    return CreateMessageRequest(params=CreateMessageRequestParams.model_validate(params))


def _text(result: dict[str, Any]) -> str:
    content = result.get("content")
    blocks = content if isinstance(content, list) else [content]
    return "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _reply(payload: Any) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=json.dumps(payload))])


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": {"type": "text", "text": text}}


async def _loop(params: CallToolRequestParams, args: dict[str, Any]) -> CallToolResult | InputRequiredResult:
    state = _received_state(params) or {
        "history": [_user(str(args.get("question", "")))],
        "rounds": [],
        "states": [],
    }
    if params.request_state is not None:
        state["states"].append(params.request_state)
    answer = _answers(params).get("ask")
    if answer is not None:
        content = answer["content"] if isinstance(answer["content"], list) else [answer["content"]]
        calls = [block for block in content if block.get("type") == "tool_use"]
        state["rounds"].append(
            {
                "stopReason": answer.get("stopReason"),
                "model": answer.get("model"),
                "toolUseIds": [call["id"] for call in calls],
                "text": _text(answer),
            }
        )
        if not calls or len(state["rounds"]) >= int(args.get("rounds", 2)):
            return _reply({"rounds": state["rounds"], "finalText": _text(answer), "states": state["states"]})
        state["history"].append({"role": "assistant", "content": content})
        results = [
            {
                "type": "tool_result",
                "toolUseId": call["id"],
                "content": [{"type": "text", "text": f"{call['input'].get('key')} = 42"}],
                "structuredContent": {"key": call["input"].get("key"), "value": 42},
            }
            for call in calls
        ]
        state["history"].append({"role": "user", "content": results})
    return InputRequiredResult(
        input_requests={"ask": _sampling(state["history"], tools=True)}, request_state=_state(state)
    )


async def _hold(
    params: CallToolRequestParams, args: dict[str, Any], request_id: Any
) -> CallToolResult | InputRequiredResult:
    if "ask" not in _answers(params):
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user(str(args.get("prompt", "")))], tools=False)},
            request_state=_state({"held": True}),
        )
    Path(str(args["marker"]) + ".started").write_text(json.dumps(request_id))
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            Path(str(args["marker"])).write_text(json.dumps(request_id))
    raise AssertionError("unreachable")


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult | InputRequiredResult:
    args = params.arguments or {}
    answers = _answers(params)
    if params.name == "loop":
        return await _loop(params, args)
    if params.name == "hold":
        return await _hold(params, args, ctx.request_id)
    if params.name == "progress":
        if "ask" not in answers:
            return InputRequiredResult(
                input_requests={"ask": _sampling([_user(str(args.get("prompt", "")))], tools=False)},
                request_state=_state({"progress": True}),
            )
        _received_state(params)
        await ctx.session.report_progress(1, 2, "half way")
        await ctx.session.report_progress(2, 2, "done")
        return _reply({"text": _text(answers["ask"])})
    if params.name == "progress_each_round":
        # As an SDK server whose handler runs again on each round: it counts from the start again.
        await ctx.session.report_progress(1, 3, "started")
        if "ask" not in answers:
            return InputRequiredResult(
                input_requests={"ask": _sampling([_user(str(args.get("prompt", "")))], tools=False)},
                request_state=_state({"progress_each_round": True}),
            )
        _received_state(params)
        await ctx.session.report_progress(2, 3, "sampled")
        return _reply({"text": _text(answers["ask"])})
    if params.name == "plain":
        if "ask" in answers:
            content = answers["ask"]["content"]
            return _reply(
                {
                    "text": _text(answers["ask"]),
                    "model": answers["ask"]["model"],
                    "contentType": content["type"],
                }
            )
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user(str(args.get("prompt", "")))], tools=False)},
            request_state=_state({"plain": True}),
        )
    if params.name == "wait_then_sample":
        state = _received_state(params)
        if state is None:
            return InputRequiredResult(request_state=_state({"waited": True}))
        if "ask" in answers:
            return _reply({"text": _text(answers["ask"]), "waited": state.get("waited")})
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user(str(args.get("prompt", "")))], tools=False)},
            request_state=_state({"waited": True, "asked": True}),
        )
    if params.name == "endless":
        state = _received_state(params) or {"n": 0}
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user(f"round {state['n']}")], tools=False)},
            request_state=_state({"n": state["n"] + 1}),
        )
    if params.name == "mixed":
        _received_state(params)
        if "ask" in answers and "confirm" in answers:
            return _reply(
                {
                    "confirmed": answers["confirm"].get("content"),
                    "answerText": _text(answers["ask"]),
                    "keys": sorted(answers),
                }
            )
        return InputRequiredResult(
            input_requests={
                "confirm": ElicitRequest(
                    params=ElicitRequestFormParams(
                        message="Proceed?",
                        requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
                    )
                ),
                "ask": _sampling([_user(str(args.get("prompt", "")))], tools=True),
            },
            request_state=_state({"mixed": True}),
        )
    raise ValueError(f"unknown tool {params.name}")


async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
    return ListToolsResult(tools=TOOLS)


async def list_prompts(ctx: Any, params: PaginatedRequestParams | None) -> ListPromptsResult:
    return ListPromptsResult(prompts=[Prompt(name="ask")])


async def get_prompt(ctx: Any, params: GetPromptRequestParams) -> GetPromptResult | InputRequiredResult:
    answer = _answers(params).get("ask")
    if answer is None:
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user("Write a prompt.")], tools=False)},
            request_state=_state({"prompt": True}),
        )
    _received_state(params)
    return GetPromptResult(messages=[PromptMessage(role="user", content=TextContent(text=_text(answer)))])


async def list_resources(ctx: Any, params: PaginatedRequestParams | None) -> ListResourcesResult:
    return ListResourcesResult(resources=[Resource(name="note", uri="ir://note")])


async def read_resource(
    ctx: Any, params: ReadResourceRequestParams
) -> ReadResourceResult | InputRequiredResult:
    answer = _answers(params).get("ask")
    if answer is None:
        return InputRequiredResult(
            input_requests={"ask": _sampling([_user("Write a note.")], tools=False)},
            request_state=_state({"resource": True}),
        )
    _received_state(params)
    return ReadResourceResult(contents=[TextResourceContents(uri=params.uri, text=_text(answer))])


server: Server[Any] = Server(
    "input-required-test-server",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
