"""`mcp_backfill.protocol` writes down what the mcp SDK also knows; these fail when the two drift."""

from __future__ import annotations

import mcp.client.streamable_http as sdk_http
import mcp.shared.inbound as sdk_inbound
import mcp_types
import mcp_types.methods as sdk_methods
import mcp_types.version as sdk_versions
import pytest

from mcp_backfill import protocol


def test_revisions_match_the_sdk_registry() -> None:
    assert frozenset(sdk_versions.HANDSHAKE_PROTOCOL_VERSIONS) == protocol.HANDSHAKE_VERSIONS
    assert tuple(sdk_versions.MODERN_PROTOCOL_VERSIONS) == (protocol.STATELESS_VERSION,)
    assert frozenset(sdk_versions.KNOWN_PROTOCOL_VERSIONS) == protocol.SUPPORTED_VERSIONS


def test_methods_are_methods_the_sdk_knows() -> None:
    known = set(sdk_methods.MONOLITH_REQUESTS) | set(sdk_methods.MONOLITH_NOTIFICATIONS)
    for name in (
        protocol.INITIALIZE,
        protocol.DISCOVER,
        protocol.SAMPLING,
        protocol.TOOLS_CALL,
        protocol.TOOLS_LIST,
        protocol.INITIALIZED,
        protocol.CANCELLED,
        protocol.PROGRESS,
        protocol.TOOLS_CHANGED,
    ):
        assert name in known, name
    assert frozenset(sdk_methods.INPUT_REQUIRED_METHODS) == protocol.INPUT_REQUIRED_METHODS


def test_envelope_keys_codes_and_headers_match_the_sdk() -> None:
    assert mcp_types.PROTOCOL_VERSION_META_KEY == protocol.META_PROTOCOL_VERSION
    assert mcp_types.CLIENT_CAPABILITIES_META_KEY == protocol.META_CLIENT_CAPABILITIES
    assert (mcp_types.PARSE_ERROR, mcp_types.INVALID_REQUEST, mcp_types.METHOD_NOT_FOUND) == (
        protocol.PARSE_ERROR,
        protocol.INVALID_REQUEST,
        protocol.METHOD_NOT_FOUND,
    )
    assert (mcp_types.INVALID_PARAMS, mcp_types.INTERNAL_ERROR) == (
        protocol.INVALID_PARAMS,
        protocol.INTERNAL_ERROR,
    )
    assert sdk_inbound.MCP_PROTOCOL_VERSION_HEADER.lower() == protocol.VERSION_HEADER
    assert sdk_inbound.MCP_METHOD_HEADER.lower() == protocol.METHOD_HEADER
    assert sdk_inbound.MCP_NAME_HEADER.lower() == protocol.NAME_HEADER
    assert sdk_inbound.MCP_PARAM_HEADER_PREFIX.lower() == protocol.PARAM_HEADER_PREFIX
    assert sdk_http.MCP_SESSION_ID.lower() == protocol.SESSION_HEADER
    assert sdk_http.LAST_EVENT_ID.lower() == protocol.LAST_EVENT_ID_HEADER


@pytest.mark.parametrize(
    ("version", "since", "defined"),
    [
        ("2024-11-05", "2025-03-26", False),
        ("2025-03-26", "2025-03-26", True),
        ("2025-06-18", "2025-11-25", False),
        ("2026-07-28", "2025-11-25", True),
        ("2099-01-01", "2025-11-25", True),  # newer than the proxy knows: the newest shapes
        ("2024-10-07", "2025-11-25", True),  # not known either
        (None, "2025-11-25", True),
    ],
)
def test_what_a_revision_defines(version: str | None, since: str, defined: bool) -> None:
    assert protocol.defines(version, since) is defined
