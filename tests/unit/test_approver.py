"""The handshake era's `Approver` in-process: the question's send counts against
`--approve-timeout`, and one session has one approval question open at a time."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from mcp_backfill import protocol
from mcp_backfill.errors import SamplingError
from mcp_backfill.relay.approval import Approver
from mcp_backfill.relay.capabilities import ClientProfile
from mcp_backfill.relay.state import RelayState
from mcp_backfill.sampling.sampler import SamplingPreview

pytestmark = pytest.mark.anyio

PARAMS: dict[str, Any] = {"messages": [], "maxTokens": 5}


def _preview(params: dict[str, Any]) -> SamplingPreview:
    return SamplingPreview(model="claude-x", max_tokens=5, tools=(), prompt="hi")


class Client:
    """The client side of the approvals: what the proxy sent it; `stuck` never takes a message."""

    def __init__(self, stuck: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.stuck = stuck

    async def send(self, raw: bytes, related: Any = None) -> None:
        if self.stuck:
            await anyio.sleep_forever()
        self.sent.append(json.loads(raw))

    def questions(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("method") == protocol.ELICIT]


def approver(client: Client, timeout: float = 60.0) -> Approver:
    state = RelayState(client=ClientProfile(elicitation={}))
    return Approver("elicit", timeout, _preview, state, client.send)


def answer(question: dict[str, Any], decision: str) -> dict[str, Any]:
    result = {"action": "accept", "content": {"decision": decision}}
    return {"jsonrpc": "2.0", "id": question["id"], "result": result}


async def decide(approval: Approver, outcomes: list[str]) -> None:
    """Ask for one approval; note "allowed", or the refusal's reason."""
    try:
        await approval.approve(dict(PARAMS))
        outcomes.append("allowed")
    except SamplingError as exc:
        outcomes.append(str((exc.data or {})["reason"]))


async def test_a_client_that_does_not_read_the_question_is_refused_within_the_timeout() -> None:
    """The question's send was awaited before `--approve-timeout` started: a client not reading
    held the sampling request (and its slot in hand) for as long as it did not read."""
    approval = approver(Client(stuck=True), timeout=0.2)
    with anyio.fail_after(10), pytest.raises(SamplingError) as refused:
        await approval.approve(dict(PARAMS))
    assert refused.value.data == {"reason": "timed out"}


async def test_one_question_is_open_at_a_time_and_a_session_allowance_lets_the_waiting_through() -> None:
    """Each sampling request opened its own dialog: a server sending many at once opened up to 256
    approval dialogs in the user's client. One is open at a time; "Allow for this session" answers
    the ones waiting their turn too."""
    client = Client()
    approval = approver(client)
    done: list[int] = []

    async def ask(n: int) -> None:
        await approval.approve(dict(PARAMS))
        done.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(ask, n)
        await anyio.wait_all_tasks_blocked()
        assert len(client.questions()) == 1
        assert approval.take(answer(client.questions()[0], "allow_session"))
        await anyio.wait_all_tasks_blocked()
    assert sorted(done) == [0, 1, 2]
    assert len(client.questions()) == 1


async def test_the_next_question_is_asked_once_the_open_one_is_answered() -> None:
    client = Client()
    approval = approver(client)
    outcomes: list[str] = []

    async with anyio.create_task_group() as tg:
        tg.start_soon(decide, approval, outcomes)
        tg.start_soon(decide, approval, outcomes)
        await anyio.wait_all_tasks_blocked()
        assert len(client.questions()) == 1
        approval.take(answer(client.questions()[0], "deny"))
        await anyio.wait_all_tasks_blocked()
        assert len(client.questions()) == 2  # a denial is for that request alone
        approval.take(answer(client.questions()[1], "allow_once"))
    assert outcomes == ["denied", "allowed"]


async def test_a_request_waiting_its_turn_is_refused_at_its_own_timeout() -> None:
    """The open question is never answered: the one waiting behind it is refused when its own
    `--approve-timeout` runs out, and each question asked is withdrawn from the client."""
    client = Client()
    approval = approver(client, timeout=0.3)
    reasons: list[Any] = []

    async def ask() -> None:
        with pytest.raises(SamplingError) as refused:
            await approval.approve(dict(PARAMS))
        reasons.append((refused.value.data or {})["reason"])

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            approval.start(tg)
            async with anyio.create_task_group() as asking:
                asking.start_soon(ask)
                asking.start_soon(ask)
    assert reasons == ["timed out", "timed out"]
    asked = [question["id"] for question in client.questions()]
    assert 1 <= len(asked) <= 2  # the second may be asked once the first gave up
    withdrawn = [m["params"]["requestId"] for m in client.sent if m.get("method") == protocol.CANCELLED]
    assert withdrawn == asked


async def test_the_first_answer_to_a_question_decides_and_a_second_one_changes_nothing() -> None:
    """Two answers to one question read in one go (a client's retry, or a hostile one) were both
    taken before the waiting request woke: the last one decided, so "allow" after "deny" allowed."""
    client = Client()
    approval = approver(client)
    outcomes: list[str] = []

    async with anyio.create_task_group() as tg:
        tg.start_soon(decide, approval, outcomes)
        await anyio.wait_all_tasks_blocked()
        question = client.questions()[0]
        assert approval.take(answer(question, "deny"))
        assert approval.take(answer(question, "allow_session"))  # consumed, and ignored
    assert outcomes == ["denied"]
