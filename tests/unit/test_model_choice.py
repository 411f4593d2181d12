"""select_model: hints in order, whole-token aliases, priorities, and never raising."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_backfill.sampling.model_choice import select_model

OPUS = "claude-opus-4-7"
SONNET = "claude-sonnet-4-6"
HAIKU = "claude-haiku-4-5"
ALLOWED = (OPUS, SONNET, HAIKU)
DEFAULT = SONNET


def pick(preferences: Any, allowed: tuple[str, ...] = ALLOWED, default: str = DEFAULT) -> str:
    return select_model(preferences, allowed=allowed, default=default)


def hints(*names: str) -> dict[str, Any]:
    return {"hints": [{"name": name} for name in names]}


def test_no_preferences_gives_default() -> None:
    assert pick(None) == DEFAULT
    assert pick({}) == DEFAULT


@pytest.mark.parametrize(
    "preferences",
    [
        "opus",
        42,
        ["opus"],
        {"hints": "opus"},
        {"hints": [None, 3, "opus", {"name": 7}, {"name": None}, {"name": "  "}]},
        {"hints": [{}], "intelligencePriority": "high"},
        {"costPriority": None, "speedPriority": [], "intelligencePriority": {}},
    ],
)
def test_invalid_shapes_are_ignored(preferences: Any) -> None:
    assert pick(preferences) == DEFAULT


def test_substring_hint_matches_allowed_model() -> None:
    assert pick(hints("haiku-4-5")) == HAIKU
    assert pick(hints("CLAUDE-OPUS")) == OPUS


def test_hints_are_tried_in_order_first_match_wins() -> None:
    assert pick(hints("llama-3", "opus", "haiku")) == OPUS
    assert pick(hints("haiku", "opus")) == HAIKU


def test_substring_match_takes_first_allowed_in_order() -> None:
    allowed = ("claude-opus-4-8", "claude-opus-4-7", SONNET)
    assert pick(hints("opus-4"), allowed=allowed) == "claude-opus-4-8"


def test_hint_naming_an_allowed_model_exactly_picks_it_over_longer_names() -> None:
    allowed = ("claude-sonnet-4-5", "claude-opus-4-1", "claude-opus-4")
    assert pick(hints("claude-opus-4"), allowed=allowed, default="claude-sonnet-4-5") == "claude-opus-4"
    assert pick(hints("Claude-Opus-4"), allowed=allowed, default="claude-sonnet-4-5") == "claude-opus-4"


def test_generic_claude_hint_keeps_default_even_when_not_listed_first() -> None:
    assert pick(hints("claude")) == DEFAULT
    assert pick(hints("claude"), default=HAIKU) == HAIKU


def test_family_alias_on_whole_tokens() -> None:
    assert pick(hints("claude-3-opus-20240229")) == OPUS
    assert pick(hints("claude-3-5-haiku-latest")) == HAIKU
    assert pick(hints("sonnet")) == SONNET


def test_family_alias_prefers_the_default_then_the_first_listed() -> None:
    allowed = ("claude-sonnet-4", "claude-sonnet-4-5", "claude-opus-4-1", "claude-opus-4")
    assert (
        pick(hints("claude-3-5-sonnet"), allowed=allowed, default="claude-sonnet-4-5") == "claude-sonnet-4-5"
    )
    assert pick(hints("claude-3-opus"), allowed=allowed, default="claude-sonnet-4-5") == "claude-opus-4-1"


@pytest.mark.parametrize("name", ["gpt-4o-mini", "gemini-2.0-flash", "fast", "small", "cheap", "o4-mini"])
def test_small_aliases_pick_the_smallest_tier(name: str) -> None:
    assert pick(hints(name)) == HAIKU


@pytest.mark.parametrize("name", ["gemini", "gemini-2.5-pro", "gpt-4o", "gpt-5", "claude"])
def test_vendor_aliases_pick_the_default(name: str) -> None:
    # "gemini" contains "mini" as a substring but not as a token.
    assert pick(hints(name)) == DEFAULT


def test_smallest_alias_without_haiku_falls_to_next_smallest() -> None:
    assert pick(hints("mini"), allowed=(OPUS, SONNET)) == SONNET


def test_family_not_allowed_tries_the_next_hint() -> None:
    assert pick(hints("opus", "haiku"), allowed=(SONNET, HAIKU)) == HAIKU
    assert pick(hints("opus"), allowed=(SONNET, HAIKU)) == SONNET


def test_unmatched_hints_fall_back_to_priorities() -> None:
    assert pick({**hints("llama-3.1-70b", "mistral-large"), "speedPriority": 0.9}) == HAIKU


def test_hints_beat_priorities() -> None:
    assert pick({**hints("haiku"), "intelligencePriority": 1.0}) == HAIKU


def test_high_intelligence_picks_largest_tier() -> None:
    assert pick({"intelligencePriority": 0.9, "costPriority": 0.2, "speedPriority": 0.5}) == OPUS
    assert pick({"intelligencePriority": 0.7}) == OPUS


@pytest.mark.parametrize("key", ["costPriority", "speedPriority"])
def test_high_cost_or_speed_picks_smallest_tier(key: str) -> None:
    assert pick({key: 0.8, "intelligencePriority": 0.3}) == HAIKU


@pytest.mark.parametrize(
    "preferences",
    [
        {"intelligencePriority": 0.69},
        {"speedPriority": 0.5, "costPriority": 0.6},
        {"intelligencePriority": 0.8, "costPriority": 0.8},
        {"intelligencePriority": 0.9, "speedPriority": 0.9},
        {"intelligencePriority": 0.5, "costPriority": 0.5, "speedPriority": 0.5},
    ],
)
def test_no_dominant_priority_gives_default(preferences: dict[str, Any]) -> None:
    assert pick(preferences) == DEFAULT


@pytest.mark.parametrize("bad", [True, 1.5, -0.1, float("nan"), float("inf"), "0.9"])
def test_out_of_range_priorities_are_ignored(bad: Any) -> None:
    assert pick({"intelligencePriority": bad}) == DEFAULT
    assert pick({"speedPriority": bad}) == DEFAULT


def test_integer_priority_is_accepted() -> None:
    assert pick({"intelligencePriority": 1}) == OPUS


def test_unknown_families_rank_as_sonnet_class() -> None:
    allowed = ("claude-fable-5", HAIKU, SONNET)
    # fable ties with sonnet for largest: the earlier entry wins.
    assert pick({"intelligencePriority": 1.0}, allowed=allowed) == "claude-fable-5"
    assert pick({"costPriority": 1.0}, allowed=allowed) == HAIKU
    assert pick({"costPriority": 1.0}, allowed=("claude-fable-5", OPUS)) == "claude-fable-5"


def test_tiers_are_read_from_provider_prefixed_ids() -> None:
    allowed = ("anthropic.claude-haiku-4-5-v1:0", "anthropic.claude-opus-4-7-v1:0")
    assert pick({"intelligencePriority": 0.9}, allowed=allowed) == "anthropic.claude-opus-4-7-v1:0"


def test_empty_allowed_list_uses_default() -> None:
    assert pick({"intelligencePriority": 1.0}, allowed=()) == DEFAULT
    assert pick(hints("opus"), allowed=()) == DEFAULT


def test_single_pinned_model_always_wins() -> None:
    allowed = (SONNET,)
    for preferences in (hints("opus"), hints("mini"), {"intelligencePriority": 1.0}, {"speedPriority": 1.0}):
        assert pick(preferences, allowed=allowed) == SONNET
