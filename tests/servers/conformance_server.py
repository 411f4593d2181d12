"""An MCPServer upstream that implements what the conformance suite's server scenarios call for
(the `test_*` tools, prompts and resources), served over streamable HTTP on loopback.

npm's server-everything has none of them, so against it most scenarios fail vacuously, among them
`tools-call-sampling`. This server makes the suite's scenarios meaningful for the proxy comparison:
`test_sampling` sends a real `sampling/createMessage` on the back-channel of the `tools/call`.
Written from the suite's scenario descriptions (`conformance list --server` and each scenario's
"Server Implementation Requirements").

    python tests/servers/conformance_server.py --port 8123     # http://127.0.0.1:8123/mcp

Not implemented: `server-sse-polling` (pending in the suite: needs `test_reconnection`, which closes
its SSE stream mid-call and resumes from an event store).
"""

import argparse
import asyncio
import base64
import io
import json
import warnings
import wave
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Message, UserMessage
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    AudioContent,
    Completion,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)

# The handshake-era back-channel (sampling, elicitation, logging) is what this server exercises.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

# A 1x1 red PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG).decode()


def tiny_wav() -> str:
    """A 10 ms silent mono WAV, base64."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 80)
    return base64.b64encode(buffer.getvalue()).decode()


server = MCPServer(
    "conformance-upstream",
    instructions="Implements the conformance suite's test_* features.",
    log_level="WARNING",
)
subscriptions: set[str] = set()


# --- tools --------------------------------------------------------------------------------------------


@server.tool(description="Returns one text block.")
def test_simple_text() -> list[TextContent]:
    return [TextContent(text="This is a simple text response for testing.")]


@server.tool(description="Returns one image block (a 1x1 PNG).")
def test_image_content() -> list[ImageContent]:
    return [ImageContent(data=PNG_B64, mime_type="image/png")]


@server.tool(description="Returns one audio block (a short WAV).")
def test_audio_content() -> list[AudioContent]:
    return [AudioContent(data=tiny_wav(), mime_type="audio/wav")]


def embedded(uri: str, text: str, mime_type: str = "text/plain") -> EmbeddedResource:
    return EmbeddedResource(resource=TextResourceContents(uri=uri, mime_type=mime_type, text=text))


@server.tool(description="Returns one embedded text resource.")
def test_embedded_resource() -> list[EmbeddedResource]:
    return [embedded("test://embedded-resource", "This is an embedded resource content.")]


@server.tool(description="Returns text, image and an embedded resource.")
def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
    data = json.dumps({"test": "data", "value": 123})
    return [
        TextContent(text="Multiple content types test:"),
        ImageContent(data=PNG_B64, mime_type="image/png"),
        embedded("test://mixed-content-resource", data, "application/json"),
    ]


@server.tool(description="Sends three info log notifications while it runs.")
async def test_tool_with_logging(ctx: Context) -> str:
    await ctx.info("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.info("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@server.tool(description="Always fails.")
def test_error_handling() -> str:
    raise RuntimeError("This tool intentionally returns an error for testing")


@server.tool(description="Reports progress 0, 50 and 100 of 100.")
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100)
        if step < 100:
            await asyncio.sleep(0.05)
    return "Tool with progress executed successfully"


@server.tool(description="Asks the client's model through sampling/createMessage.")
async def test_sampling(prompt: str, ctx: Context) -> str:
    result = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(text=prompt))],
        max_tokens=100,
        related_request_id=ctx.request_id,
    )
    text = result.content.text if isinstance(result.content, TextContent) else result.content.type
    return f"LLM response: {text}"


async def elicit(ctx: Context, message: str, schema: dict[str, Any]) -> str:
    result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return f"action={result.action}, content={json.dumps(result.content)}"


@server.tool(description="Asks the user for a username and an email through elicitation/create.")
async def test_elicitation(message: str, ctx: Context) -> str:
    schema = {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    return f"User response: {await elicit(ctx, message, schema)}"


@server.tool(description="Elicitation whose fields all have defaults (SEP-1034).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
            "verified": {"type": "boolean", "default": True},
        },
    }
    return f"Elicitation completed: {await elicit(ctx, 'Please confirm your details', schema)}"


@server.tool(description="Elicitation with the five enum schema variants (SEP-1330).")
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    options = ["option1", "option2", "option3"]
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": options},
            "titledSingle": {
                "type": "string",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {"type": "array", "items": {"type": "string", "enum": options}},
            "titledMulti": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ]
                },
            },
        },
    }
    return f"Elicitation completed: {await elicit(ctx, 'Pick some options', schema)}"


@server.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(name: str = "", address: dict[str, str] | None = None) -> str:
    return f"name={name!r} address={address!r}"


# The listing must show the 2020-12 keywords verbatim; the function signature cannot express them.
server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = {  # type: ignore[union-attr]
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


# --- resources ----------------------------------------------------------------------------------------


@server.resource("test://static-text", name="static-text", description="A static text resource.")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource(
    "test://static-binary", name="static-binary", description="A static PNG.", mime_type="image/png"
)
def static_binary() -> bytes:
    return PNG


@server.resource(
    "test://template/{id}/data",
    name="template-data",
    description="Data for an id.",
    mime_type="application/json",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.resource("test://watched-resource", name="watched-resource", description="Subscribable.")
def watched() -> str:
    return "watched"


async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
    subscriptions.add(str(params.uri))
    return EmptyResult()


async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
    subscriptions.discard(str(params.uri))
    return EmptyResult()


async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
    return EmptyResult()  # every log message is sent; the level only has to be accepted


server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
server._lowlevel_server.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)


# --- prompts and completion ---------------------------------------------------------------------------


@server.prompt(description="A prompt without arguments.")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt(description="A prompt with two arguments.")
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt(description="A prompt embedding a resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[Message]:
    return [
        UserMessage(content=embedded(resourceUri, "Embedded resource content for testing.")),
        UserMessage(content="Please process the embedded resource above."),
    ]


@server.prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list[Message]:
    return [
        UserMessage(content=ImageContent(data=PNG_B64, mime_type="image/png")),
        UserMessage(content="Please analyze the image above."),
    ]


@server.completion()  # type: ignore[no-untyped-call]
async def complete(
    ref: PromptReference | ResourceTemplateReference, argument: Any, context: Any
) -> Completion:
    words = ["paris", "park", "party"]
    return Completion(values=[w for w in words if w.startswith(argument.value)], total=3, has_more=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # On 127.0.0.1 the SDK validates Host/Origin (DNS-rebinding protection) by itself.
    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
