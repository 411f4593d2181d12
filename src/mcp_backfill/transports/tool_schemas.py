"""The input schemas of an upstream's tools, learned from the `tools/list` answers that pass by.

A 2026-07-28 server checks each `tools/call`'s `Mcp-Param-*` headers against the called tool's
input schema (its `x-mcp-header` annotations). The sidecar's front makes that check itself, since a
stdio upstream never sees the headers; this is where it finds the schema. A
`notifications/tools/list_changed` forgets them all: a schema checked after it must be listed anew.
"""

from __future__ import annotations

from typing import Any

LIST_PAGE_CAP = 20
"""Pages of a tools listing of the proxy's own before it gives up looking for a tool."""
CURSORS_KEPT = 256
"""Next-page cursors remembered (a server may mint new ones for every listing): past that, they are
forgotten, and a listing must be followed from its first page again to be whole."""


class ToolSchemas:
    """Tool name -> input schema, as the upstream's latest listings gave them."""

    def __init__(self) -> None:
        self._schemas: dict[str, Any] = {}
        self._cursors: set[str] = set()  # the next pages of the listings followed from their first
        self.complete = False
        """A whole listing, followed from its first page to its last, was seen since the schemas
        were last forgotten: a tool missing now is one the server does not have."""

    def learn(self, result: Any, cursor: Any = None) -> None:
        """Keep the schemas of one `tools/list` result (one page), asked for with `cursor`. A last
        page ends a whole listing only when its listing was followed from the first page (a
        client may ask for any page with a cursor it kept: the pages before it are unseen)."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._schemas[tool["name"]] = tool.get("inputSchema")
        if cursor is not None and cursor not in self._cursors:
            return  # a page of a listing not followed from its start
        next_cursor = result.get("nextCursor")
        if not isinstance(next_cursor, str):
            self.complete = True
            return
        if len(self._cursors) >= CURSORS_KEPT:
            self._cursors.clear()
        self._cursors.add(next_cursor)

    def knows(self, name: str) -> bool:
        return name in self._schemas

    def schema_of(self, name: str) -> Any:
        """The tool's input schema (None when the tool is unknown)."""
        return self._schemas.get(name)

    def forget(self) -> None:
        self._schemas.clear()
        self._cursors.clear()
        self.complete = False
