"""Clients told apart in `serve`: named tokens (from a `*_FILE` secret), sessions bound to their
client, and budgets, concurrency and 2026-07-28 upstreams kept per client. Real processes, raw HTTP
on loopback, the fake Claude API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_sidecar_stateless import stateless_headers, stateless_request
from tests.fake_claude import FakeClaude, RecordedRequest, Reply, hang_reply, text_reply
from tests.harness import TEST_API_KEY, proxy_env, python_server
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    Sidecar,
    initialize_body,
    open_session,
    response_messages,
    response_to,
    run_sidecar,
    sidecar_argv,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
CHATTY_SERVER = python_server("chatty_server.py")
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "clients"
    path.write_text(f"# who may use this sidecar\nalice={ALICE}\n\nbob = {BOB}\n")
    return path


def as_client(token: str, session: str | None = None) -> dict[str, str]:
    headers = {**HANDSHAKE_HEADERS, "authorization": f"Bearer {token}"}
    return {**headers, "mcp-session-id": session} if session else headers


async def plain(http: httpx2.AsyncClient, sidecar: Sidecar, token: str, session: str, request_id: int) -> Any:
    """`tools/call plain` (one sampling request) in `session` as the client holding `token`."""
    arguments = {"params_json": json.dumps(question(request_id))}
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "sample_raw", "arguments": arguments},
    }
    response = await http.post(sidecar.url, json=body, headers=as_client(token, session))
    assert response.status_code == 200, response.text
    return json.loads(response_to(response, request_id)["result"]["content"][0]["text"])


def question(n: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": {"type": "text", "text": f"question {n}"}}],
        "maxTokens": 20,
    }


async def test_named_clients_have_their_own_sessions_and_budgets(tmp_path: Path) -> None:
    env = proxy_env(MCP_BACKFILL_CLIENT_TOKENS_FILE=str(token_file(tmp_path)))
    options = ("--provider", "mock", "--client-budget-tokens", "10")
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        assert (
            await http.post(sidecar.url, json={}, headers=as_client("nobody-0123456789abc"))
        ).status_code == 401
        alices = await open_session(http, sidecar.url, {"authorization": f"Bearer {ALICE}"})
        bobs = await open_session(http, sidecar.url, {"authorization": f"Bearer {BOB}"})
        hijack = await http.post(
            sidecar.url,
            json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers=as_client(BOB, alices),
        )
        first = await plain(http, sidecar, ALICE, alices, 1)
        again = await plain(http, sidecar, ALICE, alices, 2)  # her budget is spent...
        other = await plain(http, sidecar, BOB, bobs, 3)  # ...not Bob's
        stderr = sidecar.stderr()
    assert hijack.status_code == 403
    assert "result" in first
    assert "token budget of client 'alice' is exhausted" in again["error"]["message"]
    assert "result" in other
    assert '"client": "alice"' in stderr or 'client="alice"' in stderr
    assert ALICE not in stderr
    assert BOB not in stderr


async def test_one_client_cannot_take_every_claude_slot(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """Concurrency slots were process-wide: a client holding them all starved the others. Now a
    client may hold half of them (rounded up) when clients are told apart."""

    def reply(request: RecordedRequest) -> Reply:
        return hang_reply("...") if "alice" in json.dumps(request.body) else text_reply("for bob")

    fake_claude.fallback = reply
    key_file = tmp_path / "key"
    key_file.write_text(TEST_API_KEY + "\n")
    env = proxy_env(fake_claude.url, MCP_BACKFILL_CLIENT_TOKENS=f"alice={ALICE},bob={BOB}")
    del env["ANTHROPIC_API_KEY"]
    env["ANTHROPIC_API_KEY_FILE"] = str(key_file)  # the key from a secret file, too
    async with (
        run_sidecar("--max-concurrent-sampling", "2", upstream=SAMPLING_SERVER, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        alices = await open_session(http, sidecar.url, {"authorization": f"Bearer {ALICE}"})
        bobs = await open_session(http, sidecar.url, {"authorization": f"Bearer {BOB}"})

        async def essay(n: int) -> None:
            arguments = {"prompt": f"alice wants an essay {n}", "max_tokens": 50}
            params = {"name": "plain", "arguments": arguments}
            body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
            await http.post(sidecar.url, json=body, headers=as_client(ALICE, alices))

        async with anyio.create_task_group() as tg:
            for n in (1, 2):
                tg.start_soon(essay, n)
            assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, 1, 60.0)
            with anyio.fail_after(60):
                bobs_answer = await plain(http, sidecar, BOB, bobs, 3)
            tg.cancel_scope.cancel()
    assert bobs_answer["result"]["content"]["text"] == "for bob"
    asked = [json.dumps(request.body) for request in fake_claude.message_requests]
    assert sum("alice" in body for body in asked) == 1  # her second call waits for her own slot


async def test_2026_requests_of_different_clients_never_share_an_upstream(tmp_path: Path) -> None:
    """One upstream served every 2026-07-28 request, so a message it could not attribute went to
    whichever request was alone in flight — possibly another client's. Each client now has its own."""
    env = proxy_env(MCP_BACKFILL_CLIENT_TOKENS=f"alice={ALICE}\nbob={BOB}")
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        pids: dict[str, set[int]] = {"alice": set(), "bob": set()}
        for n, (name, token) in enumerate([("alice", ALICE), ("bob", BOB), ("alice", ALICE), ("bob", BOB)]):
            body = stateless_request(n, "tools/call", {"name": "pid", "arguments": {}})
            headers = {**stateless_headers("tools/call", "pid"), "authorization": f"Bearer {token}"}
            response = await http.post(sidecar.url, json=body, headers=headers)
            [reply] = response_messages(response)
            pids[name].add(json.loads(reply["result"]["content"][0]["text"])["pid"])
    assert len(pids["alice"]) == len(pids["bob"]) == 1
    assert pids["alice"] != pids["bob"]


async def test_a_secret_given_twice_or_from_an_unreadable_file_stops_the_proxy(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-a-file-0123456789")
    twice = proxy_env(ANTHROPIC_API_KEY="sk-0123456789", ANTHROPIC_API_KEY_FILE=str(key_file))
    missing = proxy_env(MCP_BACKFILL_AUTH_TOKEN_FILE=str(tmp_path / "nope"))
    outcomes = []
    for env in (twice, missing):
        argv = sidecar_argv(upstream=SAMPLING_SERVER, env=env)
        with anyio.fail_after(60):
            outcomes.append(await anyio.run_process(argv, env=env, check=False))
    assert [done.returncode for done in outcomes] == [2, 2]
    assert b"both ANTHROPIC_API_KEY and ANTHROPIC_API_KEY_FILE are set" in outcomes[0].stderr
    assert b"MCP_BACKFILL_AUTH_TOKEN_FILE: cannot read" in outcomes[1].stderr
    assert b"sk-from-a-file" not in outcomes[0].stderr


async def test_one_client_cannot_churn_sessions_for_everyone(tmp_path: Path) -> None:
    """Opening a session starts an upstream process: a client opening and deleting sessions in a loop
    is held to its own rate (`--client-session-rate`), and the others are not."""
    env = proxy_env(MCP_BACKFILL_CLIENT_TOKENS_FILE=str(token_file(tmp_path)))
    async with (
        run_sidecar(
            *("--provider", "mock", "--client-session-rate", "3"), upstream=SAMPLING_SERVER, env=env
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        alice = {"authorization": f"Bearer {ALICE}"}
        for _ in range(3):
            session = await open_session(http, sidecar.url, alice)
            assert (await http.delete(sidecar.url, headers=as_client(ALICE, session))).status_code == 200
        refused = await http.post(sidecar.url, json=initialize_body(), headers=as_client(ALICE))
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        rate = "(--client-session-rate / MCP_BACKFILL_CLIENT_SESSION_RATE)"
        assert f"at most 3 a minute for client 'alice' {rate}" in refused.text
        assert await open_session(http, sidecar.url, {"authorization": f"Bearer {BOB}"})
    assert sidecar.stderr().count("session opened") == 4  # the refused one started no upstream


async def test_with_a_metrics_token_no_client_reads_the_others_names_and_spend(tmp_path: Path) -> None:
    """`/metrics` took any client's token, and it names every client and what each has spent: one
    client could watch all the others. With `--metrics-token` only that token reads it (and it is
    no client token: `/mcp` refuses it)."""
    scraper = "prometheus-token-0123456789abcdef"
    env = proxy_env(
        MCP_BACKFILL_CLIENT_TOKENS_FILE=str(token_file(tmp_path)), MCP_BACKFILL_METRICS_TOKEN=scraper
    )
    options = ("--provider", "mock", "--client-budget-tokens", "1000")
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        bobs = await open_session(http, sidecar.url, {"authorization": f"Bearer {BOB}"})
        await plain(http, sidecar, BOB, bobs, 1)
        metrics = f"{sidecar.base}/metrics"
        as_alice = await http.get(metrics, headers={"authorization": f"Bearer {ALICE}"})
        assert as_alice.status_code == 401
        assert "--metrics-token" in as_alice.text
        assert "bob" not in as_alice.text
        scraped = await http.get(metrics, headers={"authorization": f"Bearer {scraper}"})
        assert scraped.status_code == 200
        assert 'client="bob"' in scraped.text
        as_client_of_mcp = await http.post(sidecar.url, json=initialize_body(), headers=as_client(scraper))
        assert as_client_of_mcp.status_code == 401
        stderr = sidecar.stderr()
    assert scraper not in stderr


async def test_no_named_client_shares_the_shared_tokens_identity() -> None:
    """A client named `default` in `--client-tokens` had the identity of every holder of the shared
    `--auth-token` (`default`): any of them could use its sessions (the 403 for another client's
    session did not apply), spend its budget, redeem its sealed request state and share its
    2026-07-28 upstream. The name is refused while `--auth-token` is set."""
    shared = "shared-token-0123456789abcdef"
    env = proxy_env(MCP_BACKFILL_AUTH_TOKEN=shared, MCP_BACKFILL_CLIENT_TOKENS=f"default={ALICE},bob={BOB}")
    argv = sidecar_argv("--provider", "mock", upstream=SAMPLING_SERVER, env=env)
    process = await anyio.open_process(argv, env=env)
    try:
        with anyio.move_on_after(30):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 2, "the sidecar started with a client named like the shared token's"
    assert process.stderr is not None
    stderr = (await process.stderr.receive()).decode()
    assert "--client-tokens / MCP_BACKFILL_CLIENT_TOKENS" in stderr, stderr
    assert "'default'" in stderr, stderr
    assert "--auth-token" in stderr, stderr
    assert ALICE not in stderr
    assert shared not in stderr
