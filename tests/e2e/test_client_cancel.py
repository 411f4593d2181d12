"""A client cancels a request whose server ignores the cancel and samples on: the proxy stops paying.

client (raw stdio, or raw HTTP to `serve`) -> mcp-backfill --upstream-url -> tests/servers/sampling_server.py
over streamable HTTP (its `stubborn_sample` tool shields its sampling from the cancel)
                                                                      \\-> fake Claude

Over a streamable-HTTP upstream a server request that arrives on the response stream of the POST
that carried the client's request belongs to that request: when the client cancels it, the Claude
call answering such a sampling request is cut (and charged), the server is answered -32800, and a
later sampling request on that stream is refused without calling Claude.

Nothing here waits on time: each step waits for what the previous one caused (Claude's request, the
report the server writes). The one bound is the proxy's: it closes a cancelled request's stream 1 s
after the cancel (`finish_timeout`), and the server's second sampling request, sent as soon as the
first is answered, must arrive on it before then (milliseconds, even on a loaded machine).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fake_claude import FakeClaude, hang_reply
from tests.harness import (
    SERVERS,
    initialize_params,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    raw_proxy,
)
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    open_session,
    response_messages,
    run_sidecar,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = [sys.executable, str(SERVERS / "sampling_server.py"), "--http", "127.0.0.1:0"]
# Generous: under load a proxy, its upstream and the first Claude client import take seconds.
SLOW = 60.0
MAX_TOKENS = 400

Send = Callable[[dict[str, Any]], Awaitable[None]]


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def wait_for_file(path: Path) -> Any:
    """The JSON a test server wrote to `path` (it renames a whole file into place)."""
    with anyio.fail_after(SLOW):
        while not path.exists():
            await anyio.sleep(0.05)
    return json.loads(path.read_text())


async def wait_for_audit(path: Path, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(SLOW):
        while len(lines := audit_lines(path)) < count:
            await anyio.sleep(0.05)
    return lines


def stubborn_call(request_id: Any, report: Path) -> dict[str, Any]:
    arguments = {"report": str(report), "max_tokens": MAX_TOKENS}
    params = {"name": "stubborn_sample", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def plain_call(request_id: Any) -> dict[str, Any]:
    params = {"name": "plain", "arguments": {"prompt": "still there?"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def cancel(request_id: Any) -> dict[str, Any]:
    params = {"requestId": request_id, "reason": "changed my mind"}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


async def cancel_while_claude_answers(fake: FakeClaude, send: Send, tmp_path: Path, request_id: Any) -> Any:
    """The stubborn tool called as `request_id`, cancelled once Claude is on its first sampling
    request; returns what the server's tool reported."""
    report = tmp_path / "report.json"
    fake.enqueue(hang_reply("Once upon a time"))
    await send(stubborn_call(request_id, report))
    assert await fake.await_requests(1, timeout=SLOW)  # Claude is on the first sampling request
    await send(cancel(request_id))
    return await wait_for_file(report)


def check_cut_and_charged(fake: FakeClaude, report: Any, audit: Path, request_id: Any) -> None:
    for name in ("first", "second"):
        error = report[name]["error"]
        assert error["code"] == -32800, report
        assert f"client cancelled request {json.dumps(request_id)}" in error["message"]
    assert report["cancelSeen"] is True  # the client's cancel still reached the server
    assert len(fake.message_requests) == 1  # the second sampling request cost nothing
    assert fake.disconnects == 1  # the Claude stream of the first was cut
    line, refusal = audit_lines(audit)
    assert line["outcome"] == "cancelled"
    assert line["charged"]["output_tokens"] == MAX_TOKENS  # Claude may have written all of it
    assert line["charged"]["input_tokens"] > 0
    # The second sampling request is in the audit log too: refused, and charged nothing.
    assert (refusal["outcome"], refusal["error"]["code"], refusal["calls"]) == ("refused", -32800, 0)
    assert refusal["charged"] is None


async def test_a_client_cancel_cuts_the_sampling_of_its_request_over_an_http_upstream(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    async with python_http_server(SAMPLING_SERVER) as upstream:
        argv = proxy_url_argv("--audit-log", str(audit), url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            report = await cancel_while_claude_answers(fake_claude, session.send, tmp_path, 7)
            await wait_for_audit(audit, 2)
            check_cut_and_charged(fake_claude, report, audit, 7)
            # A request not tied to the cancelled one samples as before.
            again = await session.request(8, "tools/call", plain_call(8)["params"])
            await session.close_stdin()
            await session.wait(SLOW)
    assert "result" in again, again
    assert json.loads(again["result"]["content"][0]["text"])["text"].startswith("fake-claude says")
    assert [line["outcome"] for line in audit_lines(audit)] == ["cancelled", "refused", "answered"]


async def test_a_client_cancel_cuts_the_sampling_of_its_request_through_an_http_sidecar(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The same through `serve --upstream-url`: the client's cancel reaches the relay too."""
    audit = tmp_path / "audit.jsonl"
    answers: dict[Any, list[Any]] = {}
    async with (
        python_http_server(SAMPLING_SERVER) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, "--audit-log", str(audit), env=proxy_env(fake_claude.url)
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        anyio.create_task_group() as tg,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}

        async def post_request(message: dict[str, Any]) -> None:
            response = await http.post(sidecar.url, json=message, headers=headers)
            answers[message["id"]] = response_messages(response)

        async def send(message: dict[str, Any]) -> None:
            if "id" in message:
                tg.start_soon(post_request, message)
                return
            ack = await http.post(sidecar.url, json=message, headers=headers)
            assert ack.status_code == 202, ack.text

        report = await cancel_while_claude_answers(fake_claude, send, tmp_path, "call-7")
        await wait_for_audit(audit, 2)
        check_cut_and_charged(fake_claude, report, audit, "call-7")
        await post_request(plain_call("call-8"))
    [cancelled] = [m for m in answers["call-7"] if "method" not in m]
    assert cancelled["error"]["code"] == -32800  # the client's POST was answered at once
    [after] = answers["call-8"]
    assert json.loads(after["result"]["content"][0]["text"])["text"].startswith("fake-claude says")
    assert [line["outcome"] for line in audit_lines(audit)] == ["cancelled", "refused", "answered"]
