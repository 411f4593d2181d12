"""What the mux keeps of the upstream's tools listings (for the front's `Mcp-Param-*` check)."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_backfill.transports.tool_schemas import ToolSchemas

SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}


@pytest.mark.parametrize(
    ("results", "known", "complete"),
    [
        ([{"tools": [{"name": "a", "inputSchema": SCHEMA}]}], {"a": SCHEMA}, True),
        ([{"tools": [{"name": "a", "inputSchema": SCHEMA}], "nextCursor": "p2"}], {"a": SCHEMA}, False),
        (
            [
                {"tools": [{"name": "a"}], "nextCursor": "p2"},
                {"tools": [{"name": "b", "inputSchema": SCHEMA}]},
            ],
            {"a": None, "b": SCHEMA},
            True,
        ),
        ([{"tools": "not a list"}], {}, False),
        (["not a result"], {}, False),
        ([{"tools": [{"name": 3}, "x", {"inputSchema": SCHEMA}]}], {}, True),
    ],
)
def test_learn(results: list[Any], known: dict[str, Any], complete: bool) -> None:
    tools = ToolSchemas()
    for result in results:
        tools.learn(result)
    assert {name: tools.schema_of(name) for name in known} == known
    assert all(tools.knows(name) for name in known)
    assert tools.complete == complete
    tools.forget()
    assert not any(tools.knows(name) for name in known)
    assert not tools.complete


def test_a_last_page_ends_a_listing_only_when_it_was_followed_from_the_first() -> None:
    """A page asked for with a cursor the listings seen did not announce (a client's kept cursor)
    leaves the pages before it unseen: its end is not the end of a whole listing."""
    page_one = {"tools": [{"name": "a", "inputSchema": SCHEMA}], "nextCursor": "p2"}
    page_two = {"tools": [{"name": "b"}]}
    tools = ToolSchemas()
    tools.learn(page_two, "p2")
    assert tools.knows("b")
    assert not tools.complete
    tools.learn(page_one)
    tools.learn(page_two, "p2")
    assert tools.complete
    tools.forget()
    tools.learn(page_two, "p2")  # the cursor went with the schemas
    assert not tools.complete
