"""Validation of raw `sampling/createMessage` params (wire JSON, camelCase) before any conversion.

Every rule raises `invalid_params` (-32602) with a message that names the offending field, so a
server author can fix the request without guessing, and so conversion can assume a sound shape.
Both the released 2025-11-25 shapes and the SEP-1577 draft shapes (`tool_choice`, object-shaped
tool results) are accepted here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from mcp_backfill.errors import SamplingError, invalid_params
from mcp_backfill.jsonrpc import ExactNumber
from mcp_backfill.options import AudioPolicy, env_var

MESSAGE_BLOCK_TYPES = frozenset({"text", "image", "audio", "tool_use", "tool_result"})
"""Block types allowed directly in a sampling message."""

NESTED_BLOCK_TYPES = frozenset({"text", "image", "audio", "resource_link", "resource"})
"""Block types allowed inside `tool_result.content` (MCP `ContentBlock`)."""

SCHEMA_COMBINATORS = ("anyOf", "oneOf", "allOf")
"""JSON Schema keywords Claude refuses at the top level of a tool's `input_schema` (400)."""

TOOL_CHOICE_MODES = ("auto", "required", "none")
_DRAFT_CHOICE_TYPES: Mapping[str, str] = {"auto": "auto", "any": "required", "none": "none"}


@dataclass(frozen=True)
class ToolChoice:
    """The tool choice of a request, whichever of the released or draft spellings it came in."""

    mode: str
    disable_parallel_tool_use: bool = False


def as_block_list(content: Any) -> list[Any]:
    """Content may be one block or an array of blocks; callers always want the array."""
    if isinstance(content, list):
        return content
    return [content]


def block_path(message_index: int, block_index: int, single: bool) -> str:
    """Where a block lives, spelled the way the server wrote it (single object or array)."""
    if single:
        return f"messages[{message_index}].content"
    return f"messages[{message_index}].content[{block_index}]"


def validate_params(params: Any, *, audio: AudioPolicy = "reject") -> None:
    """Reject a request Claude could not answer, or that breaks the MCP sampling rules."""
    if not isinstance(params, Mapping):
        raise invalid_params(f"params must be an object, got {_show(params)}")
    _check_max_tokens(params)
    _check_scalars(params)
    has_tools = _check_tools(params.get("tools"))
    choice = read_tool_choice(params)
    if choice is not None and choice.mode == "required" and not has_tools:
        field = _tool_choice_field(params)
        raise invalid_params(f"{field} mode 'required' needs a non-empty tools array", path=field)
    messages = params.get("messages")
    if messages is None:
        raise invalid_params("messages is required", path="messages")
    if not isinstance(messages, list):
        raise invalid_params(f"messages must be an array, got {_show(messages)}", path="messages")
    if not messages:
        raise invalid_params("messages must not be empty", path="messages")
    for index, message in enumerate(messages):
        _check_message(message, index, audio)
    _check_tool_pairing(messages)


def read_tool_choice(params: Mapping[str, Any]) -> ToolChoice | None:
    """Normalise `toolChoice {mode}` and the draft `tool_choice {mode|type, disable_parallel_tool_use}`."""
    field = _tool_choice_field(params)
    raw = params.get(field)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise invalid_params(f"{field} must be an object, got {_show(raw)}", path=field)
    mode = raw.get("mode")
    if mode is None and raw.get("type") is not None:
        kind = raw.get("type")
        if not isinstance(kind, str) or kind not in _DRAFT_CHOICE_TYPES:
            raise invalid_params(
                f"{field}.type must be one of 'auto', 'any', 'none', got {shown_name(kind)}", path=field
            )
        mode = _DRAFT_CHOICE_TYPES[kind]
    if mode is None:
        mode = "auto"
    if not isinstance(mode, str) or mode not in TOOL_CHOICE_MODES:
        raise invalid_params(
            f"{field}.mode must be one of 'auto', 'required', 'none', got {shown_name(mode)}", path=field
        )
    disable = raw.get("disable_parallel_tool_use", raw.get("disableParallelToolUse"))
    if disable is not None and not isinstance(disable, bool):
        raise invalid_params(
            f"{field}.disable_parallel_tool_use must be a boolean, got {_show(disable)}", path=field
        )
    return ToolChoice(mode=mode, disable_parallel_tool_use=bool(disable))


def _tool_choice_field(params: Mapping[str, Any]) -> str:
    """Which spelling a request uses: the released `toolChoice`, else the draft `tool_choice`."""
    return "toolChoice" if params.get("toolChoice") is not None else "tool_choice"


def is_content_block(value: Any, allowed: frozenset[str]) -> bool:
    """A draft tool result's `content` may be a block or any JSON object; this tells them apart.

    A block has one of the `allowed` types and that type's fields: an object such as
    `{"type": "text", "value": …}` is the tool's own JSON, not a malformed text block.
    """
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("type"), str)
        and value["type"] in allowed
        and _nested_block_problem(value) is None
    )


def _check_max_tokens(params: Mapping[str, Any]) -> None:
    if "maxTokens" not in params:
        raise invalid_params("maxTokens is required", path="maxTokens")
    value = params["maxTokens"]
    if not is_integer(value):
        raise invalid_params(f"maxTokens must be an integer, got {_show(value)}", path="maxTokens")
    if value < 1:
        raise invalid_params(f"maxTokens must be at least 1, got {value}", path="maxTokens")


def is_integer(value: Any) -> bool:
    """A JSON integer as the spec's schema means it (`"type": "integer"`): any number with no
    fractional part, `100.0` and `1e3` included, as the MCP SDKs read `maxTokens` too."""
    if isinstance(value, bool):
        return False
    if isinstance(value, ExactNumber):  # its text, not the nearest double: 1.00000000000000000001
        try:
            return Decimal(value.text) % 1 == 0
        except ArithmeticError:  # NaN, Infinity
            return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _check_scalars(params: Mapping[str, Any]) -> None:
    """Fields that would otherwise reach the API in a shape it rejects."""
    system = params.get("systemPrompt")
    if system is not None and not isinstance(system, str):
        raise invalid_params(f"systemPrompt must be a string, got {_show(system)}", path="systemPrompt")
    stops = params.get("stopSequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise invalid_params(
            f"stopSequences must be an array of strings, got {_show(stops)}", path="stopSequences"
        )


def _check_tools(tools: Any) -> bool:
    """Check the tool definitions; True when at least one tool is offered."""
    if tools is None:
        return False
    if not isinstance(tools, list):
        raise invalid_params(f"tools must be an array, got {_show(tools)}", path="tools")
    first_index: dict[str, int] = {}
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise invalid_params(f"{where} must be an object, got {_show(tool)}", path=where)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_params(f"{where}.name must be a non-empty string, got {_show(name)}", path=where)
        if name in first_index:
            raise invalid_params(
                f"{where}.name {shown_name(name)} duplicates tools[{first_index[name]}].name", path=where
            )
        first_index[name] = index
        schema = tool.get("inputSchema")
        if schema is not None and not isinstance(schema, Mapping):
            raise invalid_params(f"{where}.inputSchema must be an object, got {_show(schema)}", path=where)
        if schema is not None:
            _check_input_schema(schema, where, name)
    return bool(tools)


def _check_input_schema(schema: Mapping[str, Any], where: str, name: str) -> None:
    """MCP and Claude both want an object schema; Claude also refuses alternatives at its top level."""
    if "type" in schema and schema["type"] != "object":
        raise invalid_params(
            f"{where}.inputSchema.type (tool {shown_name(name)}) must be "
            f'"object", got {shown_name(schema["type"])}: '
            "MCP and Claude both require a tool's input to be an object",
            path=where,
        )
    for keyword in SCHEMA_COMBINATORS:
        if keyword in schema:
            raise invalid_params(
                f"{where}.inputSchema (tool {shown_name(name)}) has a top-level {keyword}, which Claude does "
                'not accept; Claude accepts an object schema ({"type": "object", "properties": …}) '
                "with any alternatives inside its properties",
                path=where,
            )


def _check_message(message: Any, index: int, audio: AudioPolicy) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise invalid_params(f"{where} must be an object, got {_show(message)}", path=where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise invalid_params(
            f"{where}.role must be 'user' or 'assistant', got {shown_name(role)}", path=where
        )
    if "content" not in message or message["content"] is None:
        raise invalid_params(f"{where}.content is required", path=where)
    content = message["content"]
    if not isinstance(content, (Mapping, list)):
        raise invalid_params(
            f"{where}.content must be a content block or an array of blocks, got {_show(content)}",
            path=where,
        )
    single = isinstance(content, Mapping)
    for block_index, block in enumerate(as_block_list(content)):
        _check_block(block, block_path(index, block_index, single), role, audio)


def _check_block(block: Any, where: str, role: str, audio: AudioPolicy) -> None:
    if not isinstance(block, Mapping):
        raise invalid_params(f"{where} must be a content block object, got {_show(block)}", path=where)
    kind = block.get("type")
    if not isinstance(kind, str) or kind not in MESSAGE_BLOCK_TYPES:
        raise invalid_params(
            f"{where}: unknown content type {shown_name(kind)} (expected one of "
            "'text', 'image', 'audio', 'tool_use', 'tool_result')",
            path=where,
        )
    if kind == "tool_use":
        if role != "assistant":
            raise invalid_params(f"{where}: tool_use is only allowed in assistant messages", path=where)
        _check_tool_use(block, where)
    elif kind == "tool_result":
        if role != "user":
            raise invalid_params(f"{where}: tool_result is only allowed in user messages", path=where)
        _check_tool_result(block, where)
    else:
        _check_media_block(block, where)
        if kind == "audio" and audio == "reject":
            raise _audio_rejected(where)


def _audio_rejected(where: str) -> SamplingError:
    return invalid_params(
        f"{where}: audio content is not supported by Claude; run mcp-backfill with "
        f"`--audio placeholder` ({env_var('--audio')}=placeholder) to send a text placeholder instead",
        path=where,
    )


def _check_media_block(block: Mapping[str, Any], where: str) -> None:
    problem = _media_problem(block)
    if problem is not None:
        raise invalid_params(f"{where}: {problem}", path=where)


def _media_problem(block: Mapping[str, Any]) -> str | None:
    """text / image / audio: the fields conversion reads must be strings."""
    fields = ("text",) if block["type"] == "text" else ("data", "mimeType")
    for field in fields:
        if not isinstance(block.get(field), str):
            return f"{block['type']} content needs a string {field!r}, got {_show(block.get(field))}"
    return None


def _check_tool_use(block: Mapping[str, Any], where: str) -> None:
    for field in ("id", "name"):
        value = block.get(field)
        if not isinstance(value, str) or not value:
            raise invalid_params(f"{where}: tool_use.{field} must be a non-empty string", path=where)
    tool_input = block.get("input")
    if tool_input is not None and not isinstance(tool_input, Mapping):
        raise invalid_params(
            f"{where}: tool_use.input must be an object, got {_show(tool_input)}", path=where
        )


def _check_tool_result(block: Mapping[str, Any], where: str) -> None:
    tool_use_id = block.get("toolUseId")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise invalid_params(f"{where}: tool_result.toolUseId must be a non-empty string", path=where)
    is_error = block.get("isError")
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid_params(
            f"{where}: tool_result.isError must be a boolean, got {_show(is_error)}", path=where
        )
    content = block.get("content")
    if isinstance(content, list):
        for index, item in enumerate(content):
            _check_nested_block(item, f"{where}.content[{index}]")
    # Draft shapes need no check: one object is a block only when it has all of that block's fields
    # (`is_content_block`); any other value (the tool's own JSON) is sent as text.


def _check_nested_block(block: Any, where: str) -> None:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise invalid_params(
            f"{where} must be a content block object with a string 'type', got {_show(block)}", path=where
        )
    problem = _nested_block_problem(block)
    if problem is not None:
        raise invalid_params(f"{where}: {problem}", path=where)


def _nested_block_problem(block: Mapping[str, Any]) -> str | None:
    """What a block in a tool result lacks for conversion to read it, if anything."""
    kind = block["type"]
    if kind in ("text", "image", "audio"):
        return _media_problem(block)
    if kind == "resource_link" and not isinstance(block.get("uri"), str):
        return "resource_link needs a string 'uri'"
    if kind == "resource":
        resource = block.get("resource")
        if (
            not isinstance(resource, Mapping)
            or not isinstance(resource.get("uri"), str)
            or not (isinstance(resource.get("text"), str) or isinstance(resource.get("blob"), str))
        ):
            return "resource needs a 'resource' object with a string 'uri' and a string 'text' or 'blob'"
    # Unknown nested types are kept as JSON text rather than rejected: tool output is open-ended.
    return None


def _check_tool_pairing(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every tool_use is answered in the very next (user) message, and only tool_uses are answered."""
    seen_ids: dict[str, int] = {}
    pending: dict[str, int] = {}
    for index, message in enumerate(messages):
        blocks = as_block_list(message["content"])
        single = isinstance(message["content"], Mapping)
        if message["role"] == "assistant":
            if pending:
                raise _missing_results(pending, index)
            for block_index, block in enumerate(blocks):
                if block["type"] != "tool_use":
                    continue
                where = block_path(index, block_index, single)
                tool_use_id = block["id"]
                if tool_use_id in seen_ids:
                    raise invalid_params(
                        f"{where}: duplicate tool_use id {shown_name(tool_use_id)} "
                        f"(already used in messages[{seen_ids[tool_use_id]}])",
                        path=where,
                    )
                seen_ids[tool_use_id] = index
                pending[tool_use_id] = index
            continue
        pending = _check_user_results(blocks, index, single, pending, seen_ids)
    if pending:
        raise _missing_results(pending, None)


def _check_user_results(
    blocks: Sequence[Mapping[str, Any]],
    index: int,
    single: bool,
    pending: dict[str, int],
    seen_ids: Mapping[str, int],
) -> dict[str, int]:
    """Check one user message against the tool_uses still unanswered; returns what stays unanswered."""
    kinds = {block["type"] for block in blocks}
    if "tool_result" in kinds and kinds != {"tool_result"}:
        raise invalid_params(
            f"messages[{index}]: Tool results mixed with other content: a user message that carries "
            "tool_result blocks must contain only tool_result blocks",
            path=f"messages[{index}]",
        )
    remaining = dict(pending)
    for block_index, block in enumerate(blocks):
        if block["type"] != "tool_result":
            continue
        where = block_path(index, block_index, single)
        tool_use_id = block["toolUseId"]
        if tool_use_id in remaining:
            del remaining[tool_use_id]
        elif tool_use_id in pending:
            raise invalid_params(
                f"{where}: duplicate tool_result for tool_use id {shown_name(tool_use_id)}", path=where
            )
        else:
            detail = "was answered earlier" if tool_use_id in seen_ids else "matches no preceding tool_use"
            raise invalid_params(
                f"{where}: tool_result toolUseId {shown_name(tool_use_id)} {detail}; a tool_result must "
                "answer a tool_use of the immediately preceding assistant message",
                path=where,
            )
    if remaining:
        raise _missing_results(remaining, index)
    return {}


def _missing_results(pending: Mapping[str, int], index: int | None) -> SamplingError:
    ids = ", ".join(shown_name(tool_use_id) for tool_use_id in pending)
    source = next(iter(pending.values()))
    where = f"messages[{source}]"
    if index is None:
        detail = "but it is the last message"
    else:
        detail = f"but messages[{index}] does not answer them all"
    return invalid_params(
        f"{where}: Tool result missing in request: tool_use id(s) {ids} must be answered by tool_result "
        f"blocks in the next message, which must be a user message, {detail}",
        path=where,
    )


def _show(value: Any, limit: int = 60) -> str:
    """A bad value for an error message, by its kind and size: `<string, 40 characters>`.

    The message reaches the server, the logs, span statuses and the audit log (which keeps message
    contents out without `--audit-content`), and a misplaced string is often the prompt itself: no
    string (nor anything holding one) is quoted. Numbers, booleans and null are shown as they are.
    """
    if isinstance(value, str):
        return f"<string, {_count(len(value), 'character')}>"
    if isinstance(value, list | tuple):
        return f"<array, {_count(len(value), 'item')}>"
    if isinstance(value, Mapping):
        return f"<object, {_count(len(value), 'key')}>"
    if value is None or isinstance(value, bool | int | float):
        text = json.dumps(value)
        return text if len(text) <= limit else text[: limit - 1] + "…"
    return f"<{type(value).__name__}>"


# A string shaped like a name (a tool's name, a tool_use id, a content type or mode) is quoted: it
# tells the server's author which one is wrong, and prose does not fit the shape.
_NAME_SHAPED = re.compile(r"[A-Za-z0-9_.:/@+-]{1,64}")


def shown_name(value: Any) -> str:
    """A value that should be a name, quoted when it has a name's shape, else as `_show` puts it."""
    if isinstance(value, str) and _NAME_SHAPED.fullmatch(value):
        return json.dumps(value)
    return _show(value)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
