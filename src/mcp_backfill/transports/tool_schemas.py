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


class ToolSchemas:
    """Tool name -> input schema, as the upstream's latest listings gave them."""

    def __init__(self) -> None:
        self._schemas: dict[str, Any] = {}
        self.complete = False
        """A listing's last page was seen since the schemas were last forgotten: a tool missing
        now is one the server does not have."""

    def learn(self, result: Any) -> None:
        """Keep the schemas of one `tools/list` result (one page)."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._schemas[tool["name"]] = tool.get("inputSchema")
        if not isinstance(result.get("nextCursor"), str):
            self.complete = True

    def knows(self, name: str) -> bool:
        return name in self._schemas

    def schema_of(self, name: str) -> Any:
        """The tool's input schema (None when the tool is unknown)."""
        return self._schemas.get(name)

    def forget(self) -> None:
        self._schemas.clear()
        self.complete = False
