"""Hypothesis strategies for MCP `sampling/createMessage` params, shared by the property tests.

`sampling_requests()` draws requests that validation must accept: text and image blocks, and
tool exchanges (an assistant turn with tool_use blocks answered, in any order, by the next user
turn holding only tool_result blocks). Tool names and tool_use ids are drawn to be awkward: unicode,
spaces, over-long, and "squatters" (legal names that equal what another name is rewritten to).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from mcp_backfill.sampling.convert import sanitize_tool_id, sanitize_tool_name

JSON_SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
JSON_OBJECTS: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.text(max_size=8), JSON_VALUES, max_size=4
)

LEGAL_NAME = r"[a-zA-Z0-9_-]{1,128}"
LEGAL_ID = r"[a-zA-Z0-9_-]+"

_ODD_NAMES = (
    "fs.read",
    "fs/read",
    "a b",
    "ünïcode",
    "name:with:colons",
    "日本語",
    " ",
    "-",
    "x" * 128,
    "x" * 129,
    "y" * 300,
)

TOOL_NAMES: st.SearchStrategy[str] = st.one_of(
    st.from_regex(LEGAL_NAME, fullmatch=True),
    st.text(min_size=1, max_size=30),
    st.text(min_size=120, max_size=260),
    st.sampled_from(_ODD_NAMES),
)
TOOL_IDS: st.SearchStrategy[str] = st.one_of(
    st.from_regex(r"toolu_[a-zA-Z0-9]{1,24}", fullmatch=True),
    st.from_regex(r"[a-zA-Z0-9_-]{1,40}", fullmatch=True),
    st.text(min_size=1, max_size=40),
    st.sampled_from(("call:1", "call/1", "id with spaces", "ïd", "z" * 200)),
)

BLANK_TEXTS = ("", " ", "\n\t ", "\u3000")
TEXTS: st.SearchStrategy[str] = st.one_of(
    st.text(max_size=40),
    st.sampled_from(BLANK_TEXTS),
    # Padded with whitespace: a final assistant turn must lose its trailing whitespace.
    st.tuples(
        st.sampled_from(BLANK_TEXTS), st.text(min_size=1, max_size=10), st.sampled_from(BLANK_TEXTS)
    ).map("".join),
)

# (magic bytes, the media type Claude is told); WebP's 4 size bytes sit between RIFF and WEBP.
IMAGE_HEADS: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"RIFF\x24\x00\x00\x00WEBP", "image/webp"),
)
DECLARED_IMAGE_TYPES = (
    "image/png",
    "image/jpeg",
    "image/jpg",
    "image/gif",
    "image/webp",
    "IMAGE/PNG",
    "application/octet-stream",
)
DATA_URL_PREFIX = "data:image/png;base64,"


def image_media_type(data: str) -> str:
    """The media type an image block generated here must reach Claude with."""
    raw = base64.b64decode(data.removeprefix(DATA_URL_PREFIX))
    return next(mime for magic, mime in IMAGE_HEADS if raw.startswith(magic))


def text_block(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


@st.composite
def image_blocks(draw: st.DrawFn) -> dict[str, Any]:
    magic, _ = draw(st.sampled_from(IMAGE_HEADS))
    data = base64.b64encode(magic + draw(st.binary(max_size=24))).decode("ascii")
    if draw(st.booleans()):
        data = DATA_URL_PREFIX + data
    declared = draw(st.one_of(st.sampled_from(DECLARED_IMAGE_TYPES), st.text(max_size=12)))
    return {"type": "image", "data": data, "mimeType": declared}


PLAIN_BLOCKS: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.builds(text_block, TEXTS), st.builds(text_block, TEXTS), image_blocks()
)


@st.composite
def unique_with_squatters(
    draw: st.DrawFn,
    values: st.SearchStrategy[str],
    sanitize: Callable[[str, int], str],
    min_size: int,
    max_size: int,
) -> list[str]:
    """Distinct values, plus a few legal values equal to what other values are rewritten to."""
    drawn = draw(st.lists(values, min_size=min_size, max_size=max_size, unique=True))
    if drawn:
        for victim, attempt in draw(
            st.lists(st.tuples(st.sampled_from(drawn), st.integers(0, 1)), max_size=2)
        ):
            squatter = sanitize(victim, attempt)
            if squatter not in drawn:
                drawn.insert(draw(st.integers(0, len(drawn))), squatter)
    return drawn


def tool_name_lists(min_size: int = 0, max_size: int = 6) -> st.SearchStrategy[list[str]]:
    return unique_with_squatters(TOOL_NAMES, sanitize_tool_name, min_size, max_size)


def tool_id_lists(min_size: int = 0, max_size: int = 8) -> st.SearchStrategy[list[str]]:
    return unique_with_squatters(TOOL_IDS, sanitize_tool_id, min_size, max_size)


def _content(draw: st.DrawFn, blocks: list[dict[str, Any]]) -> dict[str, Any] | list[dict[str, Any]]:
    """One block may travel as a bare object instead of a one-element array."""
    if len(blocks) == 1 and draw(st.booleans()):
        return blocks[0]
    return blocks


@st.composite
def conversations(
    draw: st.DrawFn, names: list[str], ids: list[str], *, exchange: bool = False
) -> list[dict[str, Any]]:
    """Messages that obey the tool-use rules; every id in `ids` is used at most once.

    `exchange`: at least one tool exchange (then `names` and `ids` must not be empty).
    """
    unused = list(ids)
    messages: list[dict[str, Any]] = []
    segments = draw(st.integers(1, 5))
    forced = draw(st.integers(0, segments - 1)) if exchange else -1
    for segment in range(segments):
        reserve = int(segment < forced)  # keep an id for the forced exchange
        if segment == forced or (bool(names) and len(unused) > reserve and draw(st.booleans())):
            count = draw(st.integers(1, min(3, len(unused) - reserve)))
            exchange_ids, unused = unused[:count], unused[count:]
            uses = [
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": draw(st.sampled_from(names)),
                    "input": draw(JSON_OBJECTS),
                }
                for tool_id in exchange_ids
            ]
            extra = draw(st.lists(PLAIN_BLOCKS, max_size=2))
            messages.append({"role": "assistant", "content": draw(st.permutations(uses + extra))})
            results = []
            for tool_id in draw(st.permutations(exchange_ids)):
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "toolUseId": tool_id,
                    "content": draw(st.lists(st.builds(text_block, TEXTS), max_size=2)),
                }
                if draw(st.booleans()):
                    result["isError"] = draw(st.booleans())
                results.append(result)
            messages.append({"role": "user", "content": _content(draw, results)})
        else:
            role = draw(st.sampled_from(("user", "assistant")))
            messages.append(
                {"role": role, "content": _content(draw, draw(st.lists(PLAIN_BLOCKS, max_size=3)))}
            )
    return messages


@st.composite
def sampling_requests(draw: st.DrawFn, *, exchange: bool = False) -> dict[str, Any]:
    """Valid `sampling/createMessage` params (2025-11-25 shapes, sometimes the draft `tool_choice`).

    `exchange`: the conversation holds at least one tool exchange.
    """
    params: dict[str, Any] = {"maxTokens": draw(st.integers(1, 100_000))}
    offered = draw(st.one_of(st.none(), tool_name_lists()))
    history_only = draw(tool_name_lists(min_size=int(exchange and not offered), max_size=2))
    names = list(dict.fromkeys([*(offered or []), *history_only]))
    ids = draw(tool_id_lists(min_size=int(exchange)))
    params["messages"] = draw(conversations(names, ids, exchange=exchange))
    if offered is not None:
        params["tools"] = [
            {"name": name, "description": draw(st.text(max_size=10)), "inputSchema": {"type": "object"}}
            for name in offered
        ]
    modes = ["auto", "none", *(["required"] if offered else [])]
    choice = draw(st.sampled_from(["absent", "released", "draft"]))
    if choice == "released":
        params["toolChoice"] = {"mode": draw(st.sampled_from(modes))}
    elif choice == "draft":
        draft = {"auto": "auto", "none": "none", "required": "any"}[draw(st.sampled_from(modes))]
        params["tool_choice"] = {"type": draft, "disable_parallel_tool_use": draw(st.booleans())}
    if draw(st.booleans()):
        params["systemPrompt"] = draw(TEXTS)
    if draw(st.booleans()):
        params["stopSequences"] = draw(st.lists(TEXTS, max_size=3))
    return params


def history_refs(params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Tool names and tool_use ids of the conversation, in order of appearance."""
    names: list[str] = []
    ids: list[str] = []
    for message in params["messages"]:
        content = message["content"]
        for block in content if isinstance(content, list) else [content]:
            if block["type"] == "tool_use":
                names.append(block["name"])
                ids.append(block["id"])
    return names, ids
