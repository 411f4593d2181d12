"""SDK-based (MCPServer) upstream for the proxy's end-to-end tests, over stdio or streamable HTTP.

Run it as `python tests/servers/sampling_server.py` (stdio) or `python tests/servers/sampling_server.py
--http 127.0.0.1:0` (streamable HTTP at /mcp, see tests/servers/http_serving.py). Every tool returns
JSON text (one TextContent) so tests can `json.loads(result.content[0].text)`. All sampling goes
through the handshake-era back-channel (`sampling/createMessage` requests related to the running
`tools/call`).

Tools:

* `loop(question, rounds=2, tool_choice="auto")`: a sampling-with-tools loop offering one tool,
  `lookup(key)`, to the model. `rounds` caps the number of sampling requests. Every `tool_use` is
  answered with a `tool_result` carrying text content, `structuredContent` `{"key", "value",
  "found"}` and `isError` (true for the key `"fail"` or an input without a string `key`).
  Returns `{"rounds": [{"round", "stopReason", "model", "blockTypes", "toolUseIds", "toolCalls",
  "text", "meta"}...], "finalText": str | null, "completed": bool}`.
* `plain(prompt, max_tokens=100)`: sampling without tools. Returns `{"text", "contentType",
  "model", "stopReason", "meta"}`.
* `sample_raw(params_json, timeout=30.0)`: sends `sampling/createMessage` with exactly the given
  params object and returns `{"result": <raw result dict>}` or `{"error": {"code", "message",
  "data"}}`; the result is not validated, so malformed answers can be inspected too.
* `client_request(method, params_json, timeout=30.0)`: sends any request (`tasks/get`...) to the
  client with exactly the given params; returns `{"result": ...}` or `{"error": ...}` like
  `sample_raw` (which is this with `sampling/createMessage`).
* `progress_sample(prompt, max_tokens=100)`: one sampling request sent with a progress callback
  (the SDK puts a `progressToken` in its `_meta`). Returns `{"text", "progress": [[progress,
  total, message]...]}`: every `notifications/progress` the SDK delivered for it, in order.
* `regional(region, city)`: no sampling; `region` carries `x-mcp-header: Region`, so a 2026 HTTP call
  needs an `Mcp-Param-Region` header matching it. Returns `{"region", "city"}`.
* `echo(text)`: no sampling. Returns `{"text"}`.
* `announce(text)`: sends two `notifications/message`: `on-request: <text>` related to this request
  (its POST stream, over HTTP) and `broadcast: <text>` unrelated to any (the GET stream). Returns
  `{"text"}`.
* `wait_forever(label)`: prints `wait_forever <label> started` to stderr and waits until cancelled,
  then prints `wait_forever <label> cancelled`.
* `resumable_plain(prompt)`: like `plain`, but first closes its SSE response stream (HTTP only), so
  the sampling request and the result reach the client only by resuming it with `Last-Event-ID`.
* `slow_sample(cancel_after=1.0, prompt=..., max_tokens=100)`: sends one sampling request (id
  `"slow-sample-<n>"`) and gives up after `cancel_after` seconds; the SDK then sends
  `notifications/cancelled` for it. Returns `{"outcome": "completed" | "timed_out" | "error",
  "samplingRequestId", "cancelAfter", "elapsed", "result" | "error"}`. If the client cancels the
  `tools/call` itself, the SDK cancels the sampling request too (nothing is returned then).
* `stubborn_sample(report, prompt=..., max_tokens=100)`: a tool that ignores its client's cancel:
  shielded from it, it sends a sampling request (id `"stubborn-<n>-1"`), then once that is answered a
  second one (`"stubborn-<n>-2"`), then waits (up to 60 s) for the `notifications/cancelled` of its
  own `tools/call`. Only then it writes `{"first", "second": {"result"} | {"error": {"code",
  "message", "data"}}, "cancelSeen": bool}` as JSON to the file `report` (whole: written aside, then
  renamed), and returns the same JSON.
"""

import itertools
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import (
    REQUEST_TIMEOUT,
    CreateMessageResult,
    CreateMessageResultWithTools,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    SamplingMessage,
    SamplingMessageContentBlock,
    TextContent,
    Tool,
    ToolChoice,
    ToolResultContent,
    ToolUseContent,
)
from pydantic import Field

warnings.filterwarnings(
    "ignore", message="The sampling capability is deprecated", category=MCPDeprecationWarning
)

LOOKUP = Tool(
    name="lookup",
    description="Look up the value stored under a key.",
    input_schema={
        "type": "object",
        "properties": {"key": {"type": "string", "description": "The key to look up"}},
        "required": ["key"],
    },
)
TABLE: dict[str, str] = {"alpha": "1", "beta": "2", "gamma": "3", "capital_of_france": "Paris"}

server = MCPServer("sampling-test-server")
_slow_ids = itertools.count(1)


def lookup(call: ToolUseContent) -> ToolResultContent:
    key = call.input.get("key")
    if call.name != LOOKUP.name or not isinstance(key, str):
        text = f"unsupported call {call.name}({json.dumps(call.input)})"
        return ToolResultContent(tool_use_id=call.id, content=[TextContent(text=text)], is_error=True)
    if key == "fail":
        return ToolResultContent(
            tool_use_id=call.id,
            content=[TextContent(text="lookup failed for key 'fail'")],
            structured_content={"key": key, "value": None, "found": False},
            is_error=True,
        )
    value = TABLE.get(key, f"value-of-{key}")
    return ToolResultContent(
        tool_use_id=call.id,
        content=[TextContent(text=f"{key} = {value}")],
        structured_content={"key": key, "value": value, "found": key in TABLE},
        is_error=False,
    )


def _text(blocks: list[SamplingMessageContentBlock]) -> str:
    return "".join(block.text for block in blocks if isinstance(block, TextContent))


def _error_json(error: MCPError) -> dict[str, Any]:
    return {"code": error.code, "message": error.message, "data": error.data}


async def _send_raw(ctx: Context, method: str, params: dict[str, Any], opts: CallOptions) -> dict[str, Any]:
    """Send a request to the client with verbatim params, related to the running tools/call.

    `ServerSession.send_request` only takes typed requests and validates the result, so this uses
    the request-scoped raw channel the typed path is built on (a private attribute in mcp 2.3).
    """
    session = ctx.request_context.session
    return await session._request_outbound.send_raw_request(method, params, opts)


async def _send_raw_sampling(ctx: Context, params: dict[str, Any], opts: CallOptions) -> dict[str, Any]:
    return await _send_raw(ctx, "sampling/createMessage", params, opts)


@server.tool()
async def loop(
    question: str,
    ctx: Context,
    rounds: int = 2,
    tool_choice: Literal["auto", "required", "none"] = "auto",
) -> str:
    """Sampling-with-tools loop offering a `lookup(key)` tool; `rounds` caps the sampling requests."""
    messages = [SamplingMessage(role="user", content=TextContent(text=question))]
    report: list[dict[str, Any]] = []
    final_text: str | None = None
    for n in range(1, rounds + 1):
        result: CreateMessageResultWithTools = await ctx.session.create_message(
            messages,
            max_tokens=500,
            system_prompt="Answer using the lookup tool when a key is mentioned.",
            tools=[LOOKUP],
            tool_choice=ToolChoice(mode=tool_choice),
            related_request_id=ctx.request_id,
        )
        blocks = result.content_as_list
        calls = [block for block in blocks if isinstance(block, ToolUseContent)]
        report.append(
            {
                "round": n,
                "stopReason": result.stop_reason,
                "model": result.model,
                "blockTypes": [block.type for block in blocks],
                "toolUseIds": [call.id for call in calls],
                "toolCalls": [{"id": c.id, "name": c.name, "input": c.input} for c in calls],
                "text": _text(blocks),
                "meta": result.meta,
            }
        )
        if not calls:
            final_text = _text(blocks)
            break
        messages.append(SamplingMessage(role="assistant", content=blocks))
        messages.append(SamplingMessage(role="user", content=[lookup(call) for call in calls]))
    return json.dumps({"rounds": report, "finalText": final_text, "completed": final_text is not None})


@server.tool()
async def plain(prompt: str, ctx: Context, max_tokens: int = 100) -> str:
    """Plain sampling (no tools): returns the single content block's text, model and stopReason."""
    result: CreateMessageResult = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(text=prompt))],
        max_tokens=max_tokens,
        related_request_id=ctx.request_id,
    )
    content = result.content
    return json.dumps(
        {
            "text": content.text if isinstance(content, TextContent) else None,
            "contentType": content.type,
            "model": result.model,
            "stopReason": result.stop_reason,
            "meta": result.meta,
        }
    )


@server.tool()
async def sample_raw(params_json: str, ctx: Context, timeout: float = 30.0) -> str:
    """Send sampling/createMessage with exactly these params; return the raw result or the error."""
    params = json.loads(params_json)
    if not isinstance(params, dict):
        raise ValueError("params_json must encode a JSON object")
    try:
        result = await _send_raw_sampling(ctx, params, {"timeout": timeout})
    except MCPError as error:
        return json.dumps({"error": _error_json(error)})
    return json.dumps({"result": result})


@server.tool()
async def client_request(method: str, params_json: str, ctx: Context, timeout: float = 30.0) -> str:
    """Send any request to the client with exactly these params; return the raw result or the error."""
    params = json.loads(params_json)
    if not isinstance(params, dict):
        raise ValueError("params_json must encode a JSON object")
    try:
        result = await _send_raw(ctx, method, params, {"timeout": timeout})
    except MCPError as error:
        return json.dumps({"error": _error_json(error)})
    return json.dumps({"result": result})


@server.tool()
async def progress_sample(prompt: str, ctx: Context, max_tokens: int = 100) -> str:
    """Sample with a progress callback; report what progress arrived before the answer."""
    seen: list[list[Any]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append([progress, total, message])

    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": max_tokens,
    }
    result = await _send_raw_sampling(ctx, params, {"timeout": 30.0, "on_progress": on_progress})
    return json.dumps({"text": result.get("content", {}).get("text"), "progress": seen})


@server.tool()
async def slow_sample(
    ctx: Context,
    cancel_after: float = 1.0,
    prompt: str = "Take your time and write a long essay.",
    max_tokens: int = 100,
) -> str:
    """Start a sampling request and abandon it after `cancel_after` seconds (then it is cancelled)."""
    request_id = f"slow-sample-{next(_slow_ids)}"
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": max_tokens,
    }
    outcome: dict[str, Any] = {"samplingRequestId": request_id, "cancelAfter": cancel_after}
    started = time.monotonic()
    try:
        # On timeout the SDK's dispatcher writes notifications/cancelled {"requestId": request_id}
        # before raising REQUEST_TIMEOUT; on cancellation of this tool call it does the same.
        outcome["result"] = await _send_raw_sampling(
            ctx, params, {"timeout": cancel_after, "request_id": request_id}
        )
        outcome["outcome"] = "completed"
    except MCPError as error:
        outcome["outcome"] = "timed_out" if error.code == REQUEST_TIMEOUT else "error"
        outcome["error"] = _error_json(error)
    except anyio.get_cancelled_exc_class():
        print(f"slow_sample: tools/call cancelled, sampling request {request_id} abandoned", file=sys.stderr)
        raise
    outcome["elapsed"] = round(time.monotonic() - started, 3)
    return json.dumps(outcome)


@server.tool()
async def stubborn_sample(
    report: str,
    ctx: Context,
    prompt: str = "Take your time and write a long essay.",
    max_tokens: int = 100,
) -> str:
    """Two sampling requests in turn, shielded from the client's cancel; the outcome goes to `report`."""
    number = next(_slow_ids)
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": max_tokens,
    }
    outcome: dict[str, Any] = {}
    cancel_requested = ctx.request_context.session._request_outbound.cancel_requested
    with anyio.CancelScope(shield=True):  # the client's cancel is ignored (the SDK still notes it)
        for n, name in ((1, "first"), (2, "second")):
            try:
                answer = await _send_raw_sampling(ctx, params, {"request_id": f"stubborn-{number}-{n}"})
                outcome[name] = {"result": answer}
            except MCPError as error:
                outcome[name] = {"error": _error_json(error)}
        with anyio.move_on_after(60):
            await cancel_requested.wait()
        outcome["cancelSeen"] = cancel_requested.is_set()
        text = json.dumps(outcome)
        aside = Path(f"{report}.part")
        aside.write_text(text)
        aside.rename(report)
    return text


@server.tool()
async def regional(
    region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], city: str
) -> str:
    """A tool whose `region` argument must also travel as the `Mcp-Param-Region` header (2026 HTTP)."""
    return json.dumps({"region": region, "city": city})


@server.tool()
async def echo(text: str) -> str:
    """Echo the text back."""
    return json.dumps({"text": text})


@server.tool()
async def announce(text: str, ctx: Context) -> str:
    """One notification on this request's stream, one outside any request."""
    for data, related in ((f"on-request: {text}", ctx.request_id), (f"broadcast: {text}", None)):
        notification = LoggingMessageNotification(
            params=LoggingMessageNotificationParams(level="info", data=data)
        )
        await ctx.session.send_notification(notification, related_request_id=related)
    return json.dumps({"text": text})


@server.tool()
async def wait_forever(label: str) -> str:
    """Wait until cancelled, saying so on stderr (how a test sees a cancellation arrive)."""
    print(f"wait_forever {label} started", file=sys.stderr, flush=True)
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        print(f"wait_forever {label} cancelled", file=sys.stderr, flush=True)
        raise
    return ""


@server.tool()
async def resumable_plain(prompt: str, ctx: Context) -> str:
    """Close this request's SSE stream first: everything else arrives only on a resumed stream."""
    await ctx.close_sse_stream()
    return await plain(prompt, ctx)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.servers.http_serving import serve_http

        serve_http(server, sys.argv[2])
    else:
        server.run()
