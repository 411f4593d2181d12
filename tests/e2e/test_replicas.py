"""Three `mcp-backfill serve` replicas sharing one spend ledger, on loopback, all real processes:

    raw HTTP clients --> HAProxy (deploy/haproxy/haproxy.cfg) --> 3 x `mcp-backfill serve`
                                                                     |--> one MCP server (HTTP)
                                                                     |--> redis-server (the ledger)
                                                                     \\--> fake Claude

Per-client budgets, rate limits and slots hold across the replicas; a 2026-07-28 mixed round can be
continued on another replica; handshake sessions stick to their replica and recover when it dies;
sampling is refused while Redis is down and resumes when it is back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis.asyncio as aioredis
from anyio.abc import Process

from mcp_backfill.sampling.estimate import reservation_for
from tests.fake_claude import FakeClaude, hang_reply, text_reply
from tests.harness import (
    ROOT,
    free_port,
    proxy_env,
    python_http_server,
    python_server,
    stop_process,
    wait_for_port,
)
from tests.services import RedisServer, binary, redis_server, restart_redis, stop_redis
from tests.sidecar_harness import HANDSHAKE_HEADERS, HTTP_TIMEOUT, Sidecar, response_messages, run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

HAPROXY_CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
UPSTREAM = [*python_server("resolve_server.py"), "--http", "127.0.0.1:0"]
VERSION = "2026-07-28"
TOKENS = {name: f"{name}-token-0123456789abcdef" for name in ("alice", "bob", "carol", "dave", "eve")}
CLIENT_BUDGET = 1500
CLIENT_RATE = 6
CLIENT_SLOTS = 2
LEASE = 2.0
LIMITS = (
    "--client-budget-tokens",
    str(CLIENT_BUDGET),
    "--client-rate-limit",
    str(CLIENT_RATE),
    "--client-max-concurrent-sampling",
    str(CLIENT_SLOTS),
    "--max-concurrent-sampling",
    "8",
    "--state-store-lease",
    str(LEASE),
)


@dataclass
class Cluster:
    redis: RedisServer
    replicas: list[Sidecar]
    front: str
    ledger: aioredis.Redis

    async def used(self, payer: str) -> int:
        return int(await self.ledger.get(f"mcp-backfill:used:{payer}") or 0)

    async def settled(self, payer: str) -> None:
        """Until no call of the payer holds a reservation (settlements land just after answers)."""
        with anyio.fail_after(10):
            while await self.ledger.hlen(f"mcp-backfill:resamt:{payer}"):
                await anyio.sleep(0.02)


@asynccontextmanager
async def haproxy(front_port: int, replicas: Sequence[int]) -> AsyncIterator[Process]:
    env = {
        **proxy_env(),
        "MCP_FRONT": f"127.0.0.1:{front_port}",
        "MCP_HOST": f"127.0.0.1:{front_port}",
        **{f"REPLICA_{n}": f"127.0.0.1:{port}" for n, port in enumerate(replicas, 1)},
    }
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "haproxy.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [binary("haproxy", "haproxy"), "-db", "-f", str(HAPROXY_CONFIG)],
                stdout=log,
                stderr=log,
                env=env,
            )
        try:
            await wait_for_port(front_port, process, log_path)
            yield process
        finally:
            await stop_process(process)


@asynccontextmanager
async def cluster(
    fake: FakeClaude, *options: str, replicas: int = 3, front: bool = True
) -> AsyncIterator[Cluster]:
    """`replicas` sidecars (each its own port, with `options`) in front of one HTTP upstream, one
    Redis, HAProxy."""
    front_port = free_port()
    ports = [free_port() for _ in range(replicas)]
    async with AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server())
        upstream = await stack.enter_async_context(python_http_server(UPSTREAM))
        env = proxy_env(
            fake.url,
            MCP_BACKFILL_CLIENT_TOKENS="\n".join(f"{name}={token}" for name, token in TOKENS.items()),
            MCP_BACKFILL_REQUEST_STATE_KEY="a-key-shared-by-the-replicas-0123456789",
            MCP_BACKFILL_STATE_STORE=redis.url,
            MCP_BACKFILL_UPSTREAM_URL=upstream.url,
        )
        sidecars = []
        for port in ports:
            allowed = f"127.0.0.1:{port},127.0.0.1:{front_port}"
            own = {**env, "MCP_BACKFILL_PORT": str(port), "MCP_BACKFILL_ALLOWED_HOSTS": allowed}
            sidecars.append(await stack.enter_async_context(run_sidecar(*LIMITS, *options, env=own)))
        if front:
            await stack.enter_async_context(haproxy(front_port, ports))
        ledger = aioredis.Redis.from_url(redis.url)
        stack.push_async_callback(ledger.aclose)
        yield Cluster(redis, sidecars, f"http://127.0.0.1:{front_port}/mcp", ledger)


# -- raw MCP over HTTP ---------------------------------------------------------------------------


def stateless(request_id: Any, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-2026", "version": "0"},
    }
    body = {"name": name, "arguments": arguments, **params, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": body}


def headers_for(client: str, **more: str) -> dict[str, str]:
    return {**HANDSHAKE_HEADERS, "authorization": f"Bearer {TOKENS[client]}", **more}


@dataclass
class Answer:
    replica: str | None
    reply: dict[str, Any]

    @property
    def error(self) -> str | None:
        error = self.reply.get("error")
        return str(error["message"]) if error else None

    def tool(self) -> Any:
        """The tool's JSON result (it must have succeeded)."""
        assert "result" in self.reply, self.reply
        result = self.reply["result"]
        assert not result.get("isError"), result
        return json.loads(result["content"][0]["text"])


async def call_2026(
    http: httpx2.AsyncClient, url: str, client: str, request_id: Any, name: str, **arguments: Any
) -> Answer:
    return await post_2026(http, url, client, stateless(request_id, name, arguments))


async def post_2026(http: httpx2.AsyncClient, url: str, client: str, body: dict[str, Any]) -> Answer:
    routing = {
        "mcp-protocol-version": VERSION,
        "mcp-method": "tools/call",
        "mcp-name": body["params"]["name"],
    }
    response = await http.post(url, json=body, headers=headers_for(client, **routing))
    assert response.status_code == 200 or "error" in response.json(), response.text
    replies = [m for m in response_messages(response) if m.get("id") == body["id"]]
    assert len(replies) == 1, response.text
    return Answer(response.headers.get("x-replica"), replies[0])


@dataclass
class Session:
    id: str
    replica: str | None


async def open_session(http: httpx2.AsyncClient, url: str, client: str) -> Session:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    response = await http.post(url, json=init, headers=headers_for(client))
    assert response.status_code == 200, response.text
    session = Session(response.headers["mcp-session-id"], response.headers.get("x-replica"))
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ack = await http.post(url, json=done, headers=session_headers(client, session))
    assert ack.status_code == 202, ack.text
    return session


def session_headers(client: str, session: Session) -> dict[str, str]:
    return headers_for(client, **{"mcp-session-id": session.id, "mcp-protocol-version": "2025-11-25"})


async def echo_in(
    http: httpx2.AsyncClient, url: str, client: str, session: Session, text: str
) -> httpx2.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }
    return await http.post(url, json=body, headers=session_headers(client, session))


def echoed(response: httpx2.Response) -> str:
    assert response.status_code == 200, response.text
    [reply] = [m for m in response_messages(response) if m.get("id") == 1]
    return str(json.loads(reply["result"]["content"][0]["text"])["text"])


def prompts_of(fake: FakeClaude, marker: str) -> list[dict[str, Any]]:
    """The Claude requests whose prompt contains `marker`."""
    return [r.body for r in fake.message_requests if marker in json.dumps(r.body["messages"])]


async def ledger_ms(ledger: aioredis.Redis) -> float:
    """The ledger's own clock (Redis `TIME`), in ms: what lease expiries are measured against."""
    seconds, micros = await ledger.time()
    return seconds * 1000 + micros / 1000


# -- the tests -----------------------------------------------------------------------------------


async def test_budgets_rate_limits_slots_and_mixed_rounds_hold_across_replicas(
    fake_claude: FakeClaude,
) -> None:
    async with cluster(fake_claude) as c, httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
        # A client's token budget: three workers spend alice's budget through HAProxy, spread over
        # all replicas, until it is refused. The ledger may be overrun by at most one call.
        answers: list[Answer] = []

        async def spend_alice(worker: int) -> None:
            for n in range(20):
                answer = await call_2026(
                    http, c.front, "alice", f"a{worker}.{n}", "summarize", text=f"alice {'x' * 1800}"
                )
                answers.append(answer)
                if answer.error is not None:
                    return

        async with anyio.create_task_group() as tg:
            for worker in range(3):
                tg.start_soon(spend_alice, worker)
        refusals = [a.error for a in answers if a.error is not None]
        assert len(refusals) == 3
        assert all("token budget of client 'alice' is exhausted" in r for r in refusals), refusals
        assert {a.replica for a in answers} == {"r1", "r2", "r3"}
        answered = [a for a in answers if a.error is None]
        assert 2 <= len(answered) < 3 * 20
        alice_calls = prompts_of(fake_claude, "alice")
        assert len(alice_calls) == len(answered)  # a refused request never reached Claude
        one_reservation = max(reservation_for(body).total for body in alice_calls)
        await c.settled("client:alice")
        charged = await c.used("client:alice")
        assert CLIENT_BUDGET <= charged <= CLIENT_BUDGET + one_reservation
        assert fake_claude.served_tokens() <= await c.used("process")  # nothing served went uncharged

        # A client's rate limit: bob's 8 requests in a row, round robin over the replicas.
        bob = [await call_2026(http, c.front, "bob", f"b{n}", "summarize", text="bob") for n in range(8)]
        assert [a.error is None for a in bob] == [True] * CLIENT_RATE + [False] * (8 - CLIENT_RATE)
        assert all("rate limit of client 'bob' reached" in str(a.error) for a in bob[CLIENT_RATE:])
        assert {a.replica for a in bob} == {"r1", "r2", "r3"}

        # A client's concurrency cap: carol's 6 slow requests at once, 2 per replica.
        fake_claude.reset()
        fake_claude.enqueue(*[text_reply("slow", delay=0.5) for _ in range(6)])
        carol: list[Answer] = []

        async def ask_carol(n: int) -> None:
            carol.append(await call_2026(http, c.front, "carol", f"c{n}", "summarize", text="carol"))

        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(ask_carol, n)
        assert [a.error for a in carol] == [None] * 6
        assert {a.replica for a in carol} == {"r1", "r2", "r3"}
        assert fake_claude.max_in_flight == CLIENT_SLOTS

        # A 2026-07-28 mixed round: replica 1 answers the sampling and hands the elicitation to the
        # client; the client's retry goes to replica 2, which opens the sealed state.
        first, second = (replica.url for replica in c.replicas[:2])
        fake_claude.enqueue(text_reply("Proceeding with the plan."))
        round_one = await call_2026(http, first, "dave", "m1", "confirm_and_ask", question="Proceed?")
        result = round_one.reply["result"]
        assert result["resultType"] == "input_required"
        [(key, question)] = result["inputRequests"].items()
        assert question["method"] == "elicitation/create"
        retry = stateless(
            "m2",
            "confirm_and_ask",
            {"question": "Proceed?"},
            inputResponses={key: {"action": "accept", "content": {"ok": True}}},
            requestState=result["requestState"],
        )
        final = await post_2026(http, second, "dave", retry)
        assert final.tool() == {"ok": True, "text": "Proceeding with the plan."}
        assert len(prompts_of(fake_claude, "Proceed?")) == 1  # the retry did not sample again
        # Another client cannot redeem dave's state.
        stolen = await post_2026(http, second, "eve", {**retry, "id": "m3"})
        assert "requestState expired or unknown" in str(stolen.error)


async def test_an_allow_once_buys_one_sampling_whichever_replica_the_replay_reaches(
    fake_claude: FakeClaude,
) -> None:
    """A sealed approval token was single-use per replica only: replaying the retry that allowed
    sampling "once" to another replica sampled, and billed, again. The ledger store now claims
    each such token once for all the replicas sharing it."""
    async with (
        cluster(fake_claude, "--approve", "elicit", replicas=2, front=False) as c,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first, second = (replica.url for replica in c.replicas)
        asked = await call_2026(http, first, "dave", "q1", "summarize", text="approve me")
        result = asked.reply["result"]
        assert result["resultType"] == "input_required"
        assert list(result["inputRequests"]) == ["mcp-backfill-approval"]
        allow = {"action": "accept", "content": {"decision": "allow_once"}}
        retry = stateless(
            "q2",
            "summarize",
            {"text": "approve me"},
            inputResponses={"mcp-backfill-approval": allow},
            requestState=result["requestState"],
        )
        fake_claude.enqueue(text_reply("Summary."))
        assert (await post_2026(http, first, "dave", retry)).tool()["text"] == "Summary."
        for replica in (second, first):
            fake_claude.enqueue(text_reply("Summary again."))
            replayed = await post_2026(http, replica, "dave", {**retry, "id": "q3"})
            assert "requestState expired or unknown" in str(replayed.error)
        assert len(prompts_of(fake_claude, "approve me")) == 1


async def test_sessions_stick_to_their_replica_and_recover_when_it_dies(fake_claude: FakeClaude) -> None:
    async with cluster(fake_claude) as c, httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
        sessions = [await open_session(http, c.front, "dave") for _ in range(20)]
        assert {s.replica for s in sessions} == {"r1", "r2", "r3"}
        for n, session in enumerate(sessions):
            response = await echo_in(http, c.front, "dave", session, f"hello {n}")
            assert echoed(response) == f"hello {n}"
            assert response.headers["x-replica"] == session.replica  # answered by its own replica

        # A call in flight on replica 2 holds a reservation in the ledger when the replica dies.
        victim = c.replicas[1]
        fake_claude.enqueue(hang_reply("Once"))

        async def doomed() -> None:
            with pytest.raises(httpx2.HTTPError):
                await call_2026(http, victim.url, "eve", "e1", "summarize", text="eve")

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            with anyio.fail_after(30):  # reserved, and the call reached Claude
                while not (
                    prompts_of(fake_claude, "eve") and await c.ledger.hlen("mcp-backfill:resamt:client:eve")
                ):
                    await anyio.sleep(0.02)
            [(lease, held)] = (await c.ledger.hgetall("mcp-backfill:resamt:client:eve")).items()
            os.kill(victim.process.pid, signal.SIGKILL)
        await victim.process.wait()

        # Its sessions are gone: 404, and a new initialize works; the others go on.
        for n, session in enumerate(sessions):
            response = await echo_in(http, c.front, "dave", session, f"again {n}")
            if session.replica == "r2":
                assert response.status_code == 404, response.text
                fresh = await open_session(http, c.front, "dave")
                assert fresh.replica in ("r1", "r3")
                assert echoed(await echo_in(http, c.front, "dave", fresh, f"new {n}")) == f"new {n}"
            else:
                assert echoed(response) == f"again {n}"
                assert response.headers["x-replica"] == session.replica

        # The dead replica's reservation lapses with its lease, and is charged whole (nobody is left
        # to say what the call cost); nothing stays reserved. Lapsed reservations are collected by
        # the payer's next admission, so one probe after the expiry collects it.
        with anyio.fail_after(LEASE + 10):
            while True:  # nobody renews the lease now; its expiry is read afresh all the same
                expiry = await c.ledger.zscore("mcp-backfill:res:client:eve", lease)
                assert expiry is not None
                if await ledger_ms(c.ledger) > expiry:
                    break
                await anyio.sleep(0.05)
        assert (await call_2026(http, c.front, "eve", "e2", "echo", text="tick")).error is None
        probe = await call_2026(http, c.replicas[0].url, "eve", "e3", "summarize", text="eve again")
        assert probe.error is None
        await c.settled("client:eve")  # the probe's own reservation is settled just after its answer
        assert await c.ledger.zcard("mcp-backfill:res:client:eve") == 0
        assert await c.used("client:eve") >= int(held)


async def test_sampling_is_refused_while_redis_is_down_and_resumes_after(fake_claude: FakeClaude) -> None:
    async with (
        cluster(fake_claude, replicas=1, front=False) as c,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        [replica] = c.replicas
        assert (await call_2026(http, replica.url, "alice", 1, "summarize", text="before")).error is None
        assert (await http.get(f"{replica.base}/readyz")).status_code == 200

        await stop_redis(c.redis)
        refused = await call_2026(http, replica.url, "alice", 2, "summarize", text="during")
        assert refused.error is not None
        assert f"the state store {c.redis.url} is unavailable" in refused.error
        assert "--state-store-outage" in refused.error
        assert (await call_2026(http, replica.url, "alice", 3, "echo", text="relayed")).tool() == {
            "text": "relayed"
        }
        ready = await http.get(f"{replica.base}/readyz")
        assert ready.status_code == 503
        assert ready.json()["store_status"] == "unavailable"
        assert (await http.get(f"{replica.base}/healthz")).status_code == 200
        metrics = await http.get(
            f"{replica.base}/metrics", headers={"authorization": f"Bearer {TOKENS['alice']}"}
        )
        assert 'mcp_backfill_state_store_errors_total{operation="admit"}' in metrics.text
        assert len(prompts_of(fake_claude, "during")) == 0

        await restart_redis(c.redis)
        with anyio.fail_after(15):
            while (await http.get(f"{replica.base}/readyz")).status_code != 200:
                await anyio.sleep(0.2)
        after = await call_2026(http, replica.url, "alice", 4, "summarize", text="after")
        assert after.error is None
        assert after.tool()["text"]
    assert "state store available again" in replica.stderr()


async def _fake_replica(
    port: int, seen: list[bytes], *, status: int | None
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A listener, bound now and served by what this returns. It answers `/readyz` (so HAProxy keeps it
    up) and reads every other request whole; then answers it with `status`, or (None) closes the
    connection without an answer, like a replica killed while it ran the request."""

    async def serve(stream: Any) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                try:
                    data += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            while length and len(body) < int(length[1]):  # the whole request, as a replica reads it
                try:
                    body += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
            line = head.split(b"\r\n", 1)[0]
            code = 200 if line.startswith(b"GET /readyz ") else status
            if code is not None:
                await stream.send(b"HTTP/1.1 %d -\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok" % code)
            if not line.startswith(b"GET /readyz "):
                session = re.search(rb"(?im)^mcp-session-id: *(\S+)", head)
                seen.append(line + (b" in " + session[1] if session else b""))

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)

    async def run() -> None:
        await listener.serve(serve)

    return run


async def _post_in_one_write(port: int, body: bytes, session: str = "") -> bytes:
    """A POST to /mcp sent in one write (as a client sending a small request does; HAProxy can only
    retry a request it holds whole), and the answer, read until the connection closes."""
    head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += f"Mcp-Session-Id: {session}\r\n" if session else ""
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    answer = b""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(head.encode() + body)
        with anyio.fail_after(HTTP_TIMEOUT):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return answer


async def test_a_request_a_replica_took_then_died_on_is_not_sent_to_another() -> None:
    """HAProxy retries on another replica only a request no replica got (connection refused): one
    that a replica read and then died on may have run a tool and been billed by Claude, so sending
    it again would run and bill it twice."""
    front_port, ports = free_port(), [free_port() for _ in range(3)]
    seen: list[bytes] = []
    async with anyio.create_task_group() as tg:
        for port in ports:
            tg.start_soon(await _fake_replica(port, seen, status=None))
        async with haproxy(front_port, ports):
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "bill_me"}}
            for n in range(3):  # one request per replica, whichever comes first in the round robin
                answer = await _post_in_one_write(front_port, json.dumps(call).encode())
                assert answer.startswith(b"HTTP/1.1 502 "), answer
                assert seen == [b"POST /mcp HTTP/1.1"] * (n + 1), seen
        tg.cancel_scope.cancel()


async def test_a_request_goes_to_another_replica_when_one_refuses_the_connection() -> None:
    """The retry that stays: a replica that is gone (nothing listens) costs the client nothing."""
    front_port, gone, *ports = [free_port() for _ in range(4)]
    seen: list[bytes] = []
    async with anyio.create_task_group() as tg:
        for port in ports:
            tg.start_soon(await _fake_replica(port, seen, status=200))
        async with haproxy(front_port, [gone, *ports]), httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            for _ in range(6):  # round robin: two of them are first sent to the replica that is gone
                response = await http.post(f"http://127.0.0.1:{front_port}/mcp", json={})
                assert response.status_code == 200, response.text
        tg.cancel_scope.cancel()
    assert seen == [b"POST /mcp HTTP/1.1"] * 6


async def test_a_request_a_draining_replica_refused_goes_to_another() -> None:
    """A replica answers 503 only for what it refused before doing anything: a new session or a
    2026-07-28 request while it drains (it keeps accepting connections for the requests in flight),
    a full `--max-sessions`. HAProxy sends such a request to another replica, as it does one whose
    connection was refused, instead of failing it during the second before the health check sees
    the replica go."""
    front_port, refusing, *ports = [free_port() for _ in range(4)]
    refused: list[bytes] = []
    served: list[bytes] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(await _fake_replica(refusing, refused, status=503))
        for port in ports:
            tg.start_soon(await _fake_replica(port, served, status=200))
        async with haproxy(front_port, [refusing, *ports]):
            for _ in range(6):  # round robin: two of them are first sent to the refusing replica
                answer = await _post_in_one_write(front_port, b"{}")
                assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert refused
            assert served == [b"POST /mcp HTTP/1.1"] * 6
            # A session's request stays where the session is: another replica would answer 404 and
            # end the session, whose requests in flight the draining replica is finishing.
            refused.clear()
            answers = [await _post_in_one_write(front_port, b"{}", f"s{n}") for n in range(6)]
        tg.cancel_scope.cancel()
    assert sorted(refused + served[6:]) == sorted(f"POST /mcp HTTP/1.1 in s{n}".encode() for n in range(6))
    assert sum(answer.startswith(b"HTTP/1.1 503 ") for answer in answers) == len(refused) > 0
