"""The headers derived for an HTTP upstream from a request's body, checked against the SDK's own rules."""

from __future__ import annotations

from typing import Any

from mcp.shared.inbound import decode_header_value, validate_mcp_param_headers

from mcp_backfill.transports.http_upstream import display_url
from mcp_backfill.transports.http_upstream.headers import ToolHeaderMaps, stateless_headers, stateless_version

ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
REGIONAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "options": {"type": "object", "properties": {"fast": {"type": "boolean", "x-mcp-header": "Fast"}}},
        "city": {"type": "string"},
    },
}


def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def test_stateless_version_only_for_non_handshake_envelopes() -> None:
    assert stateless_version(request("tools/list", {"_meta": ENVELOPE})) == "2026-07-28"
    handshake = {"io.modelcontextprotocol/protocolVersion": "2025-11-25"}
    assert stateless_version(request("tools/list", {"_meta": handshake})) is None
    assert stateless_version(request("tools/list", {})) is None
    assert stateless_version(request("initialize", {"_meta": ENVELOPE})) is None


def test_name_header_is_encoded_so_the_server_decodes_it_back() -> None:
    headers = stateless_headers("2026-07-28", "resources/read", {"uri": "file:///é.txt"}, {})
    assert headers["mcp-protocol-version"] == "2026-07-28"
    assert headers["mcp-method"] == "resources/read"
    assert headers["mcp-name"] != "file:///é.txt"  # not a safe header value as is
    assert decode_header_value(headers["mcp-name"]) == "file:///é.txt"
    assert "mcp-name" not in stateless_headers("2026-07-28", "tools/list", {}, {})


def test_param_headers_satisfy_the_servers_validation() -> None:
    maps = ToolHeaderMaps()
    maps.learn({"tools": [{"name": "regional", "inputSchema": REGIONAL_SCHEMA}]}, last_page=True)
    arguments = {"region": "eu-west", "options": {"fast": True}, "city": "Paris"}
    headers = maps.headers_for("regional", arguments)
    assert headers == {"Mcp-Param-Region": "eu-west", "Mcp-Param-Fast": "true"}
    lowered = {name.lower(): value for name, value in headers.items()}
    assert validate_mcp_param_headers(REGIONAL_SCHEMA, arguments, lowered) is None
    assert validate_mcp_param_headers(REGIONAL_SCHEMA, arguments, {}) is not None  # needed indeed


def test_tool_maps_track_what_was_listed() -> None:
    maps = ToolHeaderMaps()
    invalid = {"type": "object", "properties": {"n": {"type": "number", "x-mcp-header": "N"}}}
    maps.learn({"tools": [{"name": "odd", "inputSchema": invalid}], "nextCursor": "p2"}, last_page=False)
    assert maps.knows("odd")
    assert not maps.complete
    assert maps.headers_for("odd", {"n": 1.5}) == {}  # invalid annotations give no headers
    maps.learn({"tools": [{"name": "plain", "inputSchema": {"type": "object"}}]}, last_page=True)
    assert maps.complete
    assert maps.knows("plain")
    assert not maps.knows("other")
    maps.stale()
    assert not maps.complete


def test_display_url_drops_credentials_and_query() -> None:
    assert display_url("https://user:pw@example.com:8443/mcp?token=abc") == "https://example.com:8443/mcp"
    assert display_url("http://127.0.0.1/mcp") == "http://127.0.0.1/mcp"
