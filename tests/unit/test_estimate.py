"""The reservation estimate: exact on the output side, erring high on the input side."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.sampling.estimate import (
    IMAGE_TOKENS,
    OVERHEAD_TOKENS,
    TOOL_SYSTEM_PROMPT_TOKENS,
    estimate_input_tokens,
    reservation_for,
)
from mcp_backfill.sampling.spend import Reservation


def user(*content: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(content)}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"max_tokens": 50, "messages": [user({"type": "text", "text": "abcdef"})]}, Reservation(8 + 2, 50)),
        ({"max_tokens": 1, "messages": [user({"type": "text", "text": "abcdefg"})]}, Reservation(8 + 3, 1)),
        ({"max_tokens": 10, "system": "ü" * 3, "messages": []}, Reservation(2, 10)),  # 6 UTF-8 bytes
        (
            {
                "max_tokens": 10,
                "messages": [user({"type": "image", "source": {"type": "base64", "data": "x" * 10**6}})],
            },
            Reservation(OVERHEAD_TOKENS + IMAGE_TOKENS, 10),
        ),
        (
            {
                "max_tokens": 10,
                "messages": [user({"type": "document", "source": {"type": "base64", "data": "A" * 3000}})],
            },
            Reservation(OVERHEAD_TOKENS + 1000, 10),
        ),
        (
            {"max_tokens": 10, "tools": [{"name": "t", "input_schema": {}}], "messages": []},
            Reservation(TOOL_SYSTEM_PROMPT_TOKENS + OVERHEAD_TOKENS + 11, 10),  # 33 bytes of JSON
        ),
        ({"messages": "not a list"}, Reservation(0, 0)),
    ],
)
def test_reservations(request_: dict[str, Any], expected: Reservation) -> None:
    assert reservation_for(request_) == expected


texts = st.text(max_size=200)


@given(st.lists(texts, max_size=5), texts)
def test_the_input_estimate_is_at_least_a_token_per_four_bytes_and_grows_with_the_prompt(
    parts: list[str], more: str
) -> None:
    messages = [user({"type": "text", "text": part}) for part in parts]
    estimate = estimate_input_tokens({"messages": messages})
    size = sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    assert estimate >= size / 4
    longer = estimate_input_tokens({"messages": [*messages, user({"type": "text", "text": more})]})
    assert longer >= estimate + OVERHEAD_TOKENS
