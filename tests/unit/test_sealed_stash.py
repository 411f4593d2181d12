"""`SealedStash`: the proxy's answers to a mixed round sealed (AES-GCM) into the token the client echoes,
so any replica holding the same key can take the retry, and nobody else can open or forge it."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.relay import input_required as ir

KEY = ir.request_state_key("a secret the replicas share, 32+ characters long")
SCOPE = "client:alice"
MARKER = "PLAINTEXT-MARKER-7f3a"
ANSWERS: dict[str, Any] = {"ask": {"model": "claude", "content": {"type": "text", "text": MARKER}}}
PENDING: dict[str, Any] = {"ask": {"messages": [], "maxTokens": 3}}  # questions awaiting approval


def sealed(
    key: bytes = KEY, scope: str = SCOPE, ttl: float = 60, now: list[float] | None = None
) -> ir.SealedStash:
    if now is None:
        return ir.SealedStash(key, ttl=ttl, scope=scope)
    clock = now
    return ir.SealedStash(key, ttl=ttl, scope=scope, wall_clock=lambda: clock[0])


def decoded(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def test_the_key_is_aes_256_and_depends_on_the_secret() -> None:
    assert len(KEY) == 32
    assert ir.request_state_key("a secret the replicas share, 32+ characters long") == KEY
    assert ir.request_state_key("another secret, also 32+ characters long") != KEY


def test_round_trip_restores_answers_state_and_rounds() -> None:
    stash = sealed()
    token = stash.put(ANSWERS, True, {"server": ["state", 1]}, rounds=3)
    taken = stash.take(token)
    assert taken is not None
    assert taken.answers == ANSWERS
    assert taken.has_state
    assert taken.state == {"server": ["state", 1]}
    assert taken.rounds == 3


def test_round_trip_without_server_state() -> None:
    stash = sealed()
    taken = stash.take(stash.put({}, False, None, rounds=0))
    assert taken is not None
    assert (taken.answers, taken.has_state, taken.state, taken.rounds) == ({}, False, None, 0)


def test_restore_params_works_as_with_the_plain_stash() -> None:
    stash = sealed()
    token = stash.put({"ask": {"model": "claude"}}, True, "server-state", rounds=2)
    reduced = ir.reduced_result({"resultType": "input_required"}, {"confirm": {}}, token)
    client_retry: dict[str, Any] = {
        "name": "t",
        "inputResponses": {"confirm": {"action": "accept"}},
        "requestState": reduced["requestState"],
    }
    echoed = ir.stash_token(client_retry)
    assert echoed == token
    taken = stash.take(echoed)
    assert taken is not None
    assert ir.restore_params(client_retry, taken) == {
        "name": "t",
        "inputResponses": {"confirm": {"action": "accept"}, "ask": {"model": "claude"}},
        "requestState": "server-state",
    }


def test_a_token_can_be_redeemed_again_before_it_expires() -> None:
    """A mixed round's answers: a replay re-sends them and spends nothing."""
    stash = sealed()
    token = stash.put(ANSWERS, False, None, rounds=1)
    first, again = stash.take(token), stash.take(token)
    assert first is not None
    assert again is not None
    assert again.answers == first.answers == ANSWERS


def test_a_token_with_questions_awaiting_approval_redeems_once() -> None:
    """Its retry samples (and bills): a replay must not buy a second sampling."""
    stash = sealed()
    token = stash.put({}, True, "s", rounds=1, pending=PENDING)
    first = stash.take(token)
    assert first is not None
    assert first.pending == PENDING
    assert stash.take(token) is None
    padded = token + "=" * (-len(token) % 4)  # another spelling of the same token
    assert stash.take(padded) is None


def test_replicas_remember_redeemed_tokens_each_for_itself() -> None:
    """The limit documented in docs/replicas.md: the memory is per process."""
    one, other = sealed(), sealed()
    token = one.put({}, False, None, rounds=1, pending=PENDING)
    assert one.take(token) is not None
    assert other.take(token) is not None


def test_redeemed_tokens_are_remembered_until_they_expire_and_no_more_than_the_cap() -> None:
    now = [1_000_000.0]
    redeemed = ir.Redeemed(limit=2)
    stash = ir.SealedStash(KEY, ttl=30, scope=SCOPE, wall_clock=lambda: now[0], redeemed=redeemed)
    tokens = [stash.put({}, False, None, rounds=1, pending=PENDING) for _ in range(3)]
    assert stash.take(tokens[0]) is not None
    assert stash.take(tokens[1]) is not None
    assert stash.take(tokens[2]) is None  # full of live tokens: refused, none forgotten
    assert stash.take(tokens[0]) is None
    now[0] += 30  # all expired: forgotten, and the memory has room again
    fresh = stash.put({}, False, None, rounds=1, pending=PENDING)
    assert stash.take(fresh) is not None
    assert len(redeemed.expiries) == 1


def test_another_replica_with_the_same_key_opens_the_token() -> None:
    one, other = sealed(), sealed()
    token = one.put(ANSWERS, True, "s", rounds=1)
    taken = other.take(token)
    assert taken is not None
    assert (taken.answers, taken.state, taken.rounds) == (ANSWERS, "s", 1)
    back = one.take(other.put({"k": 1}, False, None, rounds=4))
    assert back is not None
    assert (back.answers, back.rounds) == ({"k": 1}, 4)


def test_another_key_cannot_open_the_token() -> None:
    token = sealed().put(ANSWERS, True, "s", rounds=1)
    assert sealed(key=ir.request_state_key("another secret, also 32+ characters long")).take(token) is None


def test_another_client_cannot_open_the_token() -> None:
    token = sealed(scope="client:alice").put(ANSWERS, True, "s", rounds=1)
    assert sealed(scope="client:bob").take(token) is None
    assert sealed(scope="").take(token) is None
    assert sealed(scope="client:alice").take(token) is not None


def test_a_tampered_token_is_refused() -> None:
    stash = sealed()
    token = stash.put(ANSWERS, True, "s", rounds=1)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for index in (0, 5, 11, 12, len(token) // 2, len(token) - 2):
        flipped = alphabet[(alphabet.index(token[index]) + 1) % len(alphabet)]
        tampered = token[:index] + flipped + token[index + 1 :]
        assert tampered != token
        assert stash.take(tampered) is None, index


def test_garbage_is_refused() -> None:
    stash = sealed()
    token = stash.put(ANSWERS, True, "s", rounds=1)
    for garbage in ("", "x", "!!!not base64!!!", "AAAA", token[:20], token + "AAAA", token[:-4], "é" + token):
        assert stash.take(garbage) is None, garbage


def test_an_expired_token_is_refused() -> None:
    now = [1_000_000.0]
    stash = sealed(ttl=30, now=now)
    token = stash.put(ANSWERS, True, "s", rounds=1)
    now[0] += 29
    assert stash.take(token) is not None
    now[0] += 1  # exactly at its expiry
    assert stash.take(token) is None
    now[0] += 1000
    assert stash.take(token) is None


def test_expiry_is_sealed_too_so_another_replica_honours_it() -> None:
    now = [1_000_000.0]
    token = sealed(ttl=30, now=now).put(ANSWERS, False, None, rounds=1)
    later = [now[0] + 31]
    assert sealed(ttl=3600, now=later).take(token) is None  # a longer ttl elsewhere does not revive it


def test_tokens_differ_for_the_same_content_and_hide_it() -> None:
    stash = sealed()
    tokens = {stash.put(ANSWERS, True, MARKER, rounds=1) for _ in range(20)}
    assert len(tokens) == 20  # a random nonce each time
    for token in tokens:
        assert MARKER not in token
        raw = decoded(token)
        assert MARKER.encode() not in raw
        assert b"claude" not in raw
        assert b'"a"' not in raw
        assert SCOPE.encode() not in raw  # the scope is authenticated, not carried
        assert token.isascii()
        assert "=" not in token  # no padding: it travels as it is in JSON
        assert stash.take(token) is not None


def test_a_token_is_no_plain_stash_token_and_fits_in_request_state() -> None:
    token = sealed().put(ANSWERS, False, None, rounds=1)
    reduced = ir.reduced_result({"resultType": "input_required"}, {}, token)
    assert json.loads(json.dumps(reduced))["requestState"] == ir.STATE_PREFIX + token
    assert ir.Stash(ttl=10).take(token) is None


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(
    answers=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4),
    has_state=st.booleans(),
    state=JSON_VALUES,
    rounds=st.integers(0, 100),
)
def test_any_json_answers_round_trip(
    answers: dict[str, Any], has_state: bool, state: Any, rounds: int
) -> None:
    one, other = sealed(), sealed()
    taken = other.take(one.put(answers, has_state, state, rounds))
    assert taken is not None
    # Compared through JSON: equal values, and floats like -0.0 kept exactly.
    assert json.dumps(taken.answers, sort_keys=True) == json.dumps(answers, sort_keys=True)
    assert json.dumps(taken.state) == json.dumps(state)
    assert (taken.has_state, taken.rounds) == (has_state, rounds)


def test_numbers_a_double_cannot_hold_keep_their_text_through_the_seal() -> None:
    """The server's state and the questions awaiting approval come back out of the token as they went
    in: `1e400` in them was `Infinity` (not JSON) or `null` once the round was re-sent."""
    from mcp_backfill import jsonrpc

    raw = b'{"state": {"n": 1e400}, "pending": {"ask": {"messages": [], "maxTokens": 3, "x": -1e400}}}'
    held = jsonrpc.decode(raw)
    stash = sealed()
    token = stash.put(ANSWERS, True, held["state"], 1, held["pending"])
    taken = stash.take(token)
    assert taken is not None
    assert jsonrpc.encode({"state": taken.state, "pending": taken.pending}) == (
        b'{"state":{"n":1e400},"pending":{"ask":{"messages":[],"maxTokens":3,"x":-1e400}}}'
    )
