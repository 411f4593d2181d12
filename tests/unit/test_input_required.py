"""The 2026-07-28 decisions as pure functions: envelopes, splitting rounds, retries, the stash."""

from __future__ import annotations

from typing import Any

from mcp_backfill import protocol
from mcp_backfill.relay import input_required as ir

SAMPLING_WITH_TOOLS = {
    "method": "sampling/createMessage",
    "params": {"messages": [], "maxTokens": 5, "tools": []},
}
SAMPLING_PLAIN = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}
ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {}}}


def test_envelope_needs_a_protocol_version() -> None:
    assert ir.envelope({"_meta": {protocol.META_PROTOCOL_VERSION: "2026-07-28"}}) is not None
    assert ir.envelope({"_meta": {"progressToken": 1}}) is None
    assert ir.envelope({"_meta": "x"}) is None
    assert ir.envelope(None) is None


def test_with_capabilities_copies_and_keeps_the_rest() -> None:
    meta = {"k": 1}
    message: dict[str, Any] = {"id": 1, "method": "tools/list", "params": {"cursor": "c", "_meta": meta}}
    rewritten = ir.with_capabilities(message, {"sampling": {"tools": {}}})
    assert rewritten["params"] == {
        "cursor": "c",
        "_meta": {"k": 1, protocol.META_CLIENT_CAPABILITIES: {"sampling": {"tools": {}}}},
    }
    assert meta == {"k": 1}


def test_split_round_gives_the_proxy_only_the_sampling_it_should_answer() -> None:
    result = {
        "resultType": "input_required",
        "inputRequests": {"a": SAMPLING_WITH_TOOLS, "b": SAMPLING_PLAIN, "c": ELICIT, "d": "junk"},
        "requestState": "s",
    }
    only_tools = ir.split_round(result, lambda params: "tools" in params)
    assert set(only_tools.mine) == {"a"}
    assert set(only_tools.theirs) == {"b", "c", "d"}
    assert only_tools.has_state
    assert only_tools.state == "s"
    assert not only_tools.state_only


def test_state_only_round() -> None:
    current = ir.split_round({"resultType": "input_required", "requestState": "later"}, lambda params: True)
    assert current.state_only
    assert ir.retry_params({"name": "t"}, {}, current.has_state, current.state) == {
        "name": "t",
        "requestState": "later",
    }


def test_retry_params_replace_earlier_answers() -> None:
    base = ir.base_params(
        {"name": "t", "arguments": {}, "inputResponses": {"old": {}}, "requestState": "old"}
    )
    assert base == {"name": "t", "arguments": {}}
    assert ir.retry_params(base, {"k": {"model": "m"}}, False, None) == {
        "name": "t",
        "arguments": {},
        "inputResponses": {"k": {"model": "m"}},
    }


def test_stash_round_trip_merges_answers_and_restores_the_server_state() -> None:
    stash = ir.Stash(ttl=10)
    token = stash.put({"ask": {"model": "claude"}}, True, "server-state", rounds=2)
    reduced = ir.reduced_result({"resultType": "input_required", "x": 1}, {"confirm": ELICIT}, token)
    assert reduced["inputRequests"] == {"confirm": ELICIT}
    assert reduced["x"] == 1
    client_retry: dict[str, Any] = {
        "name": "t",
        "inputResponses": {"confirm": {"action": "accept"}},
        "requestState": reduced["requestState"],
    }
    taken = ir.stash_token(client_retry)
    assert taken == token
    stashed = stash.take(taken)
    assert stashed is not None
    assert stashed.rounds == 2
    assert ir.restore_params(client_retry, stashed) == {
        "name": "t",
        "inputResponses": {"confirm": {"action": "accept"}, "ask": {"model": "claude"}},
        "requestState": "server-state",
    }
    assert stash.take(token) is None  # answers are redeemed once


def test_stash_entries_expire() -> None:
    now = [100.0]
    stash = ir.Stash(ttl=5, clock=lambda: now[0])
    token = stash.put({}, False, None, rounds=0)
    now[0] += 6
    assert stash.take(token) is None
    stash.put({}, False, None, rounds=0)
    assert token not in stash.entries  # expired entries are purged on the next put


def test_each_expired_stash_entry_is_reported_once_and_no_entry_taken_in_time() -> None:
    now = [100.0]
    heard: list[tuple[str, Any]] = []
    stash = ir.Stash(
        ttl=5, clock=lambda: now[0], expired=lambda token, entry: heard.append((token, entry.asked_for))
    )
    taken = stash.put({}, False, None, rounds=0, pending={"q": {}}, asked_for=1)
    dropped = stash.put({}, False, None, rounds=0, pending={"q": {}}, asked_for=2)
    late = stash.put({}, False, None, rounds=0, pending={"q": {}}, asked_for=3)
    assert stash.take(taken) is not None
    now[0] += 6
    assert stash.holds() is False
    assert stash.take(late) is None  # purged already: not heard of twice
    assert heard == [(dropped, 2), (late, 3)]


def test_a_server_state_is_not_mistaken_for_a_stash_token() -> None:
    assert ir.stash_token({"requestState": "v1.sealed"}) is None
    assert ir.stash_token({"requestState": 5}) is None
    assert ir.stash_token({}) is None
