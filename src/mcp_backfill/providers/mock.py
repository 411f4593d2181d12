"""A deterministic offline backend: no key, no network, no randomness.

For demos, and for MCP-server authors who want to exercise their sampling tool loops in CI. Given a
Claude-shaped request it either calls a tool (with arguments synthesised from the tool's input
schema) or answers with a text that summarises what it saw, including the tool results, so a demo
shows data flowing through the loop:

* tools are offered, `tool_choice` is not `{"type": "none"}`, and the conversation does not end in
  a user message whose content ends with `tool_result` blocks → a short text block and a
  `tool_use` of the first tool (or the one named by `tool_choice {"type": "tool"}`),
  stop_reason "tool_use";
* otherwise → "[mock] N messages; tool results: ...; last request: ...", stop_reason "end_turn".

`max_tokens` is honoured roughly (about 4 characters per token; "max_tokens" when cut) and so are
`stop_sequences` (cut before the first match; "stop_sequence"). The same request always gives the
same reply, ids included.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import anyio.lowlevel

from mcp_backfill.errors import invalid_params
from mcp_backfill.sampling.provider import ProgressCallback, StreamProgress, UsageMeter

__all__ = ["MockProvider", "mock_message", "synthesize_arguments"]

CHARS_PER_TOKEN = 4
MAX_RESULT_CHARS = 500
_MAX_DEPTH = 12
_MAX_ITEMS = 10

_FORMAT_EXAMPLES = {
    "date": "2025-01-01",
    "date-time": "2025-01-01T00:00:00Z",
    "time": "00:00:00",
    "duration": "PT1H",
    "email": "sample@example.com",
    "idn-email": "sample@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/sample",
    "url": "https://example.com/sample",
    "iri": "https://example.com/sample",
    "uri-reference": "https://example.com/sample",
    "iri-reference": "https://example.com/sample",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


class MockProvider:
    """The `Provider` that answers every request locally and deterministically."""

    name = "mock"

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()  # a cancelled caller is honoured even here
        message = mock_message(request)
        if meter is not None:  # nothing is billed, but the ledger counts what Claude would have
            meter.begin_attempt()
            meter.report(message["usage"], final=True)
        if on_progress is not None:  # the whole answer arrives at once: one final report
            characters = len(_dumps(message["content"]))
            output_tokens = message["usage"]["output_tokens"]
            await on_progress(StreamProgress(characters, done=True, output_tokens=output_tokens))
        return message

    async def aclose(self) -> None:
        return None


# --------------------------------------------------------------------------------------------------
# The reply
# --------------------------------------------------------------------------------------------------


def mock_message(request: Mapping[str, Any]) -> dict[str, Any]:
    """The mock's reply to a Claude-shaped request, as Claude message JSON."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise invalid_params("messages must be a non-empty list of messages")
    max_tokens = request.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise invalid_params("max_tokens must be a non-negative integer")
    model = request.get("model")
    model_name = model if isinstance(model, str) and model else "default"
    stop_sequences = [s for s in request.get("stop_sequences") or [] if isinstance(s, str) and s]
    limit = max_tokens * CHARS_PER_TOKEN

    content: list[dict[str, Any]] = []
    stop_sequence: str | None = None
    tool = _tool_to_call(request, messages)
    if tool is not None:
        preface = f"[mock] Calling {tool['name']}."
        schema = tool.get("input_schema")
        arguments = synthesize_arguments(schema if isinstance(schema, Mapping) else {})
        text, stop_reason, stop_sequence = _cut(preface, stop_sequences, limit)
        if stop_reason is None and len(preface) + len(_dumps(arguments)) > limit:
            stop_reason = "max_tokens"
        if text:
            content.append({"type": "text", "text": text})
        if stop_reason is None:
            digest = _digest(messages)
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_mock_{digest[:16]}",
                    "name": tool["name"],
                    "input": arguments,
                }
            )
            stop_reason = "tool_use"
    else:
        text, stop_reason, stop_sequence = _cut(_summary(messages), stop_sequences, limit)
        if text:
            content.append({"type": "text", "text": text})
        stop_reason = stop_reason or "end_turn"

    conversation = {key: request.get(key) for key in ("model", "system", "tools", "tool_choice", "messages")}
    return {
        "id": f"msg_mock_{_digest(conversation)[:24]}",
        "type": "message",
        "role": "assistant",
        "model": f"mock/{model_name}",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "stop_details": None,
        "usage": {
            "input_tokens": _estimate_tokens(dict(request)),
            "output_tokens": _estimate_tokens(content),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _tool_to_call(request: Mapping[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    tools = [t for t in request.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
    choice = request.get("tool_choice")
    choice_type = choice.get("type") if isinstance(choice, Mapping) else None
    if not tools or choice_type == "none":
        return None
    if choice_type not in ("any", "tool") and _ends_with_tool_results(messages):
        return None  # a turn that got its tools' results answers in text, unless a tool is required
    if choice_type == "tool":
        assert isinstance(choice, Mapping)
        wanted = choice.get("name")
        for tool in tools:
            if tool["name"] == wanted:
                return tool
        raise invalid_params(f"tool_choice names a tool that is not offered: {wanted!r}")
    return tools[0]


def _ends_with_tool_results(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1]
    content = last.get("content")
    return (
        last.get("role") == "user"
        and isinstance(content, list)
        and bool(content)
        and isinstance(content[-1], dict)
        and content[-1].get("type") == "tool_result"
    )


def _summary(messages: list[dict[str, Any]]) -> str:
    count = len(messages)
    parts = [f"[mock] {count} message{'' if count == 1 else 's'}"]
    if _ends_with_tool_results(messages):
        names = _tool_names_by_id(messages[-2]) if count >= 2 else {}
        results = []
        for block in messages[-1]["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                label = names.get(str(block.get("tool_use_id")), str(block.get("tool_use_id")))
                error = " (error)" if block.get("is_error") else ""
                results.append(f"{label}{error} → {_shorten(_text_of(block.get('content')))}")
        parts.append("tool results: " + " | ".join(results))
    last_request = next(
        (
            text
            for m in reversed(messages)
            if m.get("role") == "user" and (text := _text_of(m.get("content")))
        ),
        "",
    )
    if last_request:
        parts.append(f"last request: {_shorten(last_request)}")
    return "; ".join(parts)


def _tool_names_by_id(message: Mapping[str, Any]) -> dict[str, str]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return {}
    return {
        str(block.get("id")): str(block.get("name"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_use"
    }


def _text_of(content: object) -> str:
    """The text of message or tool_result content; tool results and media are left out/abbreviated."""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"].strip())
        elif kind in ("image", "document", "search_result"):
            parts.append(f"[{kind}]")
    return " ".join(p for p in parts if p)


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_RESULT_CHARS else text[: MAX_RESULT_CHARS - 1] + "…"


def _cut(text: str, stop_sequences: Sequence[str], limit: int) -> tuple[str, str | None, str | None]:
    """Apply stop sequences and the length limit: (text, stop_reason or None, matched sequence)."""
    matches = [(text.find(s), s) for s in stop_sequences if s in text]
    if matches:
        position, sequence = min(matches, key=lambda match: match[0])
        if position <= limit:
            return text[:position], "stop_sequence", sequence
    if len(text) > limit:
        return text[:limit], "max_tokens", None
    return text, None, None


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _digest(value: object) -> str:
    return hashlib.sha256(_dumps(value).encode()).hexdigest()


def _estimate_tokens(value: object) -> int:
    return max(1, len(_dumps(value)) // CHARS_PER_TOKEN)


# --------------------------------------------------------------------------------------------------
# Arguments from a JSON Schema
# --------------------------------------------------------------------------------------------------


def synthesize_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Plausible arguments for a tool's `input_schema`: its required properties and those with defaults.

    Each value is the schema's `default`, else `examples[0]`, else `enum[0]`, else `const`, else made
    up from the type (a "sample-<name>" string, 1 within the bounds, true, [] or `minItems` items,
    an object built the same way). Local `$ref`s, `anyOf`/`oneOf` (first non-null branch) and
    `allOf` are followed.
    """
    value = _example(schema, "value", schema, 0)
    return value if isinstance(value, dict) else {}


def _example(schema: object, name: str, root: Mapping[str, Any], depth: int, variant: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return None
    resolved = _resolve(schema, root)
    if not isinstance(resolved, Mapping):
        return _string_example(name, {}, variant)
    if "default" in resolved:
        return copy.deepcopy(resolved["default"])
    examples = resolved.get("examples")
    if isinstance(examples, list) and examples:
        return copy.deepcopy(examples[0])
    enum = resolved.get("enum")
    if isinstance(enum, list) and enum:
        return copy.deepcopy(enum[variant % len(enum)])
    if "const" in resolved:
        return copy.deepcopy(resolved["const"])
    for combinator in ("anyOf", "oneOf"):
        branches = resolved.get(combinator)
        if isinstance(branches, list) and branches:
            chosen = next((b for b in branches if not _is_null_schema(_resolve(b, root))), branches[0])
            return _example(chosen, name, root, depth + 1, variant)
    if isinstance(resolved.get("allOf"), list):
        return _example(_merge_all_of(resolved, root), name, root, depth + 1, variant)

    kind = _type_of(resolved)
    if kind == "string":
        return _string_example(name, resolved, variant)
    if kind in ("integer", "number"):
        return _number_example(resolved, integer=kind == "integer", variant=variant)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        return _array_example(resolved, name, root, depth)
    if kind == "object":
        return _object_example(resolved, root, depth)
    return _string_example(name, resolved, variant)


def _resolve(schema: object, root: Mapping[str, Any]) -> object:
    """Follow local `$ref`s ("#/$defs/X", "#/definitions/X", any "#/..." pointer), boundedly."""
    for _ in range(_MAX_DEPTH):
        if not isinstance(schema, Mapping) or not isinstance(schema.get("$ref"), str):
            return schema
        ref: str = schema["$ref"]
        if ref == "#":
            target: object = root
        elif ref.startswith("#/"):
            target = root
            for token in ref[2:].split("/"):
                token = token.replace("~1", "/").replace("~0", "~")
                target = target.get(token) if isinstance(target, Mapping) else None
        else:
            return {}  # remote references are not fetched: treat as "anything"
        if not isinstance(target, Mapping):
            return {}
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **siblings}
    return {}


def _is_null_schema(schema: object) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "null"


def _merge_all_of(schema: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties: dict[str, Any] = dict(merged.get("properties") or {})
    required: list[Any] = list(merged.get("required") or [])
    for part in schema["allOf"]:
        resolved = _resolve(part, root)
        if not isinstance(resolved, Mapping):
            continue
        for key, value in resolved.items():
            if key == "properties" and isinstance(value, Mapping):
                properties.update(value)
            elif key == "required" and isinstance(value, list):
                required.extend(r for r in value if r not in required)
            else:
                merged.setdefault(key, value)
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(key in schema for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"


def _slug(name: str) -> str:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name)
    slug = re.sub(r"[^a-z0-9]+", "-", spaced.lower()).strip("-")
    return slug or "value"


def _string_example(name: str, schema: Mapping[str, Any], variant: int) -> str:
    fmt = schema.get("format")
    text = _FORMAT_EXAMPLES.get(fmt, "") if isinstance(fmt, str) else ""
    if not text:
        text = f"sample-{_slug(name)}" + (f"-{variant + 1}" if variant else "")
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and not isinstance(min_length, bool) and len(text) < min_length:
        text += "x" * (min_length - len(text))
    max_length = schema.get("maxLength")
    if isinstance(max_length, int) and not isinstance(max_length, bool) and len(text) > max_length:
        text = text[: max(0, max_length)]
    return text


def _bound(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _number_example(schema: Mapping[str, Any], *, integer: bool, variant: int) -> int | float:
    """1 (plus `variant`), moved inside the schema's bounds when it is outside them."""
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    exclusive_low, exclusive_high = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    # draft-04 style: exclusiveMinimum/exclusiveMaximum are booleans qualifying minimum/maximum
    if schema.get("exclusiveMinimum") is True and low is not None:
        exclusive_low, low = low, None
    if schema.get("exclusiveMaximum") is True and high is not None:
        exclusive_high, high = high, None
    if integer:  # turn every bound into an inclusive integer bound
        lows = [math.ceil(low)] if low is not None else []
        lows += [math.floor(exclusive_low) + 1] if exclusive_low is not None else []
        highs = [math.floor(high)] if high is not None else []
        highs += [math.ceil(exclusive_high) - 1] if exclusive_high is not None else []
        value = 1 + variant
        if lows and value < max(lows):
            value = max(lows) + variant
        if highs and value > min(highs):
            value = min(highs)
        return value
    number: float = 1 + variant
    if low is not None and number < low:
        number = low + variant
    if exclusive_low is not None and number <= exclusive_low:
        number = exclusive_low + 1 + variant
    if high is not None and number > high:
        number = high
    if exclusive_high is not None and number >= exclusive_high:
        floor = exclusive_low if exclusive_low is not None else low
        number = (floor + exclusive_high) / 2 if floor is not None else exclusive_high - 1
    return int(number) if number == int(number) else number


def _array_example(schema: Mapping[str, Any], name: str, root: Mapping[str, Any], depth: int) -> list[Any]:
    min_items = schema.get("minItems")
    count = (
        min(min_items, _MAX_ITEMS) if isinstance(min_items, int) and not isinstance(min_items, bool) else 0
    )
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    values: list[Any] = []
    for index in range(max(count, 0)):
        if isinstance(prefix, list) and index < len(prefix):
            item_schema: object = prefix[index]
        elif isinstance(items, list):  # draft-04 tuple form
            item_schema = items[index] if index < len(items) else {}
        else:
            item_schema = items if items is not None else {}
        values.append(_example(item_schema, name, root, depth + 1, variant=index))
    return values


def _object_example(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        return {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    names = list(required)
    for prop, prop_schema in properties.items():
        resolved = _resolve(prop_schema, root)
        if prop not in names and isinstance(resolved, Mapping) and "default" in resolved:
            names.append(prop)
    return {prop: _example(properties.get(prop, {}), prop, root, depth + 1) for prop in names}
