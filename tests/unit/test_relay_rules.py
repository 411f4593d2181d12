"""The relay's decision rules, as pure functions: capability merge and who answers sampling."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_backfill.relay.capabilities import ClientProfile, backfill_capabilities, wants_tools


def test_merge_keeps_everything_the_client_declared() -> None:
    declared = {"roots": {"listChanged": True}, "sampling": {"context": {}}, "x": 1}
    merged = backfill_capabilities(declared, "fallback")
    assert merged == {"roots": {"listChanged": True}, "sampling": {"context": {}, "tools": {}}, "x": 1}
    assert declared["sampling"] == {"context": {}}  # the original is not mutated


@pytest.mark.parametrize("mode", ["fallback", "always"])
def test_nothing_changes_when_the_client_already_samples_with_tools(mode: Any) -> None:
    assert backfill_capabilities({"sampling": {"tools": {}}}, mode) is None


def test_off_never_changes_anything() -> None:
    assert backfill_capabilities({}, "off") is None


@pytest.mark.parametrize("capabilities", [None, [], "x", {"sampling": None}, {"sampling": []}])
def test_malformed_capabilities_are_replaced_by_a_valid_declaration(capabilities: Any) -> None:
    merged = backfill_capabilities(capabilities, "fallback")
    assert merged is not None
    assert merged["sampling"] == {"tools": {}}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, False),
        ({"tools": []}, True),
        ({"toolChoice": {"mode": "none"}}, True),
        ({"tool_choice": {}}, True),
        ({"tools": None, "toolChoice": None, "tool_choice": None}, False),  # null: absent, as in the SDK
    ],
)
def test_wants_tools_accepts_released_and_draft_spellings(params: dict[str, Any], expected: bool) -> None:
    assert wants_tools(params) is expected


@pytest.mark.parametrize(
    ("sampling", "params", "can"),
    [
        (None, {}, False),
        ({}, {}, True),
        ({}, {"tools": []}, False),
        ({"tools": {}}, {"tools": []}, True),
        ({"tools": True}, {"tools": []}, False),
    ],
)
def test_client_profile_can_sample(sampling: Any, params: dict[str, Any], can: bool) -> None:
    assert ClientProfile(sampling=sampling).can_sample(params) is can
