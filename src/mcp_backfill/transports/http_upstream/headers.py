"""The routing headers a stateless (2026-07-28) upstream checks on each POST, derived from the body.

There is no session: every request repeats its version, method and name in headers, plus an
`Mcp-Param-*` header for each tool argument whose input schema carries `x-mcp-header`. A stdio client
cannot send headers, so the proxy derives them; the value encoding and the schema rules come from the
SDK's own codec (`mcp.shared.inbound`), the one its server validates against.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mcp_backfill import protocol

# What a header's value can be as text on every transport: printable ASCII, spaces only inside (h11
# refuses control characters, httpx2 anything past ASCII, and CR or LF would end the header).
_FIELD_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")

# The SDK (`mcp.shared.inbound`) is imported on first use, not with this module: the stdio proxy
# imports the HTTP upstream with it, and the SDK costs ~1.5 s of startup and ~40 MB of memory that
# a proxy with a stdio upstream never needs.


def stateless_version(message: Any) -> str | None:
    """The protocol version a request declares in `params._meta`, if it is not a handshake one.

    The SDK server takes a POST down its stateless path exactly when the version is not a handshake
    revision; an `initialize` is handshake whatever its `_meta` says."""
    if not isinstance(message, dict) or message.get("method") == protocol.INITIALIZE:
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(protocol.META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
    if isinstance(version, str) and version not in protocol.HANDSHAKE_VERSIONS:
        return version
    return None


def unsendable_routing(version: str, method: str) -> str | None:
    """Why a stateless request's version or method cannot travel in its routing header, if so.

    They go as they are (the server compares them with the body's as sent): one holding a byte past
    ASCII failed the request with an internal error, one holding a line break as if the upstream
    were unreachable."""
    for what, header, value in (
        ("protocol version", "MCP-Protocol-Version", version),
        ("method", "Mcp-Method", method),
    ):
        if not _FIELD_VALUE.fullmatch(value):
            return (
                f"Invalid Request: the request's {what} cannot be sent in the {header} header the "
                "2026-07-28 revision requires (printable ASCII only)"
            )
    return None


def stateless_headers(
    version: str, method: str, params: Any, param_headers: Mapping[str, str]
) -> dict[str, str]:
    """`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and the given `Mcp-Param-*` for one request."""
    from mcp.shared.inbound import NAME_BEARING_METHODS, encode_header_value

    headers = {protocol.VERSION_HEADER: version, protocol.METHOD_HEADER: method}
    name_key = NAME_BEARING_METHODS.get(method)
    name = params.get(name_key) if name_key is not None and isinstance(params, dict) else None
    if isinstance(name, str):
        headers[protocol.NAME_HEADER] = encode_header_value(name)
    headers.update(param_headers)
    return headers


class ToolHeaderMaps:
    """Which arguments of which tool travel as `Mcp-Param-*` headers, learned from `tools/list` results."""

    def __init__(self) -> None:
        self._maps: dict[str, dict[tuple[str, ...], str]] = {}
        # True once a full listing was seen since the last `notifications/tools/list_changed`.
        self.complete = False

    def learn(self, result: Any, *, last_page: bool) -> None:
        from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map

        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            schema = tool.get("inputSchema")
            # A tool with an invalid annotation gets no headers at all, as in the SDK client.
            valid = find_invalid_x_mcp_header(schema) is None
            self._maps[tool["name"]] = x_mcp_header_map(schema) if valid else {}
        if last_page:
            self.complete = True

    def knows(self, name: str) -> bool:
        return name in self._maps

    def headers_for(self, name: str, arguments: Any) -> dict[str, str]:
        header_map = self._maps.get(name)
        if not header_map or not isinstance(arguments, Mapping):
            return {}
        from mcp.shared.inbound import mcp_param_headers

        return mcp_param_headers(header_map, arguments)

    def stale(self) -> None:
        self.complete = False
