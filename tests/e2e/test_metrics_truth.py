"""What `serve` reports — `/metrics`, the audit log — against what the fake Claude API served.

A real `mcp-backfill serve` (the anthropic provider against tests/fake_claude.py) serves real MCP
clients and servers; each test ends sampling calls one way and reads back the proxy's reports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from tests.e2e.test_client_cancel import SAMPLING_SERVER as STUBBORN_SERVER
from tests.e2e.test_client_cancel import cancel_while_claude_answers
from tests.e2e.test_tasks import HELLO, ask
from tests.e2e.test_tracing import named, otel_env
from tests.fake_claude import (
    FakeClaude,
    error_reply,
    hang_reply,
    message_reply,
    text_reply,
    truncated_stream_reply,
)
from tests.harness import (
    free_port,
    initialize_params,
    proxy_argv,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    python_server,
    raw_proxy,
    tool_json,
)
from tests.otlp_receiver import ReceivedSpan, otlp_receiver
from tests.sidecar_harness import HANDSHAKE_HEADERS, HTTP_TIMEOUT, open_session, run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
ECHO_SERVER = python_server("echo_server.py")
# One sample line of the text exposition format (0.0.4): name, labels (values escaped: \\ \" \n
# only), a value. https://prometheus.io/docs/instrumenting/exposition_formats/
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE_LINE = re.compile(
    rf"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE}"
    rf"(?:,[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE})*\}})? \S+$"
)


def plain(text: str, timeout: float = 30.0) -> dict[str, Any]:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 20}
    return {"params_json": json.dumps(params), "timeout": timeout}


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def wait_for_audit(path: Path, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(60):
        while len(lines := audit_lines(path)) < count:
            await anyio.sleep(0.05)
    return lines


_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of `name` in an exposition: its labels (values as written) and value."""
    found = []
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match is not None and match.group(1) == name:
            labels = dict(_PAIR.findall(match.group(2) or ""))
            found.append((labels, float(match.group(3))))
    return found


def summed(text: str, name: str, by: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for labels, value in series(text, name):
        totals[labels.get(by, "")] = totals.get(labels.get(by, ""), 0.0) + value
    return totals


def exposition_problems(text: str) -> list[str]:
    return [
        line
        for line in text.split("\n")[:-1]
        if not (line.startswith(("# HELP ", "# TYPE ")) or _SAMPLE_LINE.match(line))
    ]


async def test_metrics_stay_readable_whatever_model_name_the_api_reports(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A gateway may report any model string: one UTF-8 cannot encode (a lone surrogate, which JSON
    allows) or one with quotes, backslashes and line breaks still leaves `/metrics` valid."""
    odd = ['say "hi"\\\nback', "lone \ud800 surrogate"]
    fake_claude.enqueue(*(text_reply("fine", model=model) for model in odd))
    async with (
        run_sidecar(upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        assert "result" in tool_json(await client.call_tool("sample_raw", plain("one")))
        # The SDK's server cannot read the answer with the lone surrogate (pydantic refuses one): it
        # gives up waiting, soon. The proxy answered it all the same.
        await client.call_tool("sample_raw", plain("two", timeout=2.0))
        assert len(fake_claude.message_requests) == 2
        scrape = await http.get(f"{sidecar.base}/metrics")
    assert scrape.status_code == 200, scrape.text
    text = scrape.content.decode("utf-8")  # strict: the format is UTF-8
    assert exposition_problems(text) == []
    assert 'model="say \\"hi\\"\\\\\\nback"' in text
    answered = [
        line for line in text.splitlines() if line.startswith("mcp_backfill_sampling_requests_total{")
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in answered) == 2, answered


def messages(count: int, max_tokens: int = 20) -> dict[str, Any]:
    said = [{"role": "user", "content": {"type": "text", "text": f"part {n}"}} for n in range(count)]
    return {"params_json": json.dumps({"messages": said, "maxTokens": max_tokens})}


async def test_metrics_and_the_audit_log_agree_on_every_way_a_call_ends(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Answered, failed (an API error), timed out (`--sampling-timeout`), cancelled by the server,
    refused by a limit: `/metrics` counts each outcome the audit log writes, the tokens it reports
    are the audit log's `charged` (at least what the fake Claude served), and the latency histogram
    counts the requests a call was made for."""
    audit = tmp_path / "audit.jsonl"
    options = ["--audit-log", str(audit), "--sampling-timeout", "3", "--max-messages", "2"]
    options += ["--budget-tokens", "1000000", "--retry-max-attempts", "1"]
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        fake_claude.enqueue(text_reply("fine"))
        assert "result" in tool_json(await client.call_tool("sample_raw", plain("answered")))
        fake_claude.enqueue(error_reply(400, "invalid_request_error", "no"))
        assert "error" in tool_json(await client.call_tool("sample_raw", plain("failed")))
        fake_claude.enqueue(hang_reply("Once upon"))
        assert "error" in tool_json(await client.call_tool("sample_raw", plain("timed out")))
        assert "error" in tool_json(await client.call_tool("sample_raw", messages(3)))
        fake_claude.enqueue(hang_reply("Long ago"))
        cancelled = tool_json(await client.call_tool("slow_sample", {"cancel_after": 1.0}))
        assert cancelled["outcome"] == "timed_out", cancelled
        lines = await wait_for_audit(audit, 5)
        scrape = (await http.get(f"{sidecar.base}/metrics")).text
    outcomes = sorted(line["outcome"] for line in lines)
    assert outcomes == ["answered", "cancelled", "failed", "refused", "timed_out"], lines
    assert exposition_problems(scrape) == []
    counted = summed(scrape, "mcp_backfill_sampling_requests_total", "outcome")
    assert counted == dict.fromkeys(outcomes, 1.0), counted
    charged: dict[str, float] = {}
    for line in lines:
        for counter, tokens in (line["charged"] or {}).items():
            if tokens:
                charged[counter] = charged.get(counter, 0) + tokens
    assert summed(scrape, "mcp_backfill_sampling_tokens_total", "counter") == charged
    assert sum(charged.values()) >= fake_claude.served_tokens() > 0
    [(_, used)] = series(scrape, "mcp_backfill_budget_used_tokens")
    assert used == sum(charged.values())
    made = [line for line in lines if line["calls"]]
    [(_, timed)] = series(scrape, "mcp_backfill_claude_latency_seconds_count")
    assert timed == len(made), lines
    # Attempts at Claude calls: one per call made (no retries here), none for the refusal.
    attempts = series(scrape, "mcp_backfill_claude_attempts_total")
    assert sum(value for _, value in attempts) == sum(line["calls"] for line in lines), attempts


async def test_the_stdio_summary_counts_the_calls_the_audit_log_counts(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A call whose first attempt broke off mid-stream (billed, charged) and was retried is one
    call in the audit log; the exit summary counted it twice (once per charge)."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(truncated_stream_reply("Partial"), text_reply("whole"))
    argv = proxy_argv("--audit-log", str(audit), "--retry-base-delay", "0.01", upstream=ECHO_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = {"method": "sampling/createMessage", "params": json.loads(plain("x")["params_json"]), "id": "s"}
        answer = await session.request(1, "test/ask_client", ask)
        await session.close_stdin()
        await session.wait(30)
        stderr = session.stderr()
    assert "result" in answer, answer
    assert len(fake_claude.message_requests) == 2
    [line] = audit_lines(audit)
    [summary] = [text for text in stderr.splitlines() if "sampling summary" in text]
    assert f"calls={line['calls']} " in summary, (line, summary)
    assert f"tokens={sum(line['charged'].values())}" in summary, (line, summary)


async def test_a_call_that_never_left_this_machine_is_no_call_in_the_reports(tmp_path: Path) -> None:
    """The API cannot be reached (nothing listens): no attempt left this machine, so Claude was never
    called. The audit line says `calls: 0` and the exit summary counts no call; both said one was made
    (the docs' "calls made", and the faults table's "Claude was never called")."""
    audit = tmp_path / "audit.jsonl"
    argv = proxy_argv("--audit-log", str(audit), "--retry-base-delay", "0.01", upstream=ECHO_SERVER)
    unreachable = f"http://127.0.0.1:{free_port()}"  # bound then let go: nothing listens there
    async with raw_proxy(argv, proxy_env(unreachable)) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = {"method": "sampling/createMessage", "params": json.loads(plain("x")["params_json"]), "id": "s"}
        answer = await session.request(1, "test/ask_client", ask)
        await session.close_stdin()
        await session.wait(30)
        stderr = session.stderr()
    assert answer["result"]["client_response"]["error"]["data"]["type"] == "connection_error", answer
    [line] = audit_lines(audit)
    assert (line["outcome"], line["calls"], line["charged"]) == ("failed", 0, None), line
    summaries = [text for text in stderr.splitlines() if "sampling summary" in text]
    assert all("calls=0 " in text for text in summaries), summaries


async def test_a_call_cut_by_the_clients_cancel_is_reported_as_the_audit_log_has_it(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`serve --upstream-url`, a named client: its cancel cuts the Claude call made for its request
    (charged), and the server's next sampling request for it is refused without a call. `/metrics`
    has the cut call under the client's name, with the audit log's tokens, as a cancelled attempt;
    the refusal is no Claude call. The client's token appears nowhere."""
    audit = tmp_path / "audit.jsonl"
    token = "alice-secret-token-0123456789"
    env = {**proxy_env(fake_claude.url), "MCP_BACKFILL_CLIENT_TOKENS": f"alice={token}"}
    async with (
        python_http_server(STUBBORN_SERVER) as upstream,
        run_sidecar("--upstream-url", upstream.url, "--audit-log", str(audit), env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        anyio.create_task_group() as tg,
    ):
        bearer = {"authorization": f"Bearer {token}"}
        headers = {
            **HANDSHAKE_HEADERS,
            **bearer,
            "mcp-session-id": await open_session(http, sidecar.url, bearer),
        }

        async def send(message: dict[str, Any]) -> None:
            if "id" in message:
                tg.start_soon(lambda: http.post(sidecar.url, json=message, headers=headers))
                return
            ack = await http.post(sidecar.url, json=message, headers=headers)
            assert ack.status_code == 202, ack.text

        report = await cancel_while_claude_answers(fake_claude, send, tmp_path, "call-7")
        line, refusal = await wait_for_audit(audit, 2)
        scrape = await http.get(f"{sidecar.base}/metrics", headers=bearer)
    assert report["second"]["error"]["code"] == -32800
    assert len(fake_claude.message_requests) == 1
    assert line["outcome"] == "cancelled", line
    assert line["calls"] == 1, line
    # Each line names the client whose request it was; the refusal cost nothing.
    assert (line["client"], refusal["client"]) == ("alice", "alice")
    assert (refusal["outcome"], refusal["calls"], refusal["charged"]) == ("refused", 0, None)
    text = scrape.text
    assert token not in text
    assert token not in audit.read_text()
    assert exposition_problems(text) == []
    requests = sorted(
        (labels for labels, _ in series(text, "mcp_backfill_sampling_requests_total")),
        key=lambda labels: labels["outcome"],
    )
    assert requests == [
        {"client": "alice", "model": line["model"], "outcome": "cancelled"},
        {"client": "alice", "model": "?", "outcome": "refused"},
    ]
    tokens = series(text, "mcp_backfill_sampling_tokens_total")
    assert {labels["counter"]: value for labels, value in tokens} == {
        counter: count for counter, count in line["charged"].items() if count
    }
    assert {labels["client"] for labels, _ in tokens} == {"alice"}
    assert sum(line["charged"].values()) >= fake_claude.served_tokens() > 0
    attempts = series(text, "mcp_backfill_claude_attempts_total")
    assert [(labels["outcome"], value) for labels, value in attempts] == [("cancelled", 1.0)]


async def test_each_sampling_request_of_a_cancelled_client_request_has_its_span(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Tracing on, `--upstream-url`: the client cancels its request while Claude answers the
    server's first sampling request for it. That request's span ends with -32800 and its `chat` span
    as cancelled after one call; the second, refused at once, gets its span too (every request the
    proxy receives does), ended with -32800, and no `chat` span."""

    def both_sampling_spans(spans: list[ReceivedSpan]) -> bool:
        return len([span for span in spans if span.name == "sampling/createMessage"]) >= 2

    with otlp_receiver() as receiver:
        env = otel_env(receiver.endpoint, fake_claude.url)
        async with (
            python_http_server(STUBBORN_SERVER) as upstream,
            raw_proxy(proxy_url_argv(url=upstream.url), env) as session,
        ):
            await session.request(0, "initialize", initialize_params())
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            report = await cancel_while_claude_answers(fake_claude, session.send, tmp_path, 7)
            assert report["second"]["error"]["code"] == -32800
            spans = await anyio.to_thread.run_sync(receiver.wait_for, both_sampling_spans)
            await session.close_stdin()
            await session.wait(60)
    sampling = [span for span in spans if span.name == "sampling/createMessage"]
    assert [span.attributes["jsonrpc.request.id"] for span in sampling] == ["stubborn-1-1", "stubborn-1-2"]
    for span in sampling:
        assert span.attributes["error.type"] == "-32800", span
        assert span.attributes["mcp_backfill.sender"] == "server"
    [chat] = named(spans, "chat")
    assert chat.parent_span_id == sampling[0].span_id
    assert chat.attributes["mcp_backfill.sampling.outcome"] == "cancelled"
    assert chat.attributes["mcp_backfill.sampling.calls"] == 1


async def test_a_cancelled_sampling_task_is_reported_as_the_audit_log_has_it(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`serve`: the server cancels its sampling task while Claude answers it. `/metrics` counts a
    cancelled request with the audit log's tokens (Claude may have written them all) and a
    cancelled attempt."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(hang_reply("Partial"))
    async with (
        run_sidecar(
            "--audit-log", str(audit), upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        task = (await ask(client, "sampling/createMessage", {**HELLO, "task": {"ttl": 60_000}}))["result"][
            "task"
        ]
        assert await fake_claude.await_requests(1, timeout=30)
        cancelled = await ask(client, "tasks/cancel", {"taskId": task["taskId"]})
        assert cancelled["result"]["status"] == "cancelled"
        [line] = await wait_for_audit(audit, 1)
        text = (await http.get(f"{sidecar.base}/metrics")).text
    assert line["outcome"] == "cancelled"
    assert summed(text, "mcp_backfill_sampling_requests_total", "outcome") == {"cancelled": 1.0}
    assert summed(text, "mcp_backfill_sampling_tokens_total", "counter") == {
        counter: count for counter, count in line["charged"].items() if count
    }
    assert sum(line["charged"].values()) >= fake_claude.served_tokens() > 0
    assert summed(text, "mcp_backfill_claude_attempts_total", "outcome") == {"cancelled": 1.0}


async def test_an_attempt_cancelled_while_it_waits_to_be_retried_is_no_retried_attempt(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`serve`: Claude's first attempt fails (529, retried), and the server cancels its request while
    the proxy waits to retry. No other attempt is made: `/metrics` counts the one attempt as
    cancelled (with its error type), not as `retried` (another attempt follows), and the audit log
    has the one call, charged nothing (the API refused it)."""
    audit = tmp_path / "audit.jsonl"
    options = ["--audit-log", str(audit), "--retry-base-delay", "20", "--retry-max-delay", "20"]
    fake_claude.enqueue(
        text_reply("warm"), error_reply(529, "overloaded_error", "busy"), text_reply("never asked for")
    )
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        # The Claude client built first: on a loaded machine building it can outlast the cancel below.
        await client.call_tool("plain", {"prompt": "warm up"})
        [_] = await wait_for_audit(audit, 1)
        cancelled = tool_json(await client.call_tool("slow_sample", {"cancel_after": 2.0}))
        assert cancelled["outcome"] == "timed_out", cancelled
        [_, line] = await wait_for_audit(audit, 2)
        scrape = (await http.get(f"{sidecar.base}/metrics")).text
    assert len(fake_claude.message_requests) == 2
    assert (line["outcome"], line["calls"], sum(line["charged"].values())) == ("cancelled", 1, 0), line
    attempts = series(scrape, "mcp_backfill_claude_attempts_total")
    assert sorted((labels["outcome"], labels["type"], value) for labels, value in attempts) == [
        ("cancelled", "overloaded_error", 1.0),
        ("ok", "", 1.0),
    ], attempts


async def test_an_answer_over_the_tool_call_limit_is_one_failure_not_also_a_refusal(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`--max-tool-calls`: Claude answered (billed, charged) with more tool calls than allowed, and
    the server gets an error. It is a failure, as the audit log has it (`refused` is for requests
    no call was made for): `/metrics` counted it as failed and also among the refusals by a limit."""
    audit = tmp_path / "audit.jsonl"
    options = ["--audit-log", str(audit), "--max-tool-calls", "1"]
    calls = [{"type": "tool_use", "id": f"toolu_{n}", "name": "a", "input": {}} for n in range(2)]
    fake_claude.enqueue(message_reply(calls, stop_reason="tool_use"))
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": "q"}}],
        "maxTokens": 20,
        "tools": [{"name": "a", "inputSchema": {"type": "object"}}],
    }
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
        assert outcome["error"]["data"]["limit"] == "max_tool_calls", outcome
        [line] = await wait_for_audit(audit, 1)
        scrape = (await http.get(f"{sidecar.base}/metrics")).text
    assert (line["outcome"], line["calls"], line["error"]["limit"]) == ("failed", 1, "max_tool_calls")
    assert sum(line["charged"].values()) > 0
    assert summed(scrape, "mcp_backfill_sampling_requests_total", "outcome") == {"failed": 1.0}
    assert series(scrape, "mcp_backfill_sampling_refusals_total") == []
