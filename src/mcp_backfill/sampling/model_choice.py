"""Choosing a Claude model from MCP `modelPreferences`.

Preferences are advisory (the spec lets the client ignore them), so this never raises: a shape it
does not understand simply falls through to the operator's default. Hints are tried first, in
order, then the numeric priorities.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_FAMILIES = ("opus", "sonnet", "haiku")
_TIER_RANK: Mapping[str, int] = {"haiku": 0, "sonnet": 1, "opus": 2}
_UNKNOWN_TIER = 1  # an unrecognised family is treated as sonnet-class
_SMALL_TOKENS = frozenset({"mini", "flash", "fast", "small", "cheap", "lite", "nano"})
_VENDOR_TOKENS = frozenset({"gpt", "gemini", "claude"})
_HIGH_PRIORITY = 0.7
_TOKEN_SPLIT_RE = re.compile(r"[^a-z0-9]+")


def select_model(
    preferences: dict[str, Any] | None,
    *,
    allowed: Sequence[str],
    default: str,
    allow_upgrade: bool = True,
) -> str:
    """The model to call: the first hint that matches, else the priorities, else `default`.

    Without `allow_upgrade`, only models of the default's family or a cheaper one are candidates:
    a server cannot make the operator pay for a pricier family than the one configured.
    """
    candidates = list(dict.fromkeys(allowed)) or [default]
    if not allow_upgrade:
        candidates = [model for model in candidates if _tier(model) <= _tier(default)] or [default]
    prefs: Mapping[str, Any] = preferences if isinstance(preferences, Mapping) else {}
    for hint in _hint_names(prefs.get("hints")):
        chosen = _match_hint(hint, candidates, default)
        if chosen is not None:
            return chosen
    return _by_priority(prefs, candidates, default)


def _hint_names(hints: Any) -> list[str]:
    if not isinstance(hints, list):
        return []
    names = (hint.get("name") for hint in hints if isinstance(hint, Mapping))
    return [name.strip().lower() for name in names if isinstance(name, str) and name.strip()]


def _tokens(text: str) -> list[str]:
    """Whole tokens, so that "gemini" is not mistaken for "mini"."""
    return [token for token in _TOKEN_SPLIT_RE.split(text.lower()) if token]


def _match_hint(hint: str, candidates: Sequence[str], default: str) -> str | None:
    """Substring match first (a model the hint names exactly before any that contains it), then
    family / vendor aliases on whole tokens."""
    # The default is tried first so that a generic hint ("claude", "4-5", "sonnet") keeps the
    # operator's default rather than whichever allowed model happens to be listed first.
    search = [default, *(m for m in candidates if m != default)] if default in candidates else candidates
    exact = next((m for m in search if m.lower() == hint), None)
    if exact is not None:
        return exact
    for model in search:
        if hint in model.lower():
            return model
    tokens = _tokens(hint)
    for family in _FAMILIES:
        if family in tokens:
            return next((m for m in search if family in _tokens(m)), None)
    if _SMALL_TOKENS.intersection(tokens):
        return _smallest(candidates)
    if _VENDOR_TOKENS.intersection(tokens):
        return default
    return None


def _by_priority(prefs: Mapping[str, Any], candidates: Sequence[str], default: str) -> str:
    cost = _priority(prefs.get("costPriority"))
    speed = _priority(prefs.get("speedPriority"))
    intelligence = _priority(prefs.get("intelligencePriority"))
    if intelligence >= _HIGH_PRIORITY and intelligence > cost and intelligence > speed:
        return _largest(candidates)
    thrift = max(cost, speed)
    if thrift >= _HIGH_PRIORITY and thrift > intelligence:
        return _smallest(candidates)
    return default


def _priority(value: Any) -> float:
    """A priority in [0, 1]; anything else counts as "no preference" (0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    if not math.isfinite(value) or not 0 <= value <= 1:
        return 0.0
    return float(value)


def _tier(model: str) -> int:
    tokens = _tokens(model)
    return next((_TIER_RANK[family] for family in _FAMILIES if family in tokens), _UNKNOWN_TIER)


def _smallest(candidates: Sequence[str]) -> str:
    """The cheapest tier available; ties go to the earlier (operator-preferred) entry."""
    return min(candidates, key=_tier)


def _largest(candidates: Sequence[str]) -> str:
    """The most capable tier available; ties go to the earlier (operator-preferred) entry."""
    return max(candidates, key=_tier)
