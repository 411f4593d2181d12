"""Pure conversion between MCP `sampling/createMessage` (wire JSON) and the Claude Messages API.

`to_claude_request` turns validated MCP params into `messages.create` keyword arguments plus the
per-request context needed to translate the answer back; `to_mcp_result` turns Claude's final
message into a `CreateMessageResult`. No I/O and no SDK types: both sides are plain JSON dicts, so
every rule here is unit-testable and the provider stays backend-agnostic. The README's "Sampling →
Claude mapping" section describes the mapping.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_backfill.errors import internal_error, invalid_params
from mcp_backfill.options import AudioPolicy
from mcp_backfill.sampling.media import decoded_size, strip_data_url
from mcp_backfill.sampling.validate import (
    NESTED_BLOCK_TYPES,
    ToolChoice,
    as_block_list,
    block_path,
    is_content_block,
    read_tool_choice,
    shown_name,
    validate_params,
)

__all__ = [
    "CACHE_CONTROL",
    "MAX_CACHE_BREAKPOINTS",
    "META_KEY",
    "AudioPolicy",
    "ClaudeRequest",
    "ConversionOptions",
    "map_stop_reason",
    "sanitize_tool_id",
    "sanitize_tool_name",
    "sniff_image_type",
    "to_claude_request",
    "to_mcp_result",
]

META_KEY = "io.github.mcp-backfill/claude"
"""The result `_meta` key under which Claude's own bookkeeping (id, usage, raw stop reason…) travels."""

SUPPORTED_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# The Messages API refuses larger images and more of them (400): refused here before any call.
# The size limit is on the base64 string as sent, not on the image's decoded bytes.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGES = 100
_IMAGE_ALIASES: Mapping[str, str] = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-png": "image/png",
}
_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_TEXT_LIKE_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/javascript",
    }
)

_STOP_REASONS: Mapping[str, str] = {
    "end_turn": "endTurn",
    "stop_sequence": "stopSequence",
    "max_tokens": "maxTokens",
    "tool_use": "toolUse",
    "refusal": "refusal",
    "model_context_window_exceeded": "maxTokens",
    "pause_turn": "pauseTurn",
}

_TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_TOOL_ID_RE = re.compile(r"[a-zA-Z0-9_-]+")
_UNSAFE_CHARS_RE = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_TOOL_NAME = 128
_HASH_SUFFIX = 9  # "_" + 8 hex digits

CACHE_CONTROL: Mapping[str, str] = {"type": "ephemeral"}
MAX_CACHE_BREAKPOINTS = 4
"""Claude refuses a request with more blocks marked `cache_control` than this."""

_PLACEHOLDER_TOOL_DESCRIPTION = (
    "A tool used earlier in this conversation; it is not available in this request."
)


@dataclass(frozen=True)
class ConversionOptions:
    """Operator policy that shapes conversion (built from `Config` by `assembly`)."""

    max_tokens_cap: int
    audio: AudioPolicy
    prompt_cache: bool
    """Mark prompt-cache breakpoints (`cache_control`) so a tool loop's rounds reuse each other's prefix."""


@dataclass(frozen=True)
class ClaudeRequest:
    """A Messages API request plus what is needed to translate its answer back to MCP."""

    kwargs: dict[str, Any]
    """`messages.create` keyword arguments without `model`."""
    tool_names: dict[str, str]
    """Claude-side tool name -> original MCP name, for the names that had to be rewritten."""
    tool_ids: dict[str, str]
    """Claude-side tool_use id -> original MCP id, for the ids that had to be rewritten."""
    has_tools: bool
    """The request carried `tools`/`toolChoice`, so the result may hold an array and tool_use blocks."""
    warnings: tuple[str, ...]
    """Parts of the request that could not be honoured; reported in the result `_meta`."""
    placeholders: frozenset[str] = frozenset()
    """Claude-side names of the placeholder tools (named by the history, not offered): Claude's
    answer must not call them."""


@dataclass
class _Context:
    """Per-call state threaded through block conversion (never shared between calls)."""

    names: Mapping[str, str]
    ids: Mapping[str, str]
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# MCP -> Claude
# ---------------------------------------------------------------------------------------------


def to_claude_request(params: dict[str, Any], options: ConversionOptions) -> ClaudeRequest:
    """Validate MCP params, then build the Messages API request (see anthropic.md §6.1)."""
    validate_params(params, audio=options.audio)
    tools_in: list[dict[str, Any]] = params.get("tools") or []
    choice = read_tool_choice(params)
    history_names, history_ids = _history_tool_refs(params["messages"])
    name_map = _rewrite_map(
        [tool["name"] for tool in tools_in] + history_names, sanitize_tool_name, _TOOL_NAME_RE
    )
    id_map = _rewrite_map(history_ids, sanitize_tool_id, _TOOL_ID_RE)
    ctx = _Context(names=name_map, ids=id_map)

    kwargs: dict[str, Any] = {
        "max_tokens": _max_tokens(int(params["maxTokens"]), options.max_tokens_cap, ctx.warnings),
        "messages": _check_image_count(_convert_messages(params["messages"], ctx)),
    }
    system = params.get("systemPrompt")
    if isinstance(system, str) and system.strip():
        kwargs["system"] = system
    kwargs.update(_tools_kwargs(tools_in, choice, history_names, name_map))
    stops = _stop_sequences(params.get("stopSequences") or [], ctx.warnings)
    if stops:
        kwargs["stop_sequences"] = stops
    metadata = _metadata(params.get("metadata"), ctx.warnings)
    if metadata:
        kwargs["metadata"] = metadata
    ctx.warnings.extend(_ignored_param_warnings(params))
    if options.prompt_cache:
        _mark_cache_breakpoints(kwargs)

    return ClaudeRequest(
        kwargs=kwargs,
        tool_names={claude: mcp for mcp, claude in name_map.items() if claude != mcp},
        tool_ids={claude: mcp for mcp, claude in id_map.items() if claude != mcp},
        has_tools=params.get("tools") is not None or choice is not None,
        warnings=tuple(ctx.warnings),
        placeholders=frozenset(name_map[name] for name in _unoffered(tools_in, history_names)),
    )


def _mark_cache_breakpoints(kwargs: dict[str, Any]) -> None:
    """Place prompt-cache breakpoints so that each round of a tool loop reads the previous one's prefix.

    Claude caches the prompt (tools, then system, then messages) up to each marked block. Marks:
    the last tool (tools rarely change), the system prompt, the last block of the final message
    (this round's whole prompt, read back by the next round), and the last block of the message
    before the latest assistant turn: that is where the previous round's prompt ended, so its
    prefix is read back even when this round appended more blocks than Claude looks back over.
    """
    tools = kwargs.get("tools")
    if tools:
        tools[-1] = {**tools[-1], "cache_control": dict(CACHE_CONTROL)}
    system = kwargs.get("system")
    if isinstance(system, str):
        kwargs["system"] = [{"type": "text", "text": system, "cache_control": dict(CACHE_CONTROL)}]
    messages: list[dict[str, Any]] = kwargs["messages"]
    final = len(messages) - 1
    marked = [final]
    assistant_turns = [i for i in range(final) if messages[i]["role"] == "assistant"]
    if assistant_turns and assistant_turns[-1] > 0:
        marked.insert(0, assistant_turns[-1] - 1)
    for index in marked:
        content = list(messages[index]["content"])
        content[-1] = {**content[-1], "cache_control": dict(CACHE_CONTROL)}
        messages[index] = {**messages[index], "content": content}


def sanitize_tool_name(name: str, attempt: int = 0) -> str:
    """A Claude-legal tool name (`^[a-zA-Z0-9_-]{1,128}$`) derived deterministically from `name`.

    The hash of the original keeps distinct names distinct after replacing characters; `attempt`
    only changes the hash, to step around a (vanishingly unlikely) collision.
    """
    if attempt == 0 and _TOOL_NAME_RE.fullmatch(name):
        return name
    base = _UNSAFE_CHARS_RE.sub("_", name)[: _MAX_TOOL_NAME - _HASH_SUFFIX]
    return f"{base}_{_short_hash(name, attempt)}"


def sanitize_tool_id(tool_use_id: str, attempt: int = 0) -> str:
    """A Claude-legal tool_use id (`^[a-zA-Z0-9_-]+$`); the same function maps tool_result ids."""
    if attempt == 0 and _TOOL_ID_RE.fullmatch(tool_use_id):
        return tool_use_id
    return f"{_UNSAFE_CHARS_RE.sub('_', tool_use_id)}_{_short_hash(tool_use_id, attempt)}"


def _short_hash(value: str, attempt: int) -> str:
    salted = value if attempt == 0 else f"{value}\x00{attempt}"
    # A lone surrogate (legal in JSON as an escape) has no UTF-8 form; hash its code point as it is.
    return hashlib.sha256(salted.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _rewrite_map(
    values: Iterable[str], sanitize: Callable[[str, int], str], legal: re.Pattern[str]
) -> dict[str, str]:
    """original -> Claude-side value. Legal values keep their spelling and are reserved first."""
    ordered = list(dict.fromkeys(values))
    mapping = {value: value for value in ordered if legal.fullmatch(value)}
    taken = set(mapping.values())
    for value in ordered:
        if value in mapping:
            continue
        attempt = 0
        candidate = sanitize(value, attempt)
        while candidate in taken:
            attempt += 1
            candidate = sanitize(value, attempt)
        mapping[value] = candidate
        taken.add(candidate)
    return mapping


def _history_tool_refs(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """Tool names and tool_use ids used in the conversation so far, in order of appearance."""
    names: list[str] = []
    ids: list[str] = []
    for message in messages:
        for block in as_block_list(message["content"]):
            if block["type"] == "tool_use":
                names.append(block["name"])
                ids.append(block["id"])
    return names, ids


def _max_tokens(requested: int, cap: int, warnings: list[str]) -> int:
    if requested > cap:
        warnings.append(f"maxTokens {requested} clamped to {cap}")
        return cap
    return requested


def _stop_sequences(stops: Sequence[str], warnings: list[str]) -> list[str]:
    """The API refuses empty and whitespace-only stop sequences (400): dropped, the latter reported."""
    for index, stop in enumerate(stops):
        if stop and not stop.strip():
            warnings.append(
                f"stopSequences[{index}] {json.dumps(stop)} ignored: "
                "Claude refuses whitespace-only stop sequences"
            )
    return [stop for stop in stops if stop.strip()]


def _tools_kwargs(
    tools_in: Sequence[Mapping[str, Any]],
    choice: ToolChoice | None,
    history_names: Sequence[str],
    name_map: Mapping[str, str],
) -> dict[str, Any]:
    """`tools` and `tool_choice`, including placeholder definitions for tools only the history names.

    The API refuses tool_use/tool_result blocks whose tools are not defined, so a history that
    mentions tools the request no longer offers gets inert definitions for them.
    """
    tools = [_convert_tool(tool, name_map) for tool in tools_in]
    placeholders = [_placeholder_tool(name_map[name]) for name in _unoffered(tools_in, history_names)]
    tools.extend(placeholders)
    if not tools:
        return {}
    if not tools_in:
        return {"tools": tools, "tool_choice": {"type": "none"}}
    tool_choice = _convert_tool_choice(choice)
    if tool_choice is not None and tool_choice["type"] == "any" and placeholders and len(tools_in) == 1:
        # `any` may pick a placeholder, an answer refused once charged (`_check_offered`): with one
        # tool offered, "a tool must be called" is that tool. Among several, `any` is all there is.
        tool_choice = {**tool_choice, "type": "tool", "name": tools[0]["name"]}
    return {"tools": tools, "tool_choice": tool_choice} if tool_choice else {"tools": tools}


def _unoffered(tools_in: Sequence[Mapping[str, Any]], history_names: Sequence[str]) -> list[str]:
    """The tools the history names that the request does not offer (they get placeholders)."""
    offered = {tool["name"] for tool in tools_in}
    return [name for name in dict.fromkeys(history_names) if name not in offered]


def _convert_tool(tool: Mapping[str, Any], name_map: Mapping[str, str]) -> dict[str, Any]:
    """MCP Tool -> Claude custom tool. outputSchema, annotations, icons and execution have no equivalent."""
    converted: dict[str, Any] = {"name": name_map[tool["name"]]}
    description = _tool_description(tool)
    if description:
        converted["description"] = description
    schema = dict(tool.get("inputSchema") or {})
    schema.setdefault("type", "object")
    converted["input_schema"] = schema
    return converted


def _tool_description(tool: Mapping[str, Any]) -> str | None:
    annotations = tool.get("annotations")
    annotation_title = annotations.get("title") if isinstance(annotations, Mapping) else None
    for candidate in (tool.get("description"), tool.get("title"), annotation_title):
        if isinstance(candidate, str) and candidate.strip():
            return candidate
    return None


def _placeholder_tool(claude_name: str) -> dict[str, Any]:
    return {
        "name": claude_name,
        "description": _PLACEHOLDER_TOOL_DESCRIPTION,
        "input_schema": {"type": "object"},
    }


def _convert_tool_choice(choice: ToolChoice | None) -> dict[str, Any] | None:
    """auto -> omitted (the API default), required -> any, none -> none (tools are kept)."""
    if choice is None:
        return None
    if choice.mode == "none":
        return {"type": "none"}
    if choice.mode == "auto" and not choice.disable_parallel_tool_use:
        return None
    converted: dict[str, Any] = {"type": "any" if choice.mode == "required" else "auto"}
    if choice.disable_parallel_tool_use:
        converted["disable_parallel_tool_use"] = True
    return converted


def _metadata(metadata: Any, warnings: list[str]) -> dict[str, str]:
    """Only `user_id` is forwarded: a server must not be able to set any other API parameter. What
    is dropped is warned of, a value by its kind only (a user id is nobody else's business)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        warnings.append(f"metadata ignored: {_json_kind(metadata)}, not an object")
        return {}
    key = "user_id" if "user_id" in metadata else "userId"
    user_id = metadata.get(key)
    forwarded = {"user_id": user_id} if isinstance(user_id, str) and user_id else {}
    if user_id == "":
        warnings.append(f"metadata.{key} ignored: an empty string")
    elif user_id is not None and not forwarded:  # Claude takes a string only
        warnings.append(f"metadata.{key} ignored: {_json_kind(user_id)}, not a string")
    dropped = sorted(str(other) for other in metadata if other != key)  # `userId` too, beside `user_id`
    if dropped:
        warnings.append(f"metadata keys ignored: {', '.join(dropped)}")
    return forwarded


def _json_kind(value: Any) -> str:
    """`a number`, `an array`...: what a JSON value is, never what it says."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, Mapping) else "null" if value is None else "a value"


def _ignored_param_warnings(params: Mapping[str, Any]) -> list[str]:
    warnings: list[str] = []
    if params.get("temperature") is not None:
        warnings.append(
            f"temperature ignored: the Claude Messages API does not accept it (got {params['temperature']})"
        )
    include_context = params.get("includeContext")
    if include_context is not None and include_context != "none":
        warnings.append(f"includeContext ignored: {include_context!r} is not supported by mcp-backfill")
    return warnings


# --- messages ---------------------------------------------------------------------------------


def _convert_messages(messages: Sequence[Mapping[str, Any]], ctx: _Context) -> list[dict[str, Any]]:
    """Convert, drop what became empty, merge same-role neighbours, tidy a final prefill."""
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        single = isinstance(message["content"], Mapping)
        blocks = []
        for block_index, block in enumerate(as_block_list(message["content"])):
            claude_block = _convert_block(block, block_path(index, block_index, single), ctx)
            if claude_block is not None:
                blocks.append(claude_block)
        if blocks:
            _append_merged(converted, message["role"], blocks)
    _strip_prefill(converted)
    if not converted:
        raise invalid_params(
            "messages: nothing left to send once empty text blocks and empty messages are dropped",
            path="messages",
        )
    return converted


def _append_merged(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Merge into the previous message when roles repeat; tool_results stay first in a user turn."""
    if not messages or messages[-1]["role"] != role:
        messages.append({"role": role, "content": blocks})
        return
    combined = [*messages[-1]["content"], *blocks]
    if role == "user":
        combined = [b for b in combined if b["type"] == "tool_result"] + [
            b for b in combined if b["type"] != "tool_result"
        ]
    messages[-1] = {"role": role, "content": combined}


def _strip_prefill(messages: list[dict[str, Any]]) -> None:
    """The API rejects a final assistant turn that ends in whitespace.

    Whitespace-only text blocks are already gone, so stripping never empties a block.
    """
    if not messages or messages[-1]["role"] != "assistant":
        return
    content = list(messages[-1]["content"])
    for index in range(len(content) - 1, -1, -1):
        if content[index]["type"] == "text":
            content[index] = {**content[index], "text": content[index]["text"].rstrip()}
            break
    messages[-1] = {"role": "assistant", "content": content}


def _convert_block(block: Mapping[str, Any], where: str, ctx: _Context) -> dict[str, Any] | None:
    kind = block["type"]
    if kind == "text":
        return _text_block(block["text"])
    if kind == "image":
        return _image_block(block["data"], block["mimeType"], where, ctx, strict=True)
    if kind == "audio":
        # Validation already rejected audio unless the placeholder policy is on.
        ctx.warnings.append(f"{where}: audio replaced by a text placeholder")
        return _text_block(_audio_placeholder(block["data"], block["mimeType"]))
    if kind == "tool_use":
        tool_input = block.get("input")
        return {
            "type": "tool_use",
            "id": ctx.ids[block["id"]],
            "name": ctx.names[block["name"]],
            "input": dict(tool_input) if isinstance(tool_input, Mapping) else {},
        }
    return _tool_result_block(block, where, ctx)


def _text_block(text: str) -> dict[str, Any] | None:
    """The API rejects empty and whitespace-only text blocks, so they are dropped."""
    return {"type": "text", "text": text} if text.strip() else None


def _json_text(value: Any) -> dict[str, Any]:
    return {"type": "text", "text": json.dumps(value, ensure_ascii=False)}


def _audio_placeholder(data: str, mime_type: str) -> str:
    return f"[audio omitted: {mime_type}, ~{decoded_size(data)} bytes]"


# --- images -----------------------------------------------------------------------------------


def sniff_image_type(data: str) -> str | None:
    """The real image type from the magic bytes: the API rejects a media_type that does not match."""
    head = _decode_head(data)
    if head is None:
        return None
    for magic, mime_type in _IMAGE_MAGIC:
        if head.startswith(magic):
            return mime_type
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _decode_head(data: str, chars: int = 24) -> bytes | None:
    """The first bytes of base64 data (enough for magic numbers) without decoding all of it."""
    compact = "".join(data[: chars * 4].split())[:chars]
    compact = compact[: len(compact) - len(compact) % 4]
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return None


def _normalise_mime(mime_type: str) -> str:
    base = mime_type.split(";", 1)[0].strip().lower()
    return _IMAGE_ALIASES.get(base, base)


def _image_block(
    data: str, mime_type: str, where: str, ctx: _Context, *, strict: bool
) -> dict[str, Any] | None:
    """An image, its media type read from the bytes; what Claude cannot take fails (strict) or degrades.

    Top-level images come from the server itself, so an image Claude cannot take is its error
    (-32602); inside a tool result the server merely relays a tool's output, so a placeholder is kinder.
    """
    data = strip_data_url(data)
    sniffed = sniff_image_type(data)
    if sniffed is None:
        return _unsendable_image(
            f"{_not_an_image(data, mime_type)}; Claude accepts {', '.join(SUPPORTED_IMAGE_TYPES)}",
            f"[image omitted: {mime_type}, ~{decoded_size(data)} bytes, not an image Claude can read]",
            where,
            ctx,
            strict=strict,
        )
    if sniffed != _normalise_mime(mime_type):
        ctx.warnings.append(
            f"{where}: image declared as {shown_name(mime_type)} is {sniffed}; sent as {sniffed}"
        )
    if len(data) > MAX_IMAGE_BYTES:
        return _unsendable_image(
            f"the image's base64 data is {len(data)} bytes; Claude accepts images of at most 5 MB "
            f"({MAX_IMAGE_BYTES} bytes) of base64",
            f"[image omitted: {sniffed}, ~{decoded_size(data)} bytes, over Claude's 5 MB limit]",
            where,
            ctx,
            strict=strict,
        )
    return {"type": "image", "source": {"type": "base64", "media_type": sniffed, "data": data}}


def _not_an_image(data: str, mime_type: str) -> str:
    """Why data whose bytes match none of Claude's image types cannot be sent."""
    if not data.strip():
        return "the image data is empty"
    if _decode_head(data) is None:
        return "the image data is not base64"
    declared = _normalise_mime(mime_type)
    if declared in SUPPORTED_IMAGE_TYPES:
        return f"the image data is not a valid {declared} (its bytes match no image type Claude reads)"
    return f"unsupported image type {shown_name(mime_type)}"


def _unsendable_image(
    problem: str, placeholder: str, where: str, ctx: _Context, *, strict: bool
) -> dict[str, Any] | None:
    """-32602 for the server's own image (strict), else a text placeholder and a warning saying why."""
    if strict:
        raise invalid_params(f"{where}: {problem}", path=where)
    ctx.warnings.append(f"{where}: {problem}; replaced by a text placeholder")
    return _text_block(placeholder)


def _check_image_count(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    count = sum(_images_in(message.get("content")) for message in messages)
    if count > MAX_IMAGES:
        raise invalid_params(f"messages: {count} images; Claude accepts at most {MAX_IMAGES} in one request")
    return messages


def _images_in(value: Any) -> int:
    if isinstance(value, list):
        return sum(_images_in(item) for item in value)
    if isinstance(value, Mapping):
        return (1 if value.get("type") == "image" else 0) + _images_in(value.get("content"))
    return 0


# --- tool results -----------------------------------------------------------------------------


def _tool_result_block(block: Mapping[str, Any], where: str, ctx: _Context) -> dict[str, Any]:
    content = _tool_result_content(block.get("content"), f"{where}.content", ctx)
    structured = block.get("structuredContent")
    if structured is not None and not _has_json_text(content, structured):
        content.append(_json_text(structured))
    converted: dict[str, Any] = {"type": "tool_result", "tool_use_id": ctx.ids[block["toolUseId"]]}
    if content:
        converted["content"] = content
    if isinstance(block.get("isError"), bool):
        converted["is_error"] = block["isError"]
    return converted


def _tool_result_content(raw: Any, where: str, ctx: _Context) -> list[dict[str, Any]]:
    """Released shape: a list of blocks. Draft shapes: one block, or any JSON value."""
    if raw is None:
        return []
    if isinstance(raw, list):
        items = [_nested_block(item, f"{where}[{index}]", ctx) for index, item in enumerate(raw)]
        return [item for item in items if item is not None]
    if is_content_block(raw, NESTED_BLOCK_TYPES):
        item = _nested_block(raw, where, ctx)
        return [item] if item is not None else []
    if isinstance(raw, str):
        text = _text_block(raw)
        return [text] if text is not None else []
    return [_json_text(raw)]


def _has_json_text(content: Sequence[Mapping[str, Any]], value: Any) -> bool:
    """Tools SHOULD also serialise structuredContent as text; don't send it twice."""
    for block in content:
        if block["type"] != "text":
            continue
        try:
            if _same_json(json.loads(block["text"]), value):
                return True
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to compare
            continue
    return False


def _same_json(left: Any, right: Any) -> bool:
    """JSON equality: Python's `==` takes true for 1 and false for 0; numbers still compare by value."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, Mapping):
        return (
            isinstance(right, Mapping)
            and left.keys() == right.keys()
            and all(_same_json(item, right[key]) for key, item in left.items())
        )
    if isinstance(left, list):
        return isinstance(right, list) and len(left) == len(right) and all(map(_same_json, left, right))
    return bool(left == right)


def _nested_block(item: Mapping[str, Any], where: str, ctx: _Context) -> dict[str, Any] | None:
    kind = item["type"]
    if kind == "text":
        return _text_block(item["text"])
    if kind == "image":
        return _image_block(item["data"], item["mimeType"], where, ctx, strict=False)
    if kind == "audio":
        ctx.warnings.append(f"{where}: audio replaced by a text placeholder")
        return _text_block(_audio_placeholder(item["data"], item["mimeType"]))
    if kind == "resource_link":
        return _text_block(_resource_link_text(item))
    if kind == "resource":
        return _embedded_resource(item["resource"], where, ctx)
    return _json_text(item)


def _resource_link_text(link: Mapping[str, Any]) -> str:
    name = link.get("name") if isinstance(link.get("name"), str) else ""
    text = f"[resource link] {name} <{link['uri']}>" if name else f"[resource link] <{link['uri']}>"
    mime_type = link.get("mimeType")
    if isinstance(mime_type, str) and mime_type:
        text += f" ({mime_type})"
    description = link.get("description")
    if isinstance(description, str) and description.strip():
        text += f": {description}"
    return text


def _embedded_resource(resource: Mapping[str, Any], where: str, ctx: _Context) -> dict[str, Any] | None:
    """Text -> plain-text document, PDF -> PDF document, image -> image, decodable text -> document."""
    uri: str = resource["uri"]
    raw_mime = resource.get("mimeType")
    mime_type = _normalise_mime(raw_mime) if isinstance(raw_mime, str) else ""
    text = resource.get("text")
    if isinstance(text, str):
        return _text_document(text, uri)
    blob: str = resource["blob"]
    head = _decode_head(blob) or b""
    if mime_type == "application/pdf" or head.startswith(b"%PDF"):
        return {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": blob},
            "title": uri,
        }
    image_type = sniff_image_type(blob)
    if mime_type.startswith("image/") or image_type:
        declared = mime_type if mime_type.startswith("image/") else str(image_type)
        return _image_block(blob, declared, where, ctx, strict=False)
    if (
        mime_type.startswith("text/")
        or mime_type in _TEXT_LIKE_TYPES
        or mime_type.endswith(("+json", "+xml"))
    ):
        decoded = _decode_text(blob)
        if decoded is not None:
            return _text_document(decoded, uri)
    label = mime_type or "unknown type"
    kind = f"of type {shown_name(mime_type)}" if mime_type else "of no type"
    ctx.warnings.append(f"{where}: embedded resource {kind} replaced by a text placeholder")
    return _text_block(f"[embedded resource omitted: {uri} ({label}), ~{decoded_size(blob)} bytes]")


def _text_document(text: str, uri: str) -> dict[str, Any] | None:
    if not text.strip():
        return None
    return {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": text},
        "title": uri,
    }


def _decode_text(blob: str) -> str | None:
    try:
        return base64.b64decode("".join(blob.split()), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Claude -> MCP
# ---------------------------------------------------------------------------------------------


def map_stop_reason(stop_reason: str | None) -> str | None:
    """Claude's snake_case stop reasons -> MCP's camelCase; unknown values pass through (open union)."""
    if stop_reason is None:
        return None
    return _STOP_REASONS.get(stop_reason, stop_reason)


def to_mcp_result(
    message: dict[str, Any], request: ClaudeRequest, *, model: str | None = None
) -> dict[str, Any]:
    """Claude's final message -> `CreateMessageResult` (one block) or `…WithTools` (array)."""
    dropped: list[str] = []
    blocks: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            blocks.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use" and request.has_tools:
            _check_offered(block, request)
            blocks.append(_mcp_tool_use(block, request))
        elif str(kind) not in dropped:
            dropped.append(str(kind))

    result: dict[str, Any] = {
        "role": "assistant",
        "content": (blocks or [{"type": "text", "text": ""}]) if request.has_tools else _single_text(blocks),
        "model": model or message.get("model") or "unknown",
    }
    stop_reason = map_stop_reason(message.get("stop_reason"))
    if stop_reason is not None:
        result["stopReason"] = stop_reason
    result["_meta"] = {META_KEY: _claude_meta(message, request, dropped)}
    return result


def _single_text(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Servers that sent no tools only accept one content block: all text, joined."""
    return {"type": "text", "text": "".join(block["text"] for block in blocks if block["type"] == "text")}


def _check_offered(block: Mapping[str, Any], request: ClaudeRequest) -> None:
    """A call of a placeholder is refused: a tool_use MUST name a tool of the request's `tools`,
    and the server never offered this one here (nor shaped its arguments with a schema)."""
    name = block.get("name")
    if name not in request.placeholders:
        return
    mcp_name = request.tool_names.get(str(name), str(name))
    raise internal_error(
        f"Claude called the tool {shown_name(mcp_name)}, which this request does not offer (only an "
        "earlier turn of the conversation used it; it was given to Claude as unavailable, and the "
        "call was charged); offer the tool in `tools` to let Claude call it, or answer again",
        tool=mcp_name,
        reason="tool_not_offered",
    )


def _mcp_tool_use(block: Mapping[str, Any], request: ClaudeRequest) -> dict[str, Any]:
    name = str(block.get("name", ""))
    tool_use_id = str(block.get("id", ""))
    tool_input = block.get("input")
    return {
        "type": "tool_use",
        "id": request.tool_ids.get(tool_use_id, tool_use_id),
        "name": request.tool_names.get(name, name),
        "input": dict(tool_input) if isinstance(tool_input, Mapping) else {},
    }


def _claude_meta(
    message: Mapping[str, Any], request: ClaudeRequest, dropped: Sequence[str]
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": message.get("id"),
        "model": message.get("model"),
        "stop_reason": message.get("stop_reason"),
    }
    for key in ("stop_sequence", "stop_details"):
        if message.get(key) is not None:
            meta[key] = message[key]
    meta["usage"] = message.get("usage")
    if message.get("request_id") is not None:
        meta["request_id"] = message["request_id"]
    if request.warnings:
        meta["warnings"] = list(request.warnings)
    if dropped:
        meta["dropped_block_types"] = list(dropped)
    return meta
