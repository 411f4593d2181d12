"""Per-request limits on what a server may ask the proxy to spend, checked before any API call.

`check_request` runs on the raw params before validation and conversion, so a huge request is
refused before the proxy does any real work on it (and before a single token is spent); it is
written defensively because the params are not validated yet. `check_response` looks at Claude's
answer before it goes back to the server. Both raise `SamplingError`s whose message names the
limit and the option (and environment variable) that raises it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_backfill.errors import SamplingError, internal_error, invalid_params
from mcp_backfill.jsonrpc import compact_text
from mcp_backfill.options import env_var
from mcp_backfill.sampling.media import decoded_size
from mcp_backfill.sampling.validate import NESTED_BLOCK_TYPES, is_content_block

__all__ = [
    "RequestLimits",
    "RequestSize",
    "check_request",
    "check_response",
    "measure_request",
]

_BINARY_FIELDS = ("data", "blob")


@dataclass(frozen=True)
class RequestLimits:
    """The operator's limits for one sampling request (built from `Config` by `assembly`)."""

    max_messages: int
    max_text_bytes: int
    """UTF-8 bytes of all but binary data: system prompt, texts, tool inputs and results, tool definitions."""
    max_binary_bytes: int
    """Decoded bytes of image, audio and embedded-resource data."""
    max_tools: int
    max_tool_calls: int
    """tool_use blocks in one Claude response."""
    max_content_blocks: int = 10_000
    """Content blocks of all messages, those inside tool results included."""


@dataclass(frozen=True)
class RequestSize:
    """What a request weighs, in the units of `RequestLimits`."""

    messages: int
    text_bytes: int
    binary_bytes: int
    tools: int
    blocks: int = 0


def measure_request(params: Any, max_blocks: int | None = None) -> RequestSize:
    """Count messages, text bytes, binary bytes, tools and content blocks; parts of the wrong shape
    are skipped. Past `max_blocks` blocks it stops, with `blocks` one over it."""
    if not isinstance(params, Mapping):
        return RequestSize(0, 0, 0, 0)
    messages = params.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = params.get("tools")
    tools = tools if isinstance(tools, list) else []
    tally = _Tally(max_blocks)
    system = params.get("systemPrompt")
    if isinstance(system, str):
        tally.text(system)
    for tool in tools:
        tally.json(tool)
    try:
        for message in messages:
            if isinstance(message, Mapping):
                tally.content(message.get("content"))
    except _TooManyBlocks:
        pass
    stops = params.get("stopSequences")
    for stop in stops if isinstance(stops, list) else []:
        if isinstance(stop, str):
            tally.text(stop)
    return RequestSize(len(messages), tally.text_bytes, tally.binary_bytes, len(tools), tally.blocks)


def check_request(params: Any, limits: RequestLimits) -> RequestSize:
    """Refuse (-32602) a request above any limit; returns its size for logging."""
    if isinstance(params, Mapping):  # counted before anything is measured: no work on a huge list
        for key, limit, option in (
            ("messages", limits.max_messages, "--max-messages"),
            ("tools", limits.max_tools, "--max-tools"),
        ):
            items = params.get(key)
            if isinstance(items, list):
                _at_most(key, len(items), limit, option, key)
    try:
        # Blocks are counted as they are measured, and measuring stops past the limit: a million
        # tiny blocks within --max-message-bytes cost seconds of the event loop to measure and convert.
        size = measure_request(params, limits.max_content_blocks)
    except RecursionError:  # JSON nested deeper than Python's stack (the decoder takes 1,024 levels)
        raise invalid_params("Sampling request is nested too deeply to measure") from None
    _at_most("messages", size.messages, limits.max_messages, "--max-messages", "messages")
    _at_most("tools", size.tools, limits.max_tools, "--max-tools", "tools")
    if size.blocks > limits.max_content_blocks:
        raise _limit_error(
            invalid_params,
            "Sampling request exceeds the limit on content blocks: it has more than "
            f"{limits.max_content_blocks} (those inside tool results included)",
            "max_content_blocks",
            "--max-content-blocks",
            limits.max_content_blocks,
            size.blocks,
        )
    _at_most("text bytes", size.text_bytes, limits.max_text_bytes, "--max-text-bytes", "bytes of text")
    _at_most(
        "binary bytes",
        size.binary_bytes,
        limits.max_binary_bytes,
        "--max-binary-bytes",
        "bytes of decoded image/audio/document data",
    )
    return size


def check_response(message: Mapping[str, Any], limits: RequestLimits) -> None:
    """Refuse (-32603) an answer from Claude that asks the server to run too many tools at once."""
    content = message.get("content")
    blocks: Iterable[Any] = content if isinstance(content, list) else ()
    calls = sum(1 for block in blocks if isinstance(block, Mapping) and block.get("type") == "tool_use")
    if calls > limits.max_tool_calls:
        raise _limit_error(
            internal_error,
            f"Claude's response has {calls} tool calls, more than the limit of {limits.max_tool_calls} "
            "tool calls per response",
            "max_tool_calls",
            "--max-tool-calls",
            limits.max_tool_calls,
            calls,
        )


def _at_most(label: str, actual: int, limit: int, option: str, unit: str) -> None:
    if actual > limit:
        raise _limit_error(
            invalid_params,
            f"Sampling request exceeds the limit on {label}: it has {actual} {unit}, the limit is {limit}",
            option.lstrip("-").replace("-", "_"),
            option,
            limit,
            actual,
        )


def _limit_error(
    make: Callable[..., SamplingError], message: str, name: str, option: str, limit: int, actual: int
) -> SamplingError:
    return make(
        f"{message}; raise it with {option} (or {env_var(option)})",
        limit=name,
        option=option,
        max=limit,
        actual=actual,
    )


class _TooManyBlocks(Exception):
    """More content blocks than the tally counts (`_Tally.max_blocks`)."""


class _Tally:
    """Accumulates text and binary sizes, and counts blocks, over arbitrarily nested content."""

    def __init__(self, max_blocks: int | None = None) -> None:
        self.text_bytes = 0
        self.binary_bytes = 0
        self.blocks = 0
        self.max_blocks = max_blocks

    def text(self, value: str) -> None:
        self.text_bytes += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))

    def json(self, value: Any) -> None:
        self.text(compact_text(value))

    def binary(self, data: str) -> None:
        self.binary_bytes += decoded_size(data)

    def content(self, content: Any) -> None:
        """One content block, a list of blocks, or (draft tool results) any JSON value."""
        if isinstance(content, list):
            for item in content:
                self.content(item)
        elif isinstance(content, Mapping):
            self.block(content)
        elif isinstance(content, str):
            self.text(content)
        elif content is not None:
            self.json(content)

    def block(self, block: Mapping[str, Any]) -> None:
        self.blocks += 1
        if self.max_blocks is not None and self.blocks > self.max_blocks:
            raise _TooManyBlocks
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            self.text(block["text"])
        elif kind in ("image", "audio") and isinstance(block.get("data"), str):
            self.binary(block["data"])
        elif kind == "tool_use":  # its id and name go to Claude as they are too
            self.json(block.get("input"))
            self.text(str(block.get("id", "")))
            self.text(str(block.get("name", "")))
        elif kind == "tool_result":
            self.text(str(block.get("toolUseId", "")))
            content = block.get("content")
            if isinstance(content, Mapping) and not is_content_block(content, NESTED_BLOCK_TYPES):
                self.json(content)  # a draft's object that is no block goes to Claude as JSON text
            else:
                self.content(content)
            if block.get("structuredContent") is not None:
                self.json(block["structuredContent"])
        elif kind == "resource" and isinstance(block.get("resource"), Mapping):
            resource = block["resource"]
            for field in _BINARY_FIELDS:
                if isinstance(resource.get(field), str):
                    self.binary(resource[field])
            if isinstance(resource.get("text"), str):
                self.text(resource["text"])
        else:  # a block of no type converted to binary: it goes to Claude as JSON text
            self.json(block)
