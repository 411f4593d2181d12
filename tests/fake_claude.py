"""A faithful fake of the Claude Messages API, served over real HTTP for tests.

The proxy under test runs as a real subprocess and reaches this fake through `ANTHROPIC_BASE_URL`;
unit tests can also point `anthropic.AsyncAnthropic(base_url=fake.url)` at it. The fake is a
Starlette app served by uvicorn on 127.0.0.1 (random free port) in a background thread, so both
sync and async tests can use it:

    with FakeClaude() as fake:
        fake.enqueue(text_reply("hello"), error_reply(529, "overloaded_error", "Overloaded"))
        ...  # point the client at fake.url
        assert fake.message_requests[0].body["model"] == "claude-sonnet-5"

Wire behaviour (as the Messages API documents it and the anthropic SDK expects it):

* `POST /v1/messages` answers with a full `Message` JSON object, or with server-sent events in the
  real order when the body has `"stream": true` (`message_start`, `ping`, per block
  `content_block_start` / `content_block_delta`... / `content_block_stop`, `message_delta`,
  `message_stop`). Every response carries a `request-id` header.
* Replies come from a queue (`enqueue`); when it is empty a deterministic default reply is built
  from the request (a tool call when tools are offered and the conversation does not end in tool
  results, otherwise a "fake-claude says: ..." text).
* `POST /v1/messages/count_tokens` answers `{"input_tokens": N}`, or the next error queued with
  `enqueue_count_tokens`; any other path is a 404 in the Anthropic error shape. An `error_reply`
  with `echo_headers` quotes the request's headers, as a buggy or hostile gateway might.
* Prompt caching is modelled: the prompt is the sequence tools, system blocks, message blocks; a
  block marked `cache_control` (or the last block, for a top-level `cache_control`) is a breakpoint.
  The fake remembers the prefix up to each breakpoint (a hash of the model and the canonical JSON of
  every block up to it, markers left out) for `cache_ttl` seconds. A request reads the longest
  remembered prefix that ends at one of its breakpoints or up to `CACHE_LOOKBACK_BLOCKS - 1` blocks
  before one (as the real API looks back), and writes the rest up to its last breakpoint. Usage then
  splits the input like the real API: `cache_read_input_tokens` (the prefix read),
  `cache_creation_input_tokens` (from there to the last breakpoint) and `input_tokens` (the rest),
  with a deterministic estimate of JSON characters / 4 per block. The minimum cacheable length is the
  real API's per model (1024 tokens, 2048 for Haiku; `cache_min_tokens` overrides it): shorter
  prefixes are neither written nor read. What the cache did for
  each request is kept in `FakeClaude.cache_usages`. More than 4 breakpoints is a 400.
* `FakeClaude.max_in_flight` is the most `POST /v1/messages` requests ever being answered at once.
* Fault modes for the proxy's retry logic: `garbage_stream_reply` (an event that is not JSON),
  `truncated_stream_reply` (the body ends, or the connection drops, before `message_stop`), and
  `fallback` / `random_faults(seed, weights)` for a reply drawn per request when the queue is empty.
* Cloud platforms, as the SDK's Bedrock and Vertex clients call them when their base-URL variables
  point here: `POST /model/{id}/invoke(-with-response-stream)` (Bedrock: model in the URL,
  `anthropic_version` in the body, the stream framed as AWS event-stream messages) and
  `POST /projects/{p}/locations/{r}/publishers/anthropic/models/{id}:(stream)rawPredict` (Vertex),
  and Vertex's token counting, `POST .../publishers/anthropic/models/count-tokens:rawPredict` (the
  model and `anthropic_version` in the body), answered as `/v1/messages/count_tokens` is.
  They are recorded in `platform_requests`; a `raw_reply` is sent there as scripted.
* Google's OAuth2 token endpoint, `POST /oauth2/token`, for the real google-auth library's Application
  Default Credentials: `FakeClaude.service_account_info()` and `workforce_user_info()` are the JSON
  key files (`GOOGLE_APPLICATION_CREDENTIALS`) whose `token_uri` is the fake. A service account's
  signed JWT (checked against the key the fake issued) or a user's refresh token is exchanged for
  `FakeClaude.oauth_token`; `oauth_outages` drops the connection of the next requests instead.
* A request without `authorization: Bearer <key>` is a 401 `authentication_error` (Bedrock's also
  takes a SigV4 signature, not checked). When `validate`
  is on (the default), requests that the real API rejects (missing fields, `temperature`, empty
  text blocks, unpaired tool_use/tool_result, invalid tool names, an image of another media type
  than JPEG/PNG/GIF/WebP or over 5 MB, more than 100 images, a base64 document that is not a PDF or
  a text document that is not text/plain...) get a 400
  `invalid_request_error`; such requests do not consume a queued reply.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import random
import re
import secrets
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from mcp_backfill.providers.mock import synthesize_arguments

JSONObject = dict[str, Any]

__all__ = [
    "CacheUsage",
    "ErrorReply",
    "FakeClaude",
    "GarbageStreamReply",
    "HangReply",
    "MessageReply",
    "PromptCache",
    "RawReply",
    "RecordedRequest",
    "Reply",
    "ReplyFactory",
    "StreamErrorReply",
    "TruncatedStreamReply",
    "error_reply",
    "garbage_stream_reply",
    "hang_reply",
    "message_reply",
    "raw_reply",
    "sse_event",
    "stream_error_reply",
    "text_reply",
    "tool_use_reply",
    "truncated_stream_reply",
]

# --------------------------------------------------------------------------------------------------
# Recorded requests and reply specs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request the fake received, whatever its path or outcome."""

    method: str
    path: str
    headers: dict[str, str]
    """Request headers, keys lowercased."""
    body: JSONObject
    """The parsed JSON body; `{}` when the body is empty or not a JSON object."""
    raw_body: bytes
    peer: tuple[str, int] | None = None
    """The client's address and port: requests from one port came over one connection."""

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True


@dataclass(frozen=True)
class MessageReply:
    """A successful reply: a full message (JSON) or the equivalent event stream."""

    content: list[JSONObject]
    stop_reason: str | None = "end_turn"
    stop_sequence: str | None = None
    stop_details: JSONObject | None = None
    usage: JSONObject | None = None
    """Merged over the estimated usage (input_tokens, output_tokens, cache_* = 0)."""
    model: str | None = None
    """Reported model; defaults to the requested one."""
    message_id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds to wait before the response starts."""
    event_delay: float = 0.0
    """Seconds to wait between server-sent events (streaming only)."""
    chunks: int = 3
    """How many `text_delta` / `input_json_delta` pieces each block is split into (at most)."""


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error with the Anthropic error body."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    details: JSONObject | None = None
    """`error.details` (e.g. `{"error_code": "..."}`), omitted when None."""
    echo_headers: bool | tuple[str, ...] = False
    """The message ends with every header of the request (by name, so `authorization` comes early),
    or those named (lower case), as a buggy or hostile gateway's error may quote them
    (`Authorization`, `X-Amz-Security-Token`...): what the proxy must redact."""


@dataclass(frozen=True)
class StreamErrorReply:
    """A stream that starts normally and then sends `event: error`.

    A non-streaming request gets the same error as an HTTP status instead (529 for
    `overloaded_error`, 500 for `api_error`...).
    """

    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    partial_text: str = ""
    """Text streamed (in an unterminated text block) before the error."""


@dataclass(frozen=True)
class HangReply:
    """Start answering and then wait until the client disconnects (or the fake shuts down).

    Streaming: sends `message_start`, `ping` and `partial_text` (if any) first. Non-streaming:
    sends nothing. A disconnect is counted in `FakeClaude.disconnects`.
    """

    partial_text: str = ""


@dataclass(frozen=True)
class GarbageStreamReply:
    """A stream that starts normally, then sends an event whose `data:` is not JSON, then ends.

    A non-streaming request gets a 200 whose body is `garbage` (not JSON either).
    """

    partial_text: str = "Partial"
    garbage: str = "{this is not json"


@dataclass(frozen=True)
class TruncatedStreamReply:
    """A stream that stops after `partial_text`, before `message_stop`.

    `abrupt=False`: the HTTP body ends cleanly; `abrupt=True`: the connection is dropped mid-body.
    """

    partial_text: str = "Partial"
    abrupt: bool = False


@dataclass(frozen=True)
class RawReply:
    """Whatever bytes a test scripts: `parts` sent one by one as the body of a `status` response
    with `headers` (`content-type` defaults to server-sent events). For streams no real API sends:
    events out of order, an error in a 200's JSON body, a wrong content type... `abort` drops the
    connection after the parts instead of ending the body; `hang` waits after them, the body not
    ended, until the client disconnects; `part_delay` seconds pass between two parts."""

    parts: tuple[bytes, ...]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    abort: bool = False
    hang: bool = False
    part_delay: float = 0.0


def raw_reply(
    *parts: bytes | str,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    abort: bool = False,
    hang: bool = False,
    part_delay: float = 0.0,
) -> RawReply:
    encoded = tuple(part.encode() if isinstance(part, str) else part for part in parts)
    return RawReply(encoded, status, dict(headers or {}), abort, hang, part_delay)


def sse_event(event: str, data: JSONObject | str) -> bytes:
    """One server-sent event (`data` a JSON object, or any text as it is)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return f"event: {event}\ndata: {text}\n\n".encode()


FaultReply = GarbageStreamReply | TruncatedStreamReply
Reply = MessageReply | ErrorReply | StreamErrorReply | HangReply | FaultReply | RawReply
ReplyFactory = Callable[[RecordedRequest], Reply]
"""A queued callable is called with the request and returns the reply to send."""


def message_reply(
    content: list[JSONObject], stop_reason: str | None = "end_turn", **kwargs: Any
) -> MessageReply:
    return MessageReply(content=content, stop_reason=stop_reason, **kwargs)


def text_reply(text: str, *, stop_reason: str = "end_turn", **kwargs: Any) -> MessageReply:
    """A single text block (`**kwargs` go to `MessageReply`, e.g. `stop_sequence`, `usage`)."""
    return MessageReply(content=[{"type": "text", "text": text}], stop_reason=stop_reason, **kwargs)


def tool_use_reply(
    name: str,
    input: JSONObject,
    *,
    id: str | None = None,
    text: str | None = None,
    **kwargs: Any,
) -> MessageReply:
    """A tool call (optionally preceded by a text block); stop_reason "tool_use".

    Without `id` the fake assigns `toolu_fake_<n>` when it serves the reply.
    """
    content: list[JSONObject] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    content.append({"type": "tool_use", "id": id, "name": name, "input": input})
    kwargs.setdefault("stop_reason", "tool_use")
    return MessageReply(content=content, **kwargs)


def error_reply(
    status: int,
    error_type: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    retry_after: float | None = None,
    should_retry: bool | None = None,
    details: JSONObject | None = None,
    echo_headers: bool | tuple[str, ...] = False,
) -> ErrorReply:
    """An HTTP error, e.g. `error_reply(529, "overloaded_error", "Overloaded", retry_after=0)`;
    `echo_headers` quotes the request's headers in the message (`ErrorReply.echo_headers`)."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["retry-after"] = f"{retry_after:g}"
    if should_retry is not None:
        all_headers["x-should-retry"] = "true" if should_retry else "false"
    return ErrorReply(status, error_type, message, all_headers, details, echo_headers)


def stream_error_reply(
    error_type: str = "overloaded_error", message: str = "Overloaded", *, partial_text: str = "Partial"
) -> StreamErrorReply:
    return StreamErrorReply(error_type, message, partial_text)


def hang_reply(partial_text: str = "") -> HangReply:
    return HangReply(partial_text)


def garbage_stream_reply(partial_text: str = "Partial") -> GarbageStreamReply:
    return GarbageStreamReply(partial_text)


def truncated_stream_reply(partial_text: str = "Partial", *, abrupt: bool = False) -> TruncatedStreamReply:
    return TruncatedStreamReply(partial_text, abrupt)


# --------------------------------------------------------------------------------------------------
# Request validation (a subset of the real API's rules)
# --------------------------------------------------------------------------------------------------

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_ROLES = ("user", "assistant", "system")
_TOOL_CHOICES = ("auto", "any", "tool", "none")
_EMPTY_MESSAGE = "all messages must have non-empty content except for the optional final assistant message"


def _validate_text(text: object, where: str) -> str | None:
    if not isinstance(text, str):
        return f"{where}.text: Input should be a valid string"
    if not text.strip():
        return f"{where}: text content blocks must contain non-whitespace text"
    return None


# The Messages API's limits on images and documents (as documented for vision and PDF support).
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGES = 100
DOCUMENT_SOURCES = {"base64": ("application/pdf",), "text": ("text/plain",)}


def _validate_media(block: dict[str, Any], here: str) -> str | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return f"{here}.source: Field required"
    kind, media_type = source.get("type"), source.get("media_type")
    if block["type"] == "image":
        if kind != "base64":
            return None  # url / file sources are not modelled
        if media_type not in IMAGE_MEDIA_TYPES:
            return f"{here}.source.media_type: Input should be {', '.join(map(repr, IMAGE_MEDIA_TYPES))}"
        data = source.get("data")
        if not isinstance(data, str) or not data:
            return f"{here}.source.data: Field required"
        if len(data) > MAX_IMAGE_BYTES:  # the limit is on the base64 string, as the API measures it
            return f"{here}.source.base64: image exceeds 5 MB maximum"
        return None
    allowed = DOCUMENT_SOURCES.get(kind) if isinstance(kind, str) else None
    if allowed is not None and media_type not in allowed:
        return f"{here}.source.media_type: Input should be {', '.join(map(repr, allowed))}"
    return None


def _count_images(value: Any) -> int:
    if isinstance(value, list):
        return sum(_count_images(item) for item in value)
    if isinstance(value, dict):
        own = 1 if value.get("type") == "image" else 0
        return own + _count_images(value.get("content"))
    return 0


def _validate_blocks(blocks: list[Any], where: str) -> str | None:
    for j, block in enumerate(blocks):
        here = f"{where}.{j}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f"{here}: Input should be a valid content block"
        kind = block["type"]
        if kind in ("image", "document"):
            problem = _validate_media(block, here)
            if problem:
                return problem
        elif kind == "text":
            problem = _validate_text(block.get("text"), here)
            if problem:
                return problem
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not _TOOL_ID.match(block["id"]):
                return f"{here}.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            if not isinstance(block.get("input"), dict):
                return f"{here}.input: Input should be a valid dictionary"
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str) or not _TOOL_ID.match(block["tool_use_id"]):
                return f"{here}.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            inner = block.get("content")
            if isinstance(inner, list):
                problem = _validate_blocks(inner, f"{here}.content")
                if problem:
                    return problem
    return None


def _tool_ids(content: object, kind: str, key: str) -> list[str]:
    if not isinstance(content, list):
        return []
    return [str(b.get(key)) for b in content if isinstance(b, dict) and b.get("type") == kind]


def validate_request(body: object, headers: Mapping[str, str]) -> str | None:
    """The message of the 400 the real API would send for this request, or None if it is valid."""
    if "anthropic-version" not in headers:
        return "anthropic-version: header is required"
    if not isinstance(body, dict):
        return "Invalid request body: expected a JSON object"
    for key in ("temperature", "top_p", "top_k"):
        if key in body:
            return f"{key}: Extra inputs are not permitted"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        return "max_tokens: Field required (a non-negative integer)"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: Input should be a valid boolean"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or list of text blocks"
    if isinstance(system, list):
        problem = _validate_blocks(system, "system")
        if problem:
            return problem
    stop_sequences = body.get("stop_sequences")
    if stop_sequences is not None and (
        not isinstance(stop_sequences, list) or not all(isinstance(s, str) for s in stop_sequences)
    ):
        return "stop_sequences: Input should be a valid list of strings"

    tools = body.get("tools")
    tool_names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                return f"tools.{i}.name: Field required"
            if not _TOOL_NAME.match(tool["name"]):
                return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
            tool_names.append(tool["name"])
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        if not isinstance(tool_choice, dict) or tool_choice.get("type") not in _TOOL_CHOICES:
            return "tool_choice: Input should be a valid tool choice"
        if tool_choice["type"] == "none" and "disable_parallel_tool_use" in tool_choice:
            return "tool_choice.none.disable_parallel_tool_use: Extra inputs are not permitted"
        if tool_choice["type"] in ("any", "tool") and not tool_names:
            return "tool_choice: may only be specified while providing tools"
        if tool_choice["type"] == "tool" and tool_choice.get("name") not in tool_names:
            return f"Tool '{tool_choice.get('name')}' not found in provided tools"

    messages = body.get("messages")
    if not isinstance(messages, list):
        return "messages: Field required"
    if not messages:
        return "messages: at least one message is required"
    if _count_images(messages) > MAX_IMAGES:
        return f"messages: too many images: at most {MAX_IMAGES} images per request"
    uses_tools = False
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return f"{where}.role: Input should be 'user', 'assistant' or 'system'"
        content = message.get("content")
        is_final_assistant = i == len(messages) - 1 and message["role"] == "assistant"
        if isinstance(content, str):
            if not content.strip() and not is_final_assistant:
                return f"{where}: {_EMPTY_MESSAGE}"
        elif isinstance(content, list):
            if not content and not is_final_assistant:
                return f"{where}: {_EMPTY_MESSAGE}"
            problem = _validate_blocks(content, f"{where}.content")
            if problem:
                return problem
        else:
            return f"{where}.content: Input should be a valid string or list of content blocks"
        if is_final_assistant:
            last_text = content if isinstance(content, str) else ""
            if isinstance(content, list) and content and content[-1].get("type") == "text":
                last_text = content[-1].get("text", "")
            if last_text != last_text.rstrip():
                return "final assistant content cannot end with trailing whitespace"

        uses = _tool_ids(content, "tool_use", "id")
        results = _tool_ids(content, "tool_result", "tool_use_id")
        uses_tools = uses_tools or bool(uses or results)
        if uses and message["role"] != "assistant":
            return f"{where}: `tool_use` blocks can only be in `assistant` messages"
        if results and message["role"] != "user":
            return f"{where}: `tool_result` blocks can only be in `user` messages"
        if uses:
            following = messages[i + 1] if i + 1 < len(messages) else None
            answered = (
                set(_tool_ids(following.get("content"), "tool_result", "tool_use_id"))
                if isinstance(following, dict) and following.get("role") == "user"
                else set()
            )
            missing = [u for u in uses if u not in answered]
            if missing:
                return (
                    f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
                    "block in the next message."
                )
        if results:
            previous = messages[i - 1] if i > 0 else None
            offered = (
                set(_tool_ids(previous.get("content"), "tool_use", "id"))
                if isinstance(previous, dict) and previous.get("role") == "assistant"
                else set()
            )
            unexpected = [r for r in results if r not in offered]
            if unexpected:
                return (
                    f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{', '.join(unexpected)}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )
    if uses_tools and not tool_names:
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    breakpoints = sum(marked for _, marked in prompt_elements(body))
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        return (
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {breakpoints}."
        )
    return None


# --------------------------------------------------------------------------------------------------
# Prompt caching
# --------------------------------------------------------------------------------------------------

MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20
"""A breakpoint also finds cache entries ending up to 19 blocks before it (the real API's window)."""


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def prompt_elements(body: JSONObject) -> list[tuple[JSONObject, bool]]:
    """The cacheable blocks of a request in prompt order (tools, system, messages), each with its mark.

    Elements are canonical (cache_control removed, string content as a text block), so the same
    prefix hashes the same whatever breakpoints a request places on it.
    """
    elements: list[tuple[JSONObject, bool]] = []

    def add(element: JSONObject, source: object) -> None:
        elements.append((element, isinstance(source, dict) and "cache_control" in source))

    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        add({"tool": _without_cache_control(tool)}, tool)
    system = body.get("system")
    if isinstance(system, str) and system:
        add({"system": {"type": "text", "text": system}}, None)
    elif isinstance(system, list):
        for block in system:
            add({"system": _without_cache_control(block)}, block)
    messages = body.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks if isinstance(blocks, list) else []:
            element = {"role": message.get("role"), "message": index, "block": _without_cache_control(block)}
            add(element, block)
    if body.get("cache_control") is not None and elements:
        elements[-1] = (elements[-1][0], True)  # automatic caching marks the last cacheable block
    return elements


def prompt_tokens(body: JSONObject) -> int:
    """The fake's deterministic input-token estimate for a request (the sum over its blocks)."""
    return max(1, sum(_estimate_tokens(element) for element, _ in prompt_elements(body)))


@dataclass(frozen=True)
class CacheUsage:
    """What the fake's prompt cache did for one answered request (positions index `prompt_elements`)."""

    model: str
    breakpoints: tuple[int, ...]
    """Positions of the blocks marked cache_control that were long enough to cache."""
    read_position: int | None
    """Last block of the prefix read from the cache (None: nothing read)."""
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    input_tokens: int
    written: tuple[str, ...]
    """Hashes of the prefixes newly written by this request."""
    read: str | None
    """Hash of the prefix read, if any."""


def minimum_cacheable_tokens(model: str) -> int:
    """The real API's minimum cacheable prompt length: 2048 tokens for Haiku models, 1024 for the
    others (shorter prefixes are processed without caching, and no error is given)."""
    return 2048 if "haiku" in model.lower() else 1024


class PromptCache:
    """Prefixes remembered at breakpoints, keyed by a hash of model + canonical blocks."""

    def __init__(
        self,
        *,
        min_tokens: int | None = None,
        ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_tokens = min_tokens
        """The shortest prefix cached; None: the real API's minimum for the request's model."""
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, float] = {}

    def clear(self) -> None:
        self._entries.clear()

    def apply(self, body: JSONObject) -> CacheUsage:
        """Read the longest cached prefix, write the prefixes at this request's breakpoints."""
        model = str(body.get("model"))
        elements = prompt_elements(body)
        hashes: list[str] = []
        cumulative: list[int] = []
        running = hashlib.sha256(model.encode()).hexdigest()
        total = 0
        for element, _ in elements:
            canonical = json.dumps(element, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            running = hashlib.sha256((running + canonical).encode()).hexdigest()
            total += _estimate_tokens(element)
            hashes.append(running)
            cumulative.append(total)
        now = self._clock()
        self._entries = {h: expiry for h, expiry in self._entries.items() if expiry > now}
        minimum = minimum_cacheable_tokens(model) if self.min_tokens is None else self.min_tokens
        marks = tuple(i for i, (_, marked) in enumerate(elements) if marked and cumulative[i] >= minimum)
        read_position: int | None = None
        for mark in marks:
            for position in range(mark, max(-1, mark - CACHE_LOOKBACK_BLOCKS), -1):
                if hashes[position] in self._entries:
                    if read_position is None or position > read_position:
                        read_position = position
                    break
        read_tokens = cumulative[read_position] if read_position is not None else 0
        last = marks[-1] if marks else None
        cached_to = cumulative[last] if last is not None else 0
        written = tuple(hashes[m] for m in marks if hashes[m] not in self._entries)
        for mark in marks:
            self._entries[hashes[mark]] = now + self.ttl  # a read refreshes the entry too
        if read_position is not None:
            self._entries[hashes[read_position]] = now + self.ttl
        return CacheUsage(
            model=model,
            breakpoints=marks,
            read_position=read_position,
            cache_read_input_tokens=read_tokens,
            cache_creation_input_tokens=max(0, cached_to - read_tokens),
            input_tokens=total - max(cached_to, read_tokens),
            written=written,
            read=hashes[read_position] if read_position is not None else None,
        )


# --------------------------------------------------------------------------------------------------
# Default replies
# --------------------------------------------------------------------------------------------------


def _text_of(content: object) -> str:
    """The readable text of message or tool_result content (texts joined with a space)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            parts.append(f"tool_result({block.get('tool_use_id')}): {_text_of(block.get('content'))}")
        elif isinstance(block.get("type"), str):
            parts.append(f"[{block['type']}]")
    return " ".join(parts)


def _ends_with_tool_result(messages: list[Any]) -> bool:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return (
                isinstance(content, list)
                and bool(content)
                and isinstance(content[-1], dict)
                and content[-1].get("type") == "tool_result"
            )
    return False


def default_reply(body: JSONObject) -> MessageReply:
    """The deterministic reply used when the queue is empty."""
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    assert isinstance(messages, list)
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
    tool_choice = body.get("tool_choice") if isinstance(body.get("tool_choice"), dict) else {}
    assert isinstance(tool_choice, dict)
    if tools and tool_choice.get("type") != "none" and not _ends_with_tool_result(messages):
        tool = tools[0]
        if tool_choice.get("type") == "tool":
            tool = next((t for t in tools if t["name"] == tool_choice.get("name")), tool)
        schema = tool.get("input_schema")
        tool_input = synthesize_arguments(schema) if isinstance(schema, dict) else {}
        return tool_use_reply(tool["name"], tool_input)
    last_user = next(
        (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), {"content": ""}
    )
    summary = _text_of(last_user.get("content"))
    text = f"fake-claude says: {len(messages)} messages; last: {summary}"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and _estimate_tokens([{"type": "text", "text": text}]) > max_tokens:
        # As Claude does: the answer stops at max_tokens (the usage then reports at most that many).
        while text and _estimate_tokens([{"type": "text", "text": text}]) > max_tokens:
            text = text[: max(0, len(text) - max(1, len(text) // 8))]
        return text_reply(text, stop_reason="max_tokens")
    return text_reply(text)


# --------------------------------------------------------------------------------------------------
# Wire rendering
# --------------------------------------------------------------------------------------------------

_STATUS_FOR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def _estimate_tokens(value: object) -> int:
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


def _split(text: str, pieces: int) -> list[str]:
    """`text` cut into at most `pieces` non-empty consecutive parts (none for an empty text)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size = -(-len(text) // pieces)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(event: str, data: JSONObject) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _error_body(
    error_type: str, message: str, request_id: str, details: JSONObject | None = None
) -> JSONObject:
    error: JSONObject = {"type": error_type, "message": message}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error, "request_id": request_id}


def _block_start_events(index: int, block: JSONObject, chunks: int) -> list[bytes]:
    """content_block_start and the deltas for one block, without content_block_stop."""
    kind = block.get("type")
    frames: list[bytes] = []

    def delta(payload: JSONObject) -> None:
        frames.append(
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload})
        )

    if kind == "text":
        frames.append(
            _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        )
        for piece in _split(str(block.get("text", "")), chunks):
            delta({"type": "text_delta", "text": piece})
    elif kind == "tool_use":
        start = {**block, "input": {}}
        frames.append(
            _sse(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
        )
        delta({"type": "input_json_delta", "partial_json": ""})
        for piece in _split(json.dumps(block.get("input", {})), chunks):
            delta({"type": "input_json_delta", "partial_json": piece})
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        frames.append(
            _sse(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
        )
        for piece in _split(str(block.get("thinking", "")), chunks):
            delta({"type": "thinking_delta", "thinking": piece})
        delta({"type": "signature_delta", "signature": str(block.get("signature", ""))})
    else:
        frames.append(
            _sse(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
            )
        )
    return frames


def _block_stop(index: int) -> bytes:
    return _sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _stream_head(message: JSONObject) -> list[bytes]:
    usage = {**message["usage"], "output_tokens": 1}
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "usage": usage,
    }
    return [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("ping", {"type": "ping"}),
    ]


def stream_frames(message: JSONObject, chunks: int = 3) -> list[bytes]:
    """The server-sent events of a whole message, in the real API's order."""
    frames = _stream_head(message)
    for index, block in enumerate(message["content"]):
        frames += _block_start_events(index, block, chunks)
        frames.append(_block_stop(index))
    usage = message["usage"]
    frames.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message["stop_reason"],
                    "stop_sequence": message["stop_sequence"],
                    "stop_details": message.get("stop_details"),
                },
                "usage": {
                    "input_tokens": usage["input_tokens"],
                    "output_tokens": usage["output_tokens"],
                    "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                    "cache_read_input_tokens": usage["cache_read_input_tokens"],
                },
            },
        )
    )
    frames.append(_sse("message_stop", {"type": "message_stop"}))
    return frames


USAGE_COUNTERS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


class ServedUsage:
    """The tokens one 200 response actually served, as far as it was written: a complete JSON
    message, its usage; a stream, the input side of `message_start` once that was written, then the
    output of the content deltas written (estimated as the fake estimates output: characters / 4,
    at least 1 per delta), replaced by `message_delta`'s reported output once that was written."""

    def __init__(self) -> None:
        self.usage = dict.fromkeys(USAGE_COUNTERS, 0)
        self._estimated_output = 0

    @property
    def total(self) -> int:
        return sum(self.usage.values())

    def take(self, part: bytes) -> None:
        if part.lstrip().startswith(b"{"):
            with contextlib.suppress(ValueError):
                self._absorb(json.loads(part).get("usage") or {}, final=True)
            return
        for frame in part.split(b"\n\n"):
            data = b"".join(line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:"))
            try:
                event = json.loads(data) if data else None
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("type") == "message_start":
                self._absorb((event.get("message") or {}).get("usage") or {}, final=False)
            elif event.get("type") == "content_block_delta":
                delta = event.get("delta") or {}
                text = next(
                    (delta[k] for k in ("text", "partial_json", "thinking") if isinstance(delta.get(k), str)),
                    "",
                )
                self._estimated_output += max(1, len(text) // 4)
                self.usage["output_tokens"] = max(self.usage["output_tokens"], self._estimated_output)
            elif event.get("type") == "message_delta":
                self._absorb(event.get("usage") or {}, final=True)

    def _absorb(self, usage: Mapping[str, Any], *, final: bool) -> None:
        for key in USAGE_COUNTERS:
            value = usage.get(key)
            if isinstance(value, int):
                if key == "output_tokens" and not final:
                    value = max(value, self._estimated_output)
                self.usage[key] = value


class _ScriptedResponse(Response):
    """A response sent part by part, which notices when the client goes away before the end."""

    def __init__(
        self,
        fake: FakeClaude,
        status: int,
        headers: Mapping[str, str],
        parts: list[bytes],
        *,
        delay: float = 0.0,
        part_delay: float = 0.0,
        hang: bool = False,
        hang_before_start: bool = False,
        abort: bool = False,
    ) -> None:
        self.fake = fake
        self.status_code = status
        self.background = None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.parts = parts
        self.delay = delay
        self.part_delay = part_delay
        self.hang = hang
        self.hang_before_start = hang_before_start
        self.abort = abort
        """Drop the connection after the parts instead of ending the body (a truncated response)."""
        self.served = fake._serving() if status == 200 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = False
        disconnected = False

        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                nonlocal disconnected
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        if not finished:
                            disconnected = True
                            tg.cancel_scope.cancel()
                        return

            async def emit() -> None:
                nonlocal finished
                if self.delay > 0:
                    await self.fake._pause(self.delay)
                if self.hang_before_start:
                    await self.fake._pause(None)
                    finished = True
                    body = json.dumps(
                        _error_body("api_error", "fake shut down", "req_fake_shutdown")
                    ).encode()
                    await send({"type": "http.response.start", "status": 500, "headers": self.raw_headers})
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    return
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                for n, part in enumerate(self.parts):
                    if n and self.part_delay > 0:
                        await self.fake._pause(self.part_delay)
                    last = n == len(self.parts) - 1 and not self.hang and not self.abort
                    message: Message = {"type": "http.response.body", "body": part, "more_body": not last}
                    if last:
                        finished = True
                    await send(message)
                    if self.served is not None:
                        self.served.take(part)
                if self.abort:
                    return
                if self.hang or not self.parts:
                    if self.hang:
                        await self.fake._pause(None)
                    finished = True
                    await send({"type": "http.response.body", "body": b"", "more_body": False})

            tg.start_soon(watch)
            with contextlib.suppress(OSError):
                await emit()
            tg.cancel_scope.cancel()
        if disconnected:
            self.fake._record_disconnect()
        elif self.abort:
            # Raising after the response started makes uvicorn close the connection mid-body.
            raise _DroppedConnection("fake-claude dropped the connection on purpose")


# --------------------------------------------------------------------------------------------------
# Fault modes and cloud platforms (Bedrock's event-stream framing)
# --------------------------------------------------------------------------------------------------


class _DroppedConnection(Exception):
    """Raised by a response that must end with a dropped connection."""


class _QuietDroppedConnections(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not any(isinstance(e, _DroppedConnection) for e in _exception_chain(exc))


def _exception_chain(exc: BaseException | None) -> list[BaseException]:
    found: list[BaseException] = []
    pending = [exc] if exc is not None else []
    while pending:
        item = pending.pop()
        found.append(item)
        if isinstance(item, BaseExceptionGroup):
            pending.extend(item.exceptions)
        if item.__cause__ is not None:
            pending.append(item.__cause__)
        if item.__context__ is not None:
            pending.append(item.__context__)
    return found


def _eventstream_header(name: str, value: str) -> bytes:
    encoded_name, encoded_value = name.encode(), value.encode()
    return (
        struct.pack("!B", len(encoded_name))
        + encoded_name
        + struct.pack("!BH", 7, len(encoded_value))  # 7: a string value
        + encoded_value
    )


def eventstream_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths + CRC), headers, payload, message CRC."""
    encoded = b"".join(_eventstream_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    head = prelude + struct.pack("!I", zlib.crc32(prelude)) + encoded + payload
    return head + struct.pack("!I", zlib.crc32(head))


def bedrock_chunk(sse_frame: bytes) -> bytes:
    """An SSE frame (`event: X\ndata: JSON\n\n`) as Bedrock sends it: a `chunk` event whose payload
    is `{"bytes": base64(JSON)}`."""
    data = next(line[6:] for line in sse_frame.split(b"\n") if line.startswith(b"data: "))
    payload = json.dumps({"bytes": base64.b64encode(data).decode()}).encode()
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    return eventstream_message(headers, payload)


def bedrock_exception(exception_type: str, message: str) -> bytes:
    """A mid-stream Bedrock exception frame (e.g. `modelStreamErrorException`)."""
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return eventstream_message(headers, json.dumps({"message": message}).encode())


def random_faults(seed: int, weights: Mapping[str, float]) -> ReplyFactory:
    """A seeded `ReplyFactory` drawing, per request, one of: "ok" (the default reply), "529",
    "500", "429", "overloaded" (mid-stream error), "garbage", "truncated", "dropped", "400"."""
    rng = random.Random(seed)
    kinds = list(weights)
    chances = [weights[k] for k in kinds]

    def reply(request: RecordedRequest) -> Reply:
        kind = rng.choices(kinds, chances)[0]
        faults: dict[str, Reply] = {
            "529": error_reply(529, "overloaded_error", "Overloaded", retry_after=0),
            "500": error_reply(500, "api_error", "Internal server error"),
            "429": error_reply(429, "rate_limit_error", "Rate limited", retry_after=0),
            "overloaded": stream_error_reply("overloaded_error", "Overloaded"),
            "garbage": garbage_stream_reply(),
            "truncated": truncated_stream_reply(),
            "dropped": truncated_stream_reply(abrupt=True),
            "400": error_reply(400, "invalid_request_error", "scripted bad request"),
        }
        return faults[kind] if kind in faults else default_reply(request.body)

    return reply


class _CountedResponse(Response):
    """Sends `inner` and then calls `done` (however the sending ends)."""

    def __init__(self, inner: Response, done: Callable[[], None]) -> None:
        self.inner = inner
        self.done = done
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.done()


# --------------------------------------------------------------------------------------------------
# The fake server
# --------------------------------------------------------------------------------------------------


OAUTH_TOKEN_PATH = "/oauth2/token"
# Vertex counts tokens at `.../publishers/anthropic/models/count-tokens:rawPredict`, the model named
# in the body (with `anthropic_version`, not counted), as `AnthropicVertex.messages.count_tokens` calls.
VERTEX_COUNT_TOKENS = "count-tokens"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


def _sigv4_signed(recorded: RecordedRequest) -> bool:
    """Signed with AWS SigV4 (as Bedrock takes it besides an API key); the signature is not checked,
    the keys are AWS's."""
    authorization = recorded.headers.get("authorization", "")
    return authorization.startswith("AWS4-HMAC-SHA256 Credential=") and "x-amz-date" in recorded.headers


def _vertex_counting(path: str) -> bool:
    return path.startswith("/projects/") and path.endswith(f"/models/{VERTEX_COUNT_TOKENS}:rawPredict")


class FakeClaude:
    """The fake Claude API server; use as a context manager (or `start()` / `close()`).

    `api_key`: when given, only `Authorization: Bearer <api_key>` is accepted; otherwise any
    non-empty Bearer token. `validate`: reject requests the real API would reject (400).
    `keep_alive`: seconds an idle connection stays open before the fake closes it.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        validate: bool = True,
        cache_min_tokens: int | None = None,
        cache_ttl: float = 300.0,
        keep_alive: float = 5.0,
    ) -> None:
        self.api_key = api_key
        self.keep_alive = keep_alive
        """Seconds an idle connection is kept open (uvicorn's default, 5)."""
        self.validate = validate
        self.prompt_cache = PromptCache(min_tokens=cache_min_tokens, ttl=cache_ttl)
        self._cache_usages: list[CacheUsage] = []
        self._in_flight = 0
        self._max_in_flight = 0
        self.fallback: ReplyFactory | None = None
        self.oauth_token = f"ya29.fake-minted-{secrets.token_hex(16)}"
        """The access token `POST /oauth2/token` mints for the credentials the fake issued; settable."""
        self.oauth_expires_in = 3600
        """The lifetime of each token minted, in seconds (google-auth refreshes one that has less
        than 3 min 45 s left before every use); settable."""
        self.oauth_echo_errors = False
        """Refuse every `POST /oauth2/token` with an `invalid_grant` that quotes the request's form
        (its refresh token, client secret or signed assertion) and its `Authorization` header (the
        OAuth client's id and secret, `Basic`), as a buggy proxy in front might."""
        self.oauth_quote_signature = False
        """Refuse every `POST /oauth2/token` with an `invalid_grant` that names, alone and first, the
        credential the grant carries: the signature of a service account's signed assertion (`JWT
        signature <signature> does not verify`), or the subject token of a workload identity
        federation's token exchange (`subject token <token> does not verify`), as an endpoint
        quoting what it could not verify might; settable."""
        self.oauth_outages = 0
        """How many of the next `POST /oauth2/token` requests have their connection dropped before
        an answer (the endpoint briefly unreachable: google-auth raises `TransportError`); settable."""
        self.oauth_unavailable = 0
        """How many of the next `POST /oauth2/token` requests are answered `503` with Google's
        `UNAVAILABLE` error (an outage of the service); settable."""
        self._service_account_keys: dict[str, bytes] = {}  # private_key_id -> public key (PEM)
        self.sts_credentials = (
            f"ASIAFAKE{secrets.token_hex(6).upper()}",
            f"fake-sts-secret-{secrets.token_hex(12)}",
            f"FwoGZXIvYXdzEFAKE/{secrets.token_hex(24)}+sts=",
        )
        """The access key id, secret key and session token `AssumeRole` gives; settable."""
        self.sts_outages = 0
        """How many of the next STS requests have their connection dropped before an answer (the
        endpoint briefly unreachable); settable."""
        self.sts_unavailable = 0
        """How many of the next STS requests are answered `503 ServiceUnavailable` (an outage of
        the service, as AWS reports it); settable."""
        self._refresh_tokens: set[str] = set()
        """Called for the reply when the queue is empty (instead of the default reply); settable."""
        self._lock = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._queue: deque[Reply | ReplyFactory] = deque()
        self._count_tokens_queue: deque[ErrorReply] = deque()
        self._disconnects = 0
        self._served: list[ServedUsage] = []
        self._counter = 0
        self._url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: anyio.Event | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/model/{model}/invoke-with-response-stream", self._bedrock, methods=["POST"]),
                Route("/model/{model}/invoke", self._bedrock, methods=["POST"]),
                Route(
                    "/projects/{project}/locations/{region}/publishers/anthropic/models/{call}",
                    self._vertex,
                    methods=["POST"],
                ),
                Route(OAUTH_TOKEN_PATH, self._oauth_token, methods=["POST"]),
                Route("/", self._sts, methods=["POST"]),
                Route("/{path:path}", self._not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
            lifespan=self._lifespan,
        )

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL for ANTHROPIC_BASE_URL / `base_url=` (e.g. `http://127.0.0.1:53211`)."""
        if self._url is None:
            raise RuntimeError("FakeClaude is not running")
        return self._url

    def start(self, timeout: float = 10.0) -> FakeClaude:
        if self._thread is not None:
            raise RuntimeError("FakeClaude already started")
        quiet = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _QuietDroppedConnections) for f in quiet.filters):
            quiet.addFilter(_QuietDroppedConnections())
        # IPPROTO_TCP, not 0: asyncio turns on TCP_NODELAY only for sockets that say TCP; without it
        # an answer on a kept-alive connection can wait 40 ms for the peer's delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            http="h11",
            loop="asyncio",
            lifespan="on",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=self.keep_alive,  # type: ignore[arg-type]  # uvicorn takes any number
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-claude", daemon=True
        )
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.close()
                sock.close()
                raise RuntimeError("FakeClaude failed to start")
            time.sleep(0.005)
        self._url = f"http://127.0.0.1:{port}"
        return self

    def close(self, timeout: float = 10.0) -> None:
        server, thread, loop, shutdown = self._server, self._thread, self._loop, self._shutdown
        if server is None or thread is None:
            return
        if loop is not None and shutdown is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(shutdown.set)
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        self._server = self._thread = None
        self._url = None

    def __enter__(self) -> FakeClaude:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self._shutdown = anyio.Event()
        yield

    async def _pause(self, seconds: float | None) -> None:
        """Sleep (forever when None), waking up early when the fake shuts down."""
        assert self._shutdown is not None
        with anyio.move_on_after(float("inf") if seconds is None else seconds):
            await self._shutdown.wait()

    # ---- scripting and inspection ----------------------------------------------------------------

    def enqueue(self, *replies: Reply | ReplyFactory) -> None:
        """Queue replies for the next `POST /v1/messages` requests (FIFO, one per request)."""
        with self._lock:
            self._queue.extend(replies)

    def enqueue_count_tokens(self, *replies: ErrorReply) -> None:
        """Queue errors for the next token-counting requests (the Claude API's and Vertex's), one per
        request; once they are used up, tokens are counted."""
        with self._lock:
            self._count_tokens_queue.extend(replies)

    @property
    def pending(self) -> int:
        """Queued replies not used yet."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (all paths, including rejected ones), oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def message_requests(self) -> list[RecordedRequest]:
        """Only the `POST /v1/messages` requests."""
        return [r for r in self.requests if r.path == "/v1/messages"]

    @property
    def disconnects(self) -> int:
        """How many responses the client abandoned before their end (e.g. a cancelled hang)."""
        with self._lock:
            return self._disconnects

    @property
    def cache_usages(self) -> list[CacheUsage]:
        """What the prompt cache did for each answered message request, oldest first."""
        with self._lock:
            return list(self._cache_usages)

    @property
    def max_in_flight(self) -> int:
        """The most `POST /v1/messages` requests that were being answered at the same time."""
        with self._lock:
            return self._max_in_flight

    def reset(self) -> None:
        """Forget recorded requests, disconnects and the prompt cache, and drop queued replies."""
        with self._lock:
            self._requests.clear()
            self._served.clear()
            self._queue.clear()
            self._count_tokens_queue.clear()
            self._disconnects = 0
            self._cache_usages.clear()
            self._max_in_flight = self._in_flight
            self.prompt_cache.clear()

    def wait_for_requests(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until at least `count` calls (POST requests, whatever their path) were received;
        False on timeout. A `HEAD` or `GET`, such as the one the proxy's warm-up connects with, is
        no call."""

        def calls() -> int:
            return sum(1 for request in self._requests if request.method == "POST")

        with self._lock:
            return self._lock.wait_for(lambda: calls() >= count, timeout)

    def wait_for_disconnects(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until at least `count` disconnects were recorded; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._disconnects >= count, timeout)

    async def await_requests(self, count: int = 1, timeout: float = 5.0) -> bool:
        """`wait_for_requests` for async tests (does not block the event loop)."""
        return await anyio.to_thread.run_sync(self.wait_for_requests, count, timeout)

    async def await_disconnects(self, count: int = 1, timeout: float = 5.0) -> bool:
        """`wait_for_disconnects` for async tests (does not block the event loop)."""
        return await anyio.to_thread.run_sync(self.wait_for_disconnects, count, timeout)

    # ---- internals -------------------------------------------------------------------------------

    def _serving(self) -> ServedUsage:
        served = ServedUsage()
        with self._lock:
            self._served.append(served)
        return served

    @property
    def served(self) -> list[ServedUsage]:
        """What each 200 response served (see `ServedUsage`), in the order they started."""
        with self._lock:
            return list(self._served)

    def served_tokens(self) -> int:
        """Every token the fake served, all four usage counters summed: what a ledger must cover."""
        return sum(served.total for served in self.served)

    def _record_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1
            self._lock.notify_all()

    def _next_number(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    async def _record(self, request: Request) -> tuple[RecordedRequest, object]:
        raw = await request.body()
        parsed: object = None
        with contextlib.suppress(ValueError):
            parsed = json.loads(raw) if raw else None
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=parsed if isinstance(parsed, dict) else {},
            raw_body=raw,
            peer=(request.client.host, request.client.port) if request.client else None,
        )
        with self._lock:
            self._requests.append(recorded)
            self._lock.notify_all()
        return recorded, parsed

    def _error(
        self,
        status: int,
        error_type: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        details: JSONObject | None = None,
    ) -> Response:
        request_id = f"req_fake_{self._next_number():06d}"
        body = json.dumps(_error_body(error_type, message, request_id, details)).encode()
        all_headers = {"content-type": "application/json", "request-id": request_id, **(headers or {})}
        return Response(body, status_code=status, headers=all_headers)

    def _error_reply(self, reply: ErrorReply, recorded: RecordedRequest) -> Response:
        message = reply.message
        if reply.echo_headers:
            echoed = reply.echo_headers
            names = tuple(recorded.headers) if isinstance(echoed, bool) else echoed
            quoted = {name: recorded.headers.get(name) for name in names}
            message += f" (request headers: {json.dumps(quoted, sort_keys=True)})"
        return self._error(reply.status, reply.error_type, message, reply.headers, reply.details)

    def _auth_problem(self, recorded: RecordedRequest) -> Response | None:
        scheme, _, token = recorded.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._error(401, "authentication_error", "invalid x-api-key")
        if self.api_key is not None and token != self.api_key:
            return self._error(401, "authentication_error", "invalid x-api-key")
        return None

    def _take_reply(self, recorded: RecordedRequest) -> Reply:
        with self._lock:
            item = self._queue.popleft() if self._queue else None
        if item is None:
            fallback = self.fallback
            return default_reply(recorded.body) if fallback is None else fallback(recorded)
        if isinstance(item, MessageReply | ErrorReply | StreamErrorReply | HangReply | FaultReply | RawReply):
            return item
        return item(recorded)

    def _message_json(self, reply: MessageReply, body: JSONObject, *, cache: bool = True) -> JSONObject:
        """The message for `reply`; with `cache`, usage comes from the prompt-cache model."""
        number = self._next_number()
        content: list[JSONObject] = []
        for block in reply.content:
            block = dict(block)
            if block.get("type") == "tool_use" and block.get("id") is None:
                block["id"] = f"toolu_fake_{number:06d}_{len(content)}"
            content.append(block)
        usage: JSONObject = {
            "input_tokens": prompt_tokens(body),
            "output_tokens": _estimate_tokens(content),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if cache:
            with self._lock:
                cached = self.prompt_cache.apply(body)
                self._cache_usages.append(cached)
            usage.update(
                input_tokens=cached.input_tokens,
                cache_creation_input_tokens=cached.cache_creation_input_tokens,
                cache_read_input_tokens=cached.cache_read_input_tokens,
            )
        usage.update(reply.usage or {})
        return {
            "id": reply.message_id or f"msg_fake_{number:06d}",
            "type": "message",
            "role": "assistant",
            "model": reply.model or body.get("model", "claude-fake"),
            "content": content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": reply.stop_sequence,
            "stop_details": reply.stop_details,
            "usage": usage,
        }

    def _sse_response(
        self, parts: list[bytes], headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> _ScriptedResponse:
        all_headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "request-id": f"req_fake_{self._next_number():06d}",
            **(headers or {}),
        }
        return _ScriptedResponse(self, 200, all_headers, parts, **kwargs)

    # ---- endpoints -------------------------------------------------------------------------------

    async def _messages(self, request: Request) -> Response:
        """`POST /v1/messages`, counted as in flight until its response has been sent in full."""
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            response = await self._answer_messages(request)
        except BaseException:
            self._leave()
            raise
        return _CountedResponse(response, self._leave)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    async def _answer_messages(self, request: Request) -> Response:
        recorded, parsed = await self._record(request)
        problem = self._auth_problem(recorded)
        if problem is not None:
            return problem
        if parsed is None and request.headers.get("content-type", "").startswith("application/json"):
            return self._error(400, "invalid_request_error", "Invalid JSON in request body")
        if self.validate:
            message = validate_request(parsed, recorded.headers)
            if message is not None:
                return self._error(400, "invalid_request_error", message)
        body = recorded.body
        reply = self._take_reply(recorded)
        streaming = recorded.stream

        if isinstance(reply, ErrorReply):
            return self._error_reply(reply, recorded)
        if isinstance(reply, RawReply):
            return self._raw_response(reply)
        if isinstance(reply, StreamErrorReply):
            if not streaming:
                return self._error(
                    _STATUS_FOR_TYPE.get(reply.error_type, 500), reply.error_type, reply.message
                )
            message_json = self._message_json(MessageReply(content=[], stop_reason=None), body, cache=False)
            parts = _stream_head(message_json)
            if reply.partial_text:
                parts += _block_start_events(0, {"type": "text", "text": reply.partial_text}, 3)
            error = {"type": "error", "error": {"type": reply.error_type, "message": reply.message}}
            parts.append(_sse("error", error))
            return self._sse_response(parts)
        if isinstance(reply, GarbageStreamReply | TruncatedStreamReply):
            return self._fault_response(reply, body, streaming)
        if isinstance(reply, HangReply):
            if not streaming:
                headers = {
                    "content-type": "application/json",
                    "request-id": f"req_fake_{self._next_number():06d}",
                }
                return _ScriptedResponse(self, 200, headers, [], hang_before_start=True)
            message_json = self._message_json(MessageReply(content=[], stop_reason=None), body, cache=False)
            parts = _stream_head(message_json)
            if reply.partial_text:
                parts += _block_start_events(0, {"type": "text", "text": reply.partial_text}, 3)
            return self._sse_response(parts, hang=True)

        message_json = self._message_json(reply, body)
        if streaming:
            return self._sse_response(
                stream_frames(message_json, reply.chunks),
                reply.headers,
                delay=reply.delay,
                part_delay=reply.event_delay,
            )
        headers = {
            "content-type": "application/json",
            "request-id": f"req_fake_{self._next_number():06d}",
            **reply.headers,
        }
        return _ScriptedResponse(self, 200, headers, [json.dumps(message_json).encode()], delay=reply.delay)

    async def _count_tokens(self, request: Request) -> Response:
        recorded, parsed = await self._record(request)
        return self._counted(recorded, parsed)

    def _counted(self, recorded: RecordedRequest, parsed: object) -> Response:
        """`{"input_tokens": N}` for a token-counting request, or the queued error for it."""
        problem = self._auth_problem(recorded)
        if problem is not None:
            return problem
        with self._lock:
            queued = self._count_tokens_queue.popleft() if self._count_tokens_queue else None
        if queued is not None:
            return self._error_reply(queued, recorded)
        body = recorded.body
        if not isinstance(parsed, dict) or not isinstance(body.get("model"), str):
            return self._error(400, "invalid_request_error", "model: Field required")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return self._error(400, "invalid_request_error", "messages: Field required")
        count = prompt_tokens({k: v for k, v in body.items() if k != "anthropic_version"})
        return Response(
            json.dumps({"input_tokens": count}).encode(),
            headers={"content-type": "application/json", "request-id": f"req_fake_{self._next_number():06d}"},
        )

    async def _not_found(self, request: Request) -> Response:
        recorded, _ = await self._record(request)
        problem = self._auth_problem(recorded)
        if problem is not None:
            return problem
        if recorded.path in ("/v1/messages", "/v1/messages/count_tokens"):
            return self._error(405, "invalid_request_error", f"Method {request.method} not allowed")
        return self._error(404, "not_found_error", f"Not found: {request.method} {recorded.path}")

    # ---- Google credentials (Application Default Credentials for Vertex) ---------------------------

    def service_account_info(self, project_id: str) -> JSONObject:
        """A service-account key file's JSON, naming `project_id`, with a fresh RSA key whose public
        half the token endpoint checks the signed assertion against, and `token_uri` at the fake."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = secrets.token_hex(20)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        with self._lock:
            self._service_account_keys[key_id] = public
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "type": "service_account",
            "project_id": project_id,
            "private_key_id": key_id,
            "private_key": private.decode(),
            "client_email": f"mcp-backfill-tests@{project_id}.iam.gserviceaccount.com",
            "client_id": "100000000000000000001",
            "token_uri": self.url + OAUTH_TOKEN_PATH,
        }

    def workforce_user_info(self, refresh_token: str | None = None) -> JSONObject:
        """User credentials as `gcloud auth application-default login` writes them for a workforce
        identity federation user (`external_account_authorized_user`): they name no project, and
        their `token_url` is the fake. (Plain `authorized_user` credentials cannot serve here:
        google-auth sends their refresh to oauth2.googleapis.com whatever the file says, and the
        SDK mints a token before it asks for the project.) `refresh_token`: the one they hold (a
        Google-shaped `1//0g…`, say), by default a new one."""
        refresh_token = refresh_token or f"fake-refresh-{secrets.token_hex(16)}"
        with self._lock:
            self._refresh_tokens.add(refresh_token)
        return {
            "type": "external_account_authorized_user",
            "audience": "//iam.googleapis.com/locations/global/workforcePools/fake-pool/providers/fake",
            "client_id": "fake-client-id",
            "client_secret": "fake-client-secret",
            "refresh_token": refresh_token,
            "token_url": self.url + OAUTH_TOKEN_PATH,
        }

    @property
    def token_requests(self) -> list[RecordedRequest]:
        """Only the `POST /oauth2/token` requests."""
        return [r for r in self.requests if r.path == OAUTH_TOKEN_PATH]

    def _grant_problem(self, form: Mapping[str, str]) -> tuple[str, str] | None:
        """Why the grant is refused, as Google's (error, error_description); None when it is not."""
        grant = form.get("grant_type")
        if grant == "refresh_token":
            with self._lock:
                known = form.get("refresh_token") in self._refresh_tokens
            return None if known else ("invalid_grant", "Bad Request")
        if grant != JWT_BEARER_GRANT:
            return ("unsupported_grant_type", f"Invalid grant_type: {grant}")
        from google.auth import exceptions, jwt

        with self._lock:
            keys = {key_id: public.decode() for key_id, public in self._service_account_keys.items()}
        try:
            # google-auth addresses the assertion to Google's endpoint whatever the token_uri.
            audience = [self.url + OAUTH_TOKEN_PATH, GOOGLE_TOKEN_AUDIENCE]
            assertion = form.get("assertion", "")
            claims = jwt.decode(assertion, certs=keys, audience=audience)  # type: ignore[no-untyped-call]
        except (ValueError, exceptions.GoogleAuthError) as exc:
            return ("invalid_grant", f"Invalid JWT Signature. ({exc})")
        if not claims.get("scope"):
            return ("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
        return None

    async def _oauth_token(self, request: Request) -> Response:
        """Google's OAuth2 token endpoint: `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`
        with a service account's signed `assertion`, or `grant_type=refresh_token`."""
        recorded, _ = await self._record(request)
        with self._lock:
            outage, self.oauth_outages = self.oauth_outages > 0, max(0, self.oauth_outages - 1)
        if outage:  # the connection drops before the answer's body
            return _ScriptedResponse(self, 502, {"content-type": "application/json"}, [b"{"], abort=True)
        with self._lock:
            unavailable, self.oauth_unavailable = (
                self.oauth_unavailable > 0,
                max(0, self.oauth_unavailable - 1),
            )
        if unavailable:
            google_error = {
                "code": 503,
                "message": "The service is currently unavailable.",
                "status": "UNAVAILABLE",
            }
            return JSONResponse({"error": google_error}, status_code=503)
        pairs = urllib.parse.parse_qsl(recorded.raw_body.decode("utf-8", "replace"))
        if self.oauth_echo_errors:
            quoted = recorded.raw_body.decode("utf-8", "replace")
            if "authorization" in recorded.headers:  # the client's credentials, sent as a header
                quoted += f" (authorization: {recorded.headers['authorization']})"
            return JSONResponse({"error": "invalid_grant", "error_description": f"refused {quoted}"}, 400)
        if self.oauth_quote_signature:
            form = dict(pairs)
            if "subject_token" in form:
                description = f"subject token {form['subject_token']} does not verify"
            else:
                description = f"JWT signature {form.get('assertion', '').rpartition('.')[2]} does not verify"
            return JSONResponse({"error": "invalid_grant", "error_description": description}, 400)
        problem = self._grant_problem(dict(pairs))
        if problem is not None:
            error, description = problem
            return JSONResponse({"error": error, "error_description": description}, status_code=400)
        minted = {
            "access_token": self.oauth_token,
            "expires_in": self.oauth_expires_in,
            "token_type": "Bearer",
        }
        return JSONResponse(minted)

    # ---- AWS STS (AssumeRole, for Bedrock's SigV4 credentials from a role profile) ----------------

    @property
    def sts_requests(self) -> list[RecordedRequest]:
        """Only the STS requests (`POST /` with an `Action`)."""
        return [r for r in self.requests if r.path == "/" and r.method == "POST"]

    async def _sts(self, request: Request) -> Response:
        """AWS STS's query protocol at `AWS_ENDPOINT_URL_STS`: `Action=AssumeRole` answered with
        `sts_credentials` for an hour (the caller's signature is not checked)."""
        recorded, _ = await self._record(request)
        form = dict(urllib.parse.parse_qsl(recorded.raw_body.decode("utf-8", "replace")))
        with self._lock:
            outage, self.sts_outages = self.sts_outages > 0, max(0, self.sts_outages - 1)
        if outage:  # the connection drops before the answer's body
            return _ScriptedResponse(self, 502, {"content-type": "text/xml"}, [b"<"], abort=True)
        with self._lock:
            unavailable, self.sts_unavailable = self.sts_unavailable > 0, max(0, self.sts_unavailable - 1)
        if unavailable:
            error = (
                '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Receiver</Type>'
                "<Code>ServiceUnavailable</Code><Message>Service is unavailable</Message></Error>"
                "<RequestId>fake-sts</RequestId></ErrorResponse>"
            )
            return Response(error.encode(), status_code=503, headers={"content-type": "text/xml"})
        if form.get("Action") != "AssumeRole":
            return self._error(404, "not_found_error", f"Not found: {request.method} {recorded.path}")
        key_id, secret, token = self.sts_credentials
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        role = form.get("RoleArn", "arn:aws:iam::123456789012:role/fake")
        session = form.get("RoleSessionName", "fake")
        body = (
            '<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult>'
            f"<Credentials><AccessKeyId>{key_id}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>"
            f"<SessionToken>{token}</SessionToken><Expiration>{expires}</Expiration></Credentials>"
            f"<AssumedRoleUser><AssumedRoleId>AROAFAKE:{session}</AssumedRoleId><Arn>{role}/{session}</Arn>"
            "</AssumedRoleUser></AssumeRoleResult><ResponseMetadata><RequestId>fake-sts</RequestId>"
            "</ResponseMetadata></AssumeRoleResponse>"
        )
        return Response(body.encode(), headers={"content-type": "text/xml"})

    # ---- fault modes and cloud platforms -------------------------------------------------------

    @property
    def platform_requests(self) -> list[RecordedRequest]:
        """Only the Bedrock (`/model/...`) and Vertex (`/projects/...`) message requests (not
        Vertex's token counting: `count_tokens_requests`)."""
        return [
            r
            for r in self.requests
            if r.path.startswith(("/model/", "/projects/")) and not _vertex_counting(r.path)
        ]

    @property
    def count_tokens_requests(self) -> list[RecordedRequest]:
        """Only the token-counting requests, the Claude API's and Vertex's."""
        return [r for r in self.requests if r.path == "/v1/messages/count_tokens" or _vertex_counting(r.path)]

    def _fault_response(
        self, reply: GarbageStreamReply | TruncatedStreamReply, body: JSONObject, streaming: bool
    ) -> Response:
        """Server-sent events that go wrong half-way (see the reply types)."""
        request_id = f"req_fake_{self._next_number():06d}"
        if not streaming:
            headers = {"content-type": "application/json", "request-id": request_id}
            garbage = reply.garbage if isinstance(reply, GarbageStreamReply) else '{"id": "msg_'
            return _ScriptedResponse(
                self, 200, headers, [garbage.encode()], abort=isinstance(reply, TruncatedStreamReply)
            )
        return self._sse_response(
            self._fault_frames(reply, body),
            abort=isinstance(reply, TruncatedStreamReply) and reply.abrupt,
        )

    def _fault_frames(
        self, reply: GarbageStreamReply | TruncatedStreamReply, body: JSONObject
    ) -> list[bytes]:
        message_json = self._message_json(MessageReply(content=[], stop_reason=None), body)
        parts = _stream_head(message_json)
        if reply.partial_text:
            parts += _block_start_events(0, {"type": "text", "text": reply.partial_text}, 3)
        if isinstance(reply, GarbageStreamReply):
            parts.append(f"event: content_block_delta\ndata: {reply.garbage}\n\n".encode())
        return parts

    async def _bedrock(self, request: Request) -> Response:
        streaming = request.url.path.endswith("/invoke-with-response-stream")
        return await self._platform(request, request.path_params["model"], streaming, bedrock=True)

    async def _vertex(self, request: Request) -> Response:
        model, _, method = request.path_params["call"].partition(":")
        if model == VERTEX_COUNT_TOKENS and method == "rawPredict":  # the model is in the body
            recorded, parsed = await self._record(request)
            return self._counted(recorded, parsed)
        if method not in ("rawPredict", "streamRawPredict"):
            return await self._not_found(request)
        return await self._platform(request, model, method == "streamRawPredict", bedrock=False)

    async def _platform(self, request: Request, model: str, streaming: bool, *, bedrock: bool) -> Response:
        """Bedrock / Vertex: the model is in the URL, `anthropic_version` in the body; the reply is
        the first-party one, framed as AWS event-stream messages on Bedrock."""
        recorded, parsed = await self._record(request)
        problem = None if bedrock and _sigv4_signed(recorded) else self._auth_problem(recorded)
        if problem is not None:
            return problem
        if not isinstance(parsed, dict):
            return self._error(400, "invalid_request_error", "Invalid JSON in request body")
        if "model" in parsed:
            return self._error(400, "invalid_request_error", "model: Extra inputs are not permitted")
        version = parsed.get("anthropic_version")
        if not isinstance(version, str):
            return self._error(400, "invalid_request_error", "anthropic_version: Field required")
        body = {**{k: v for k, v in parsed.items() if k != "anthropic_version"}, "model": model}
        if self.validate:
            message = validate_request(body, {**recorded.headers, "anthropic-version": version})
            if message is not None:
                return self._error(400, "invalid_request_error", message)
        reply = self._take_reply(
            RecordedRequest(recorded.method, recorded.path, recorded.headers, body, recorded.raw_body)
        )
        if isinstance(reply, ErrorReply):
            return self._error_reply(reply, recorded)
        if isinstance(reply, RawReply):  # scripted bytes, as on the Claude API's path
            return self._raw_response(reply)
        if not bedrock or not streaming:
            return self._platform_sse_or_json(reply, body, streaming)
        request_id = f"req_fake_{self._next_number():06d}"
        headers = {
            "content-type": "application/vnd.amazon.eventstream",
            "x-amzn-requestid": request_id,
            "request-id": request_id,
        }
        if isinstance(reply, MessageReply):
            frames = stream_frames(self._message_json(reply, body), reply.chunks)
            chunks = [bedrock_chunk(frame) for frame in frames]
            return _ScriptedResponse(
                self, 200, headers, chunks, delay=reply.delay, part_delay=reply.event_delay
            )
        head = _stream_head(self._message_json(MessageReply(content=[], stop_reason=None), body))
        partial = getattr(reply, "partial_text", "")
        if partial:
            head += _block_start_events(0, {"type": "text", "text": partial}, 3)
        chunks = [bedrock_chunk(frame) for frame in head]
        if isinstance(reply, StreamErrorReply):
            chunks.append(bedrock_exception("modelStreamErrorException", reply.message))
        elif isinstance(reply, GarbageStreamReply):
            payload = json.dumps({"bytes": base64.b64encode(reply.garbage.encode()).decode()}).encode()
            event = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
            chunks.append(eventstream_message(event, payload))
        abort = isinstance(reply, TruncatedStreamReply) and reply.abrupt
        return _ScriptedResponse(self, 200, headers, chunks, hang=isinstance(reply, HangReply), abort=abort)

    def _raw_response(self, reply: RawReply) -> Response:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "request-id": f"req_fake_{self._next_number():06d}",
            **reply.headers,
        }
        return _ScriptedResponse(
            self,
            reply.status,
            headers,
            list(reply.parts),
            abort=reply.abort,
            hang=reply.hang,
            part_delay=reply.part_delay,
        )

    def _platform_sse_or_json(self, reply: Reply, body: JSONObject, streaming: bool) -> Response:
        """Vertex streams exactly like the Claude API; non-streaming calls get the message JSON."""
        if isinstance(reply, GarbageStreamReply | TruncatedStreamReply):
            return self._fault_response(reply, body, streaming)
        if isinstance(reply, MessageReply):
            message_json = self._message_json(reply, body)
            if streaming:
                return self._sse_response(
                    stream_frames(message_json, reply.chunks),
                    reply.headers,
                    delay=reply.delay,
                    part_delay=reply.event_delay,
                )
            headers = {
                "content-type": "application/json",
                "request-id": f"req_fake_{self._next_number():06d}",
            }
            return _ScriptedResponse(self, 200, headers, [json.dumps(message_json).encode()])
        message_json = self._message_json(MessageReply(content=[], stop_reason=None), body)
        parts = _stream_head(message_json)
        partial = getattr(reply, "partial_text", "")
        if partial:
            parts += _block_start_events(0, {"type": "text", "text": partial}, 3)
        if isinstance(reply, StreamErrorReply):
            error = {"type": "error", "error": {"type": reply.error_type, "message": reply.message}}
            parts.append(_sse("error", error))
        return self._sse_response(parts, hang=isinstance(reply, HangReply))
