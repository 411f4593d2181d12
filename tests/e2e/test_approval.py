"""`--approve`: the user is asked, through the client's own elicitation, before Claude is called.

Real SDK clients whose elicitation callback allows, denies or declines talk to SDK servers through
`python -m mcp_backfill`, in both eras: in the handshake era the question is the proxy's own
`elicitation/create` request; in 2026-07-28 it rides in the `input_required` round the client
answers, beside any question of the server's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import (
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
RESOLVE_SERVER = python_server("resolve_server.py")
LOWLEVEL_SERVER = python_server("input_required_server.py")
HELLO = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "Tell me a secret"}}],
    "maxTokens": 25,
}


class User:
    """An elicitation callback that answers the proxy's approval questions as told, and any other
    question with `{"ok": true}`."""

    def __init__(self, *answers: types.ElicitResult, wait: anyio.Event | None = None) -> None:
        self.answers = list(answers)
        self.asked: list[types.ElicitRequestFormParams] = []
        self.other: list[str] = []
        self.wait = wait

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        if "decision" not in params.requested_schema.get("properties", {}):
            self.other.append(params.message)
            return types.ElicitResult(action="accept", content={"ok": True})
        self.asked.append(params)
        if self.wait is not None:
            await self.wait.wait()
        return self.answers.pop(0)


def decide(decision: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": decision})


def legacy_client(fake: FakeClaude, user: User | None, *options: str) -> Client:
    argv = proxy_argv(*options, upstream=SAMPLING_SERVER)
    return Client(stdio_params(argv, proxy_env(fake.url)), mode="legacy", elicitation_callback=user)


async def sample_raw(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
    assert isinstance(outcome, dict)
    return outcome


# -- handshake era -------------------------------------------------------------------------------


async def test_allow_once_asks_every_time_and_shows_what_is_asked(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("one"), text_reply("two"))
    user = User(decide("allow_once"), decide("allow_once"))
    async with legacy_client(fake_claude, user, "--approve", "elicit") as client:
        first = await sample_raw(client, HELLO)
        second = await sample_raw(client, HELLO)
    assert first["result"]["content"]["text"] == "one"
    assert second["result"]["content"]["text"] == "two"
    assert len(user.asked) == 2
    question = user.asked[0]
    assert question.message.startswith('The MCP server "sampling-test-server" asks Claude')
    assert "Tell me a secret" in question.message
    assert "up to 25 tokens" in question.message
    assert "claude-" in question.message
    choices = question.requested_schema["properties"]["decision"]["oneOf"]
    assert [choice["const"] for choice in choices] == ["allow_once", "allow_session", "deny"]
    assert len(fake_claude.message_requests) == 2


async def test_allow_for_the_session_asks_once(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("one"), text_reply("two"))
    user = User(decide("allow_session"))
    async with legacy_client(fake_claude, user, "--approve", "elicit") as client:
        await sample_raw(client, HELLO)
        second = await sample_raw(client, HELLO)
    assert second["result"]["content"]["text"] == "two"
    assert len(user.asked) == 1


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (decide("deny"), "denied"),
        (types.ElicitResult(action="decline"), "declined"),
        (types.ElicitResult(action="cancel"), "cancelled"),
    ],
)
async def test_deny_decline_and_cancel_refuse_without_calling_claude(
    fake_claude: FakeClaude, answer: types.ElicitResult, reason: str, tmp_path: Path
) -> None:
    """...and the audit log has the refusal, as it has every sampling exchange, charged nothing."""
    user = User(answer)
    audit = tmp_path / "audit.jsonl"
    async with legacy_client(fake_claude, user, "--approve", "elicit", "--audit-log", str(audit)) as client:
        outcome = await sample_raw(client, HELLO)
    assert outcome["error"]["code"] == -1
    assert outcome["error"]["message"] == "User rejected sampling request"
    assert outcome["error"]["data"] == {"reason": reason}
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert line["outcome"] == "refused", line
    assert line["error"] == {"code": -1, "message": "User rejected sampling request", "reason": reason}
    assert (line["calls"], line["charged"], line["session"], line["client"]) == (0, None, "stdio", "process")


async def test_no_answer_in_time_refuses(fake_claude: FakeClaude) -> None:
    user = User(decide("allow_once"), wait=anyio.Event())  # never set: the user never answers
    async with legacy_client(fake_claude, user, "--approve", "elicit", "--approve-timeout", "0.5") as client:
        outcome = await sample_raw(client, HELLO)
    assert outcome["error"]["code"] == -1
    assert outcome["error"]["data"] == {"reason": "timed out"}
    assert fake_claude.message_requests == []


async def test_a_sampling_request_the_server_cancels_while_the_user_is_asked_has_its_audit_line(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The server gives up on its sampling request while the approval question is open: nothing is
    sampled, and the audit log has the exchange, cancelled and charged nothing (it had no line)."""
    user = User(decide("allow_once"), wait=anyio.Event())  # never set: the user never answers
    audit = tmp_path / "audit.jsonl"
    async with legacy_client(fake_claude, user, "--approve", "elicit", "--audit-log", str(audit)) as client:
        outcome = tool_json(await client.call_tool("slow_sample", {"cancel_after": 1.0}))
        assert outcome["outcome"] == "timed_out", outcome
        with anyio.fail_after(30):
            while not audit.exists() or not audit.read_text():
                await anyio.sleep(0.05)
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("cancelled", 0, None), line
    assert line["request_id"] == outcome["samplingRequestId"]


async def test_a_client_that_cannot_elicit_is_refused_clearly(fake_claude: FakeClaude) -> None:
    async with legacy_client(fake_claude, None, "--approve", "elicit") as client:
        outcome = await sample_raw(client, HELLO)
    assert outcome["error"]["code"] == -1
    assert "--approve elicit (MCP_BACKFILL_APPROVE)" in outcome["error"]["message"]
    assert "--approve never" in outcome["error"]["message"]
    assert fake_claude.message_requests == []


async def test_elicit_tools_asks_only_about_requests_that_offer_tools(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("plain answer"), text_reply("tool-less reply"))
    user = User(decide("allow_once"))
    async with legacy_client(fake_claude, user, "--approve", "elicit-tools") as client:
        plain = await sample_raw(client, HELLO)
        looped = tool_json(await client.call_tool("loop", {"question": "no key here", "rounds": 1}))
    assert plain["result"]["content"]["text"] == "plain answer"
    assert looped["finalText"] == "tool-less reply"
    [question] = user.asked
    assert "lookup" in question.message  # the tool offered is named
    assert len(fake_claude.message_requests) == 2


async def test_a_sampling_task_waits_for_approval(fake_claude: FakeClaude) -> None:
    user = User(decide("deny"))
    async with legacy_client(fake_claude, user, "--approve", "elicit") as client:
        created = await sample_raw(client, {**HELLO, "task": {"ttl": 60_000}})
        task_id = created["result"]["task"]["taskId"]
        payload = tool_json(
            await client.call_tool(
                "client_request", {"method": "tasks/result", "params_json": json.dumps({"taskId": task_id})}
            )
        )
    assert payload["error"]["code"] == -1
    assert fake_claude.message_requests == []


async def test_a_sampling_task_the_server_cancels_while_the_user_is_asked_has_its_audit_line(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A sampling task cancelled (`tasks/cancel`) while its approval question is open: nothing is
    sampled, and the audit log has the exchange, cancelled and charged nothing (it had no line)."""
    user = User(decide("allow_once"), wait=anyio.Event())  # never set: the user never answers
    audit = tmp_path / "audit.jsonl"
    async with legacy_client(fake_claude, user, "--approve", "elicit", "--audit-log", str(audit)) as client:
        created = await sample_raw(client, {**HELLO, "task": {"ttl": 60_000}})
        task_id = created["result"]["task"]["taskId"]
        with anyio.fail_after(30):
            while not user.asked:
                await anyio.sleep(0.05)
        cancel = {"method": "tasks/cancel", "params_json": json.dumps({"taskId": task_id})}
        cancelled = tool_json(await client.call_tool("client_request", cancel))
        assert cancelled["result"]["status"] == "cancelled", cancelled
        with anyio.fail_after(30):
            while not audit.exists() or not audit.read_text():
                await anyio.sleep(0.05)
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("cancelled", 0, None), line


# -- 2026-07-28 ----------------------------------------------------------------------------------


def modern_client(fake: FakeClaude, upstream: list[str], user: User | None, *options: str) -> Client:
    argv = proxy_argv(*options, upstream=upstream)
    return Client(stdio_params(argv, proxy_env(fake.url)), elicitation_callback=user)


async def test_2026_allow_then_the_round_is_answered(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("A short summary."))
    user = User(decide("allow_once"))
    async with modern_client(fake_claude, RESOLVE_SERVER, user, "--approve", "elicit") as client:
        assert client.protocol_version == "2026-07-28"
        outcome = tool_json(await client.call_tool("summarize", {"text": "a long text"}))
    assert outcome["text"] == "A short summary."
    [question] = user.asked
    assert "a long text" in question.message
    assert len(fake_claude.message_requests) == 1


@pytest.mark.parametrize(
    ("answer", "reason"), [(decide("deny"), "denied"), (types.ElicitResult(action="decline"), "declined")]
)
async def test_2026_deny_and_decline_refuse_the_request(
    fake_claude: FakeClaude, answer: types.ElicitResult, reason: str, tmp_path: Path
) -> None:
    """...and the round's sampling question is in the audit log, refused and charged nothing."""
    from mcp.shared.exceptions import MCPError

    user = User(answer)
    audit = tmp_path / "audit.jsonl"
    options = ("--approve", "elicit", "--audit-log", str(audit))
    async with modern_client(fake_claude, RESOLVE_SERVER, user, *options) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("summarize", {"text": "a long text"})
    assert refused.value.code == -1
    assert refused.value.message == "User rejected sampling request"
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("refused", 0, None), line
    assert line["error"] == {"code": -1, "message": "User rejected sampling request", "reason": reason}
    assert "/" in str(line["request_id"])  # <the round's request id>/<the question's key>


class Late(User):
    """Answers "allow once" to the approval question, but only after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__(decide("allow_once"))
        self.delay = delay

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep(self.delay)
        return await super().__call__(context, params)


async def test_2026_an_approval_question_not_answered_in_time_has_its_audit_line(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The round's approval question is open for `--approve-timeout`; the user answers later, the
    round is gone and nothing is sampled. The sampling question is refused (`timed out`, as in the
    handshake era), and the audit log has its line, written when the question expired; it had none."""
    from mcp.shared.exceptions import MCPError

    audit = tmp_path / "audit.jsonl"
    options = ("--approve", "elicit", "--approve-timeout", "1", "--audit-log", str(audit))
    async with modern_client(fake_claude, RESOLVE_SERVER, Late(4.0), *options) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("summarize", {"text": "a long text"})
        assert refused.value.code == -32602  # the answer came too late: the requestState expired
        with anyio.fail_after(30):  # written when the question expired, before the late answer
            while not audit.exists() or not audit.read_text():
                await anyio.sleep(0.05)
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("refused", 0, None), line
    assert line["error"] == {"code": -1, "message": "User rejected sampling request", "reason": "timed out"}
    assert "/" in str(line["request_id"])  # <the round's request id>/<the question's key>


async def test_2026_an_approval_question_open_when_the_proxy_stops_has_its_audit_line(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The client goes away while the round's approval question is open: the proxy stops, nothing
    is sampled, and the audit log has the sampling question, cancelled and charged nothing, as a
    handshake-era sampling request whose session ends while the user is asked (it had no line)."""
    user = User(decide("allow_once"), wait=anyio.Event())  # never set: the user never answers
    audit = tmp_path / "audit.jsonl"
    options = ("--approve", "elicit", "--audit-log", str(audit))
    async with (
        modern_client(fake_claude, RESOLVE_SERVER, user, *options) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(client.call_tool, "summarize", {"text": "a long text"})
        with anyio.fail_after(30):
            while not user.asked:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert fake_claude.message_requests == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("cancelled", 0, None), line
    assert "/" in str(line["request_id"])  # <the round's request id>/<the question's key>


async def test_2026_a_client_that_cannot_elicit_has_the_refused_question_in_the_audit_log(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    from mcp.shared.exceptions import MCPError

    audit = tmp_path / "audit.jsonl"
    options = ("--approve", "elicit", "--audit-log", str(audit))
    async with modern_client(fake_claude, RESOLVE_SERVER, None, *options) as client:
        with pytest.raises(MCPError):
            await client.call_tool("summarize", {"text": "a long text"})
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert (line["outcome"], line["error"]["code"], line["error"]["reason"]) == (
        "refused",
        -1,
        "client cannot elicit",
    )


async def test_2026_mixed_round_asks_the_server_question_and_the_approval_together(
    fake_claude: FakeClaude,
) -> None:
    fake_claude.enqueue(text_reply("model answer"))
    user = User(decide("allow_session"))
    async with modern_client(fake_claude, LOWLEVEL_SERVER, user, "--approve", "elicit") as client:
        outcome = tool_json(await client.call_tool("mixed", {"prompt": "q?"}))
    assert outcome == {"confirmed": {"ok": True}, "answerText": "model answer", "keys": ["ask", "confirm"]}
    assert len(user.asked) == 1
    assert len(user.other) == 1
    assert len(fake_claude.message_requests) == 1


async def test_2026_a_client_that_cannot_elicit_is_refused_clearly(fake_claude: FakeClaude) -> None:
    from mcp.shared.exceptions import MCPError

    async with modern_client(fake_claude, RESOLVE_SERVER, None, "--approve", "elicit") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("summarize", {"text": "a long text"})
    assert "--approve elicit (MCP_BACKFILL_APPROVE)" in refused.value.message
    assert fake_claude.message_requests == []


async def test_approval_through_the_sidecar(fake_claude: FakeClaude) -> None:
    from tests.sidecar_harness import run_sidecar

    fake_claude.enqueue(text_reply("over HTTP"))
    user = User(decide("allow_once"), decide("deny"))
    env = proxy_env(fake_claude.url)
    async with (
        run_sidecar("--approve", "elicit", upstream=SAMPLING_SERVER, env=env) as sidecar,
        Client(sidecar.url, mode="legacy", elicitation_callback=user) as client,
    ):
        allowed = await sample_raw(client, HELLO)
        denied = await sample_raw(client, HELLO)
    assert allowed["result"]["content"]["text"] == "over HTTP"
    assert denied["error"]["code"] == -1
    assert len(user.asked) == 2
    assert len(fake_claude.message_requests) == 1


class Watching(User):
    """Allows for the session, holding its first dialog open until another opens (or 3 s pass: long
    enough for questions sent at once to arrive); counts how many are open at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.open_now = self.most_open = 0
        self.others = anyio.Event()

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        if self.open_now > 1:
            self.others.set()
        with anyio.move_on_after(3):
            await self.others.wait()
        self.open_now -= 1
        return decide("allow_session")


async def test_one_approval_question_is_open_at_a_time(fake_claude: FakeClaude) -> None:
    """Three sampling requests at once opened three dialogs in the user's client (a server could
    open 256); one is open at a time, and "Allow for this session" lets the others through unasked."""
    fake_claude.enqueue(text_reply("one"), text_reply("two"), text_reply("three"))
    user = Watching()
    outcomes: list[dict[str, Any]] = []
    async with legacy_client(fake_claude, user, "--approve", "elicit") as client:

        async def ask(text: str) -> None:
            params = {**HELLO, "messages": [{"role": "user", "content": {"type": "text", "text": text}}]}
            outcomes.append(await sample_raw(client, params))

        async with anyio.create_task_group() as tg:
            for text in ("a", "b", "c"):
                tg.start_soon(ask, text)
    assert user.most_open == 1
    assert len(user.asked) == 1
    assert sorted(outcome["result"]["content"]["text"] for outcome in outcomes) == ["one", "three", "two"]


@pytest.mark.parametrize(("version", "has_mode"), [("2025-06-18", False), ("2025-11-25", True)])
async def test_the_approval_question_has_the_fields_of_the_sessions_revision(
    fake_claude: FakeClaude, version: str, has_mode: bool
) -> None:
    """`mode` in `elicitation/create` arrived in 2025-11-25: a client whose session negotiated
    2025-06-18 is asked in the shape its revision defines (and the enum spelling it knows)."""
    argv = proxy_argv("--approve", "elicit", upstream=python_server("echo_server.py"))
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(1, "initialize", initialize_params({"elicitation": {}}, version=version))
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = {"method": "sampling/createMessage", "params": HELLO, "id": "ask"}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": ask})
        question, _ = await session.recv_until(lambda m: m.get("method") == "elicitation/create")
        await session.send({"jsonrpc": "2.0", "id": question["id"], "result": {"action": "decline"}})
        answer, _ = await session.recv_until(lambda m: m.get("id") == 2 and "method" not in m)
    assert ("mode" in question["params"]) is has_mode, question["params"]
    assert answer["result"]["client_response"]["error"]["code"] == -1  # declined: not sent to Claude
    assert fake_claude.message_requests == []
