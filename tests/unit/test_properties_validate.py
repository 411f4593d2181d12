"""Properties of `validate_params`: any JSON gets an answer or a `SamplingError`, never a crash.

Three sources of input: arbitrary JSON, loosely shaped requests (the right keys with plausible or
arbitrary values), and valid requests with a few random mutations. What passes validation must
also convert (or be refused with a `SamplingError`): conversion relies on validation for shapes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.errors import SamplingError
from mcp_backfill.protocol import INVALID_PARAMS
from mcp_backfill.sampling.convert import to_claude_request
from mcp_backfill.sampling.validate import validate_params
from tests.defaults import CONVERSION
from tests.unit.sampling_strategies import history_refs, sampling_requests

ANY_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=15,
)

# Errors point at a top-level field, a tool, a message, a block or a tool result's nested block.
_PATH = re.compile(
    r"maxTokens|systemPrompt|stopSequences|toolChoice|tool_choice|tools(\[\d+\])?"
    r"|messages(\[\d+\](\.content(\[\d+\])?(\.content(\[\d+\])?)?)?)?"
)
_PATH_STEP = re.compile(r"(?:^|\.)([A-Za-z_]+)|\[(\d+)\]")


def loose(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the plausible value, sometimes anything at all."""
    return st.one_of(plausible, plausible, ANY_JSON)


IDS = st.sampled_from(["a", "b", "c"])
STRINGS = st.text(max_size=6)
NESTED_BLOCKS = st.fixed_dictionaries(
    {"type": loose(st.sampled_from(["text", "image", "audio", "resource_link", "resource", "other"]))},
    optional={
        "text": loose(STRINGS),
        "data": loose(STRINGS),
        "mimeType": loose(st.sampled_from(["image/png", "text/plain", "application/pdf"])),
        "uri": loose(STRINGS),
        "resource": loose(
            st.fixed_dictionaries(
                {"uri": loose(STRINGS)}, optional={"text": loose(STRINGS), "blob": loose(STRINGS)}
            )
        ),
    },
)
BLOCKS = st.fixed_dictionaries(
    {"type": loose(st.sampled_from(["text", "image", "audio", "tool_use", "tool_result", "resource"]))},
    optional={
        "text": loose(STRINGS),
        "data": loose(STRINGS),
        "mimeType": loose(st.sampled_from(["image/png", "image/gif", "audio/wav"])),
        "id": loose(IDS),
        "name": loose(st.sampled_from(["t", "fs.read"])),
        "input": loose(st.dictionaries(STRINGS, st.integers(), max_size=2)),
        "toolUseId": loose(IDS),
        "content": loose(NESTED_BLOCKS | st.lists(NESTED_BLOCKS, max_size=3)),
        "structuredContent": ANY_JSON,
        "isError": loose(st.booleans()),
    },
)
MESSAGES = st.fixed_dictionaries(
    {
        "role": loose(st.sampled_from(["user", "assistant"])),
        "content": loose(BLOCKS | st.lists(BLOCKS, max_size=3)),
    }
)
TOOL_CHOICES = st.fixed_dictionaries(
    {},
    optional={
        "mode": loose(st.sampled_from(["auto", "required", "none"])),
        "type": loose(st.sampled_from(["auto", "any", "none", "tool"])),
        "disable_parallel_tool_use": loose(st.booleans()),
    },
)
SHAPED_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "messages": loose(st.lists(MESSAGES, max_size=4)),
        "maxTokens": loose(st.integers(-1, 3)),
        "systemPrompt": loose(STRINGS),
        "stopSequences": loose(st.lists(STRINGS, max_size=2)),
        "tools": loose(
            st.lists(
                st.fixed_dictionaries(
                    {"name": loose(st.sampled_from(["t", "fs.read"]))},
                    optional={
                        "inputSchema": loose(
                            st.sampled_from([{"type": "object"}, {"type": "array"}, {"anyOf": [{}]}])
                        )
                    },
                ),
                max_size=2,
            )
        ),
        "toolChoice": loose(TOOL_CHOICES),
        "tool_choice": loose(TOOL_CHOICES),
        "metadata": ANY_JSON,
        "temperature": ANY_JSON,
        "includeContext": ANY_JSON,
    },
)


def check_path(params: Any, path: str, message: str) -> None:
    """An error's path leads into the request; only a missing required field may end it early."""
    assert _PATH.fullmatch(path), path
    steps = _PATH_STEP.findall(path)
    here = params
    for number, (key, index) in enumerate(steps):
        if key and isinstance(here, Mapping) and key in here:
            here = here[key]
        elif index and isinstance(here, list) and int(index) < len(here):
            here = here[int(index)]
        else:
            assert number == len(steps) - 1, f"{path}: step {number} does not exist"
            assert "is required" in message, f"{path} does not exist but the error is {message!r}"


def refusal(call: Callable[[], object]) -> SamplingError | None:
    try:
        call()
    except SamplingError as exc:
        return exc
    return None


def answered_or_refused(params: Any, call: Callable[[], object]) -> bool:
    """Run `call`; True when it succeeded, False when it raised a well-formed invalid-params error."""
    error = refusal(call)
    if error is None:
        return True
    assert error.code == INVALID_PARAMS
    assert isinstance(error.message, str)
    assert error.message
    if error.data is not None:
        assert set(error.data) == {"path"}
        check_path(params, error.data["path"], error.message)
    return False


def validates_then_converts(params: Any) -> None:
    """Whatever validation lets through converts, or is refused with a SamplingError."""
    for audio in ("reject", "placeholder"):
        validate = partial(validate_params, params, audio=audio)
        if answered_or_refused(params, validate):
            answered_or_refused(params, partial(to_claude_request, params, replace(CONVERSION, audio=audio)))


@given(ANY_JSON)
def test_arbitrary_json_only_ever_raises_sampling_error(params: Any) -> None:
    answered_or_refused(params, lambda: validate_params(params))


@given(SHAPED_PARAMS)
def test_loosely_shaped_requests_only_ever_raise_sampling_error(params: dict[str, Any]) -> None:
    validates_then_converts(params)


# --- mutations of valid requests ----------------------------------------------------------------


RETYPED: tuple[Any, ...] = (None, True, 0, 1.5, "x", [], {}, [{"type": "text"}], {"type": "text"})


def locations(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a JSON value, as a path of keys and indexes (the root is ())."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += locations(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += locations(item, (*path, index))
    return found


def mutate(value: Any, data: st.DataObject) -> Any:
    """Replace, retype, delete, duplicate or empty one thing inside `value` (a deep copy is changed)."""
    value = copy.deepcopy(value)
    places = locations(value)[1:]
    deep = [place for place in places if place[0] == "messages" and len(place) > 3]  # inside blocks
    if bool(deep) and data.draw(st.booleans(), label="inside a block"):
        places = deep
    path = data.draw(st.sampled_from(places), label="path")
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    operation = data.draw(
        st.sampled_from(["replace", "retype", "delete", "duplicate", "empty"]), label="operation"
    )
    if operation == "delete":
        del parent[last]
    elif operation == "duplicate" and isinstance(parent, list):
        parent.insert(last, copy.deepcopy(parent[last]))
    elif operation == "retype":
        others = [other for other in RETYPED if type(other) is not type(parent[last])]
        parent[last] = copy.deepcopy(data.draw(st.sampled_from(others), label="retyped"))
    elif operation == "empty":
        parent[last] = type(parent[last])() if isinstance(parent[last], (dict, list, str)) else None
    else:
        parent[last] = data.draw(ANY_JSON, label="replacement")
    return value


@given(sampling_requests(), st.data())
def test_mutated_valid_requests_only_ever_raise_sampling_error(
    params: dict[str, Any], data: st.DataObject
) -> None:
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        params = mutate(params, data)
    validates_then_converts(params)


@given(sampling_requests())
def test_valid_requests_pass_validation(params: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(params)
    validate_params(params)
    validate_params(params, audio="placeholder")
    assert params == snapshot


@given(sampling_requests(exchange=True), st.data())
def test_broken_tool_pairing_is_refused(params: dict[str, Any], data: st.DataObject) -> None:
    messages = params["messages"]
    exchanges = [
        index
        for index, message in enumerate(messages)
        if message["role"] == "assistant"
        and isinstance(message["content"], list)
        and any(block["type"] == "tool_use" for block in message["content"])
    ]
    index = data.draw(st.sampled_from(exchanges), label="exchange")
    uses = [block for block in messages[index]["content"] if block["type"] == "tool_use"]
    content = messages[index + 1]["content"]
    results = messages[index + 1]["content"] = content if isinstance(content, list) else [content]
    how = data.draw(
        st.sampled_from(
            [
                "drop a result",
                "unknown id",
                "repeat a tool_use id",
                "swap roles",
                "tool_use from the user",
                "tool_result from the assistant",
            ]
        )
    )
    if how == "drop a result":
        results.pop(data.draw(st.integers(0, len(results) - 1)))
    elif how == "unknown id":
        results[data.draw(st.integers(0, len(results) - 1))]["toolUseId"] = "never-used-" + "".join(
            history_refs(params)[1]
        )
    elif how == "repeat a tool_use id":
        messages[index]["content"].append(copy.deepcopy(data.draw(st.sampled_from(uses))))
    elif how == "swap roles":
        messages[index]["role"], messages[index + 1]["role"] = "user", "assistant"
    elif how == "tool_use from the user":
        messages[index]["role"] = "user"
        del messages[index + 1]
    else:
        messages[index + 1]["role"] = "assistant"
        del messages[index]
    with pytest.raises(SamplingError) as caught:
        validate_params(params)
    assert caught.value.code == INVALID_PARAMS


@given(
    st.sampled_from([{"type": "any"}, {"mode": "required"}]),
    st.sampled_from([{}, {"tools": []}]),
)
def test_draft_required_choice_error_names_tool_choice(choice: dict[str, Any], tools: dict[str, Any]) -> None:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
    error = refusal(partial(validate_params, {**params, **tools, "tool_choice": choice}))
    assert error is not None
    assert error.data == {"path": "tool_choice"}
