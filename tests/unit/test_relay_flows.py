"""The relay in process: a real `Relay` and `Sampler` (offline mock provider) between two in-memory
`MessageChannel`s, driven message by message. Each flow states what each side sends and exactly what
the other side receives; the process tests (tests/e2e) check the same through real stdio and HTTP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from mcp_backfill import assembly, protocol
from mcp_backfill.config import Config, Secret
from mcp_backfill.errors import MessageTooLarge, StoreUnavailable
from mcp_backfill.providers.mock import MockProvider
from mcp_backfill.relay import Relay
from mcp_backfill.relay.answering import ANSWERING_LIMIT
from mcp_backfill.relay.approval import APPROVAL_KEY, MAX_APPROVAL_PROMPTS
from mcp_backfill.relay.relay import LARGE_MESSAGE
from mcp_backfill.relay.task_book import MAX_TASKS
from mcp_backfill.sampling.audit import AuditLog, auditing
from mcp_backfill.sampling.provider import ProgressCallback, UsageMeter
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.sampling.store import LedgerStore, MemoryStore

pytestmark = pytest.mark.anyio

# What the proxy declares for its own sampling tasks (handshake era).
SAMPLING_TASKS: dict[str, Any] = {"requests": {"sampling": {"createMessage": {}}}, "list": {}, "cancel": {}}
ENVELOPE_VERSION = {protocol.META_PROTOCOL_VERSION: protocol.STATELESS_VERSION}
HELLO = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10}
WITH_TOOLS = {
    **HELLO,
    "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
    "toolChoice": {"mode": "none"},
}
ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {"type": "object"}}}


TOO_LARGE = b"\0too large:"
"""A message sent with this prefix reaches the relay as `MessageTooLarge`, as one over the limit."""
ON_STREAM = b"\0on stream:"
"""A server message sent with this prefix (`Peer.send_on`) came on the response stream of a request,
as an HTTP upstream's do: the relay receives it with that request's id as its origin."""


class MemoryChannel:
    """One side of the relay as a `MessageChannel`, over anyio memory streams."""

    def __init__(
        self, inbox: MemoryObjectReceiveStream[bytes], outbox: MemoryObjectSendStream[bytes]
    ) -> None:
        self._inbox = inbox
        self._outbox = outbox

    async def receive(self) -> bytes:
        raw = await self._inbox.receive()
        if raw.startswith(TOO_LARGE):  # what a transport raises for a message over its limit
            raise MessageTooLarge.from_bytes(raw[len(TOO_LARGE) :], 1024)
        return raw

    async def receive_with_origin(self) -> tuple[bytes, Any]:
        raw = await self.receive()
        if raw.startswith(ON_STREAM):
            origin, _, raw = raw[len(ON_STREAM) :].partition(b"\n")
            return raw, json.loads(origin)
        return raw, None

    async def send(self, message: bytes, related: Any = None) -> None:
        await self._outbox.send(message)


@dataclass
class Peer:
    """The far end of one side: what the test sends as the client (or the server), and reads back."""

    to_relay: MemoryObjectSendStream[bytes]
    from_relay: MemoryObjectReceiveStream[bytes]

    async def send(self, message: Any) -> None:
        await self.to_relay.send(json.dumps(message).encode())

    async def send_raw(self, raw: bytes) -> None:
        await self.to_relay.send(raw)

    async def send_on(self, origin: Any, message: Any) -> None:
        """As the server: send `message` on the response stream of the request `origin`."""
        await self.to_relay.send(
            ON_STREAM + json.dumps(origin).encode() + b"\n" + json.dumps(message).encode()
        )

    async def recv(self) -> Any:
        with anyio.fail_after(5):
            return json.loads(await self.from_relay.receive())

    def nothing_waiting(self) -> bool:
        return self.from_relay.statistics().current_buffer_used == 0


class AtOnceChannel(MemoryChannel):
    """A `MemoryChannel` that also sends without waiting (`SendsAtOnce`), as the stdio pipes do: the
    relay may then be handed a message from outside its pumps (`Relay.from_client_now`,
    `from_upstream_now`), as a pipe's read callback does."""

    def can_send_now(self) -> bool:
        stats = self._outbox.statistics()
        return stats.current_buffer_used < stats.max_buffer_size

    def send_now(self, message: bytes, related: Any = None) -> None:
        self._outbox.send_nowait(message)


def channel_pair(at_once: bool = False) -> tuple[MemoryChannel, Peer]:
    to_relay, relay_inbox = anyio.create_memory_object_stream[bytes](100)
    relay_outbox, from_relay = anyio.create_memory_object_stream[bytes](100)
    channel = (AtOnceChannel if at_once else MemoryChannel)(relay_inbox, relay_outbox)
    return channel, Peer(to_relay, from_relay)


class GatedProvider(MockProvider):
    """The mock provider, answering only once the test opens the gate; notes cancellations."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.started = anyio.Event()
        self.cancelled = False

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        self.started.set()
        try:
            await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        return await super().create_message(request, on_progress=on_progress, meter=meter)


class CountingProvider(MockProvider):
    """The mock provider, counting its calls (each one a paid Claude call with a real provider)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        self.calls += 1
        return await super().create_message(request, on_progress=on_progress, meter=meter)


class SlowToStopProvider(MockProvider):
    """The first call waits until cancelled, then takes until `release` to stop (as a settlement
    shielded from cancellation does with a shared ledger store); later calls answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.calls = 0

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await self.release.wait()
        return await super().create_message(request, on_progress=on_progress, meter=meter)


@dataclass
class Relayed:
    client: Peer
    server: Peer
    relay: Relay


@asynccontextmanager
async def relayed(
    provider: MockProvider | None = None,
    store: LedgerStore | None = None,
    audit: AuditLog | None = None,
    *,
    at_once: bool = False,
    **options: Any,
) -> AsyncIterator[Relayed]:
    config = Config(upstream_command=("server",), provider="mock", **options)
    sampler = Sampler(
        provider or MockProvider(),
        assembly.sampler_settings(config),
        spend=Spend(assembly.spend_settings(config), store),
        audit=audit,
    )
    client_side, client = channel_pair(at_once)
    upstream_side, server = channel_pair(at_once)
    relay = Relay(
        assembly.relay_options(config),
        sampler,
        client_side,
        upstream_side,
        session=sampler.spend.new_session("test"),
    )

    async def client_closed() -> None:
        await server.to_relay.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, client_closed)
        yield Relayed(client, server, relay)
        await server.to_relay.aclose()  # the upstream ends: the relay returns


def request(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def result(request_id: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def initialize(capabilities: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": "2025-11-25",
        "capabilities": capabilities,
        "clientInfo": {"name": "t", "version": "1"},
    }


async def handshake(r: Relayed) -> None:
    """A 2025-11-25 session opened by a client that cannot sample (the proxy answers its sampling)."""
    await r.client.send(request(1, "initialize", initialize({})))
    await r.server.recv()
    await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
    await r.client.recv()


def stateless(params: dict[str, Any], capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {**ENVELOPE_VERSION, protocol.META_CLIENT_CAPABILITIES: capabilities or {}}
    return {**params, "_meta": meta}


def sampling_request(request_id: Any, params: dict[str, Any] = HELLO) -> dict[str, Any]:
    return request(request_id, protocol.SAMPLING, params)


def is_mock_answer(message: Any, request_id: Any) -> bool:
    answer = message.get("result", {})
    model: str = answer.get("model", "")
    return bool(message["id"] == request_id and answer.get("role") == "assistant") and model.startswith(
        "mock/"
    )


# -- handshake era ---------------------------------------------------------------------------------


async def test_initialize_gets_sampling_with_tools_and_keeps_the_rest() -> None:
    declared = {"roots": {"listChanged": True}, "sampling": {"context": {}}, "x-unknown": {"a": 1}}
    async with relayed() as r:
        await r.client.send(request(0, "initialize", initialize(declared)))
        seen = await r.server.recv()
        assert seen["id"] == 0
        assert seen["params"]["capabilities"] == {
            **declared,
            "sampling": {"context": {}, "tools": {}},
            "tasks": SAMPLING_TASKS,
        }
        await r.server.send(result(0, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        assert (await r.client.recv())["id"] == 0
        assert r.relay.state.protocol_version == "2025-11-25"


async def test_mode_off_forwards_initialize_and_sampling_untouched() -> None:
    async with relayed(mode="off") as r:
        await r.client.send(request(1, "initialize", initialize({})))
        assert (await r.server.recv())["params"]["capabilities"] == {}
        await r.server.send(sampling_request(7))
        assert await r.client.recv() == sampling_request(7)


@pytest.mark.parametrize(
    ("mode", "declared", "params", "proxy_answers"),
    [
        ("fallback", {}, HELLO, True),
        ("fallback", {"sampling": {}}, HELLO, False),
        ("fallback", {"sampling": {}}, WITH_TOOLS, True),
        ("fallback", {"sampling": {"tools": {}}}, WITH_TOOLS, False),
        ("always", {"sampling": {"tools": {}}}, WITH_TOOLS, True),
    ],
)
async def test_who_answers_a_server_sampling_request(
    mode: str, declared: dict[str, Any], params: dict[str, Any], proxy_answers: bool
) -> None:
    async with relayed(mode=mode) as r:
        await r.client.send(request(1, "initialize", initialize(declared)))
        await r.server.recv()
        await r.server.send(sampling_request(0, params))  # id 0 is a valid id
        if proxy_answers:
            assert is_mock_answer(await r.server.recv(), 0)
            assert r.client.nothing_waiting()
        else:
            assert await r.client.recv() == sampling_request(0, params)


async def test_ids_colliding_across_directions_stay_apart() -> None:
    async with relayed() as r:
        await r.client.send(request(1, "tools/call", {"name": "x"}))
        assert (await r.server.recv())["id"] == 1
        await r.server.send(sampling_request(1))  # the server's own id 1
        assert is_mock_answer(await r.server.recv(), 1)
        await r.server.send(result(1, {"content": []}))  # the answer to the client's id 1
        assert await r.client.recv() == result(1, {"content": []})
        for request_id in ("1", 10**30):  # a string id and a big integer are ids of their own
            await r.client.send(request(request_id, "ping"))
            assert (await r.server.recv())["id"] == request_id
            await r.server.send(result(request_id, {}))
            assert (await r.client.recv())["id"] == request_id


async def test_batches_are_rewritten_and_consumed_item_by_item() -> None:
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}}
    async with relayed() as r:
        await r.client.send([request(1, "initialize", initialize({})), note])
        forwarded = await r.server.recv()
        assert forwarded[0]["params"]["capabilities"] == {"sampling": {"tools": {}}, "tasks": SAMPLING_TASKS}
        assert forwarded[1] == note
        await r.server.send([sampling_request(5), note])  # the proxy takes the request, not the note
        assert await r.client.recv() == [note]
        assert is_mock_answer(await r.server.recv(), 5)
        await r.server.send([sampling_request(6)])  # nothing left for the client
        assert is_mock_answer(await r.server.recv(), 6)
        assert r.client.nothing_waiting()


async def test_server_cancels_a_sampling_request_the_proxy_answers() -> None:
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}}
        await r.server.send(cancel)
        await r.server.send(request(4, "ping"))  # in order: the cancel was handled before it
        assert await r.client.recv() == request(4, "ping")  # the cancel is not forwarded
        assert provider.cancelled
        provider.gate.set()
        await r.server.send(sampling_request(5))
        assert is_mock_answer(await r.server.recv(), 5)  # no answer for 3 came first


async def test_client_cancel_of_a_forwarded_request_is_forwarded() -> None:
    async with relayed() as r:
        await r.client.send(request(2, "tools/call", {"name": "slow"}))
        await r.server.recv()
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 2}}
        await r.client.send(cancel)
        assert await r.server.recv() == cancel
        assert r.relay.state.client_requests == {}


async def test_malformed_json_from_either_side() -> None:
    async with relayed() as r:
        await r.client.send_raw(b"{not json")
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (None, protocol.PARSE_ERROR)
        await r.server.send_raw(b"[1, 2")  # dropped with a log line: nobody to answer
        await r.client.send(request(1, "ping"))
        assert await r.server.recv() == request(1, "ping")
        assert r.client.nothing_waiting()


async def test_a_null_message_is_relayed_like_any_other_message_the_relay_does_not_know() -> None:
    """`null` (alone, or in a batch) is no JSON-RPC message, but it is the receiver's to refuse, as
    `42` or `{}` are: the relay took it for a message it had consumed itself and dropped it, so the
    client was never told its message was invalid, and a batch lost one of its items."""
    ping = request(1, "ping")
    async with relayed() as r:
        await r.client.send_raw(b"null")
        assert await r.server.recv() is None
        await r.client.send([None, ping])
        assert await r.server.recv() == [None, ping]
        await r.server.send_raw(b"null")
        assert await r.client.recv() is None
        await r.server.send([None, result(1, {})])
        assert await r.client.recv() == [None, result(1, {})]


async def test_a_dying_upstream_fails_what_is_pending() -> None:
    async with relayed() as r:
        await r.client.send(request("a", "tools/call", {"name": "x"}))
        await r.server.recv()
        await r.relay.fail_pending("Upstream MCP server exited (status 1)")
        error = await r.client.recv()
        assert error["id"] == "a"
        assert error["error"] == {
            "code": protocol.INTERNAL_ERROR,
            "message": "Upstream MCP server exited (status 1)",
        }


# -- 2026-07-28 ------------------------------------------------------------------------------------


SAMPLE = {"method": protocol.SAMPLING, "params": HELLO}
ACCEPTED = {"action": "accept", "content": {}}


def input_required(questions: dict[str, Any], state: Any = "server-state") -> dict[str, Any]:
    return {"resultType": "input_required", "inputRequests": questions, "requestState": state}


async def test_a_round_is_answered_and_resent_under_a_proxy_id() -> None:
    call = request(9, "tools/call", stateless({"name": "ask"}))
    async with relayed() as r:
        await r.client.send(call)
        sent = await r.server.recv()
        assert sent["params"]["_meta"][protocol.META_CLIENT_CAPABILITIES] == {"sampling": {"tools": {}}}
        await r.server.send(result(9, input_required({"s": {"method": protocol.SAMPLING, "params": HELLO}})))
        retry = await r.server.recv()
        assert retry["id"].startswith("mcp-backfill:")
        assert (retry["method"], retry["params"]["name"]) == ("tools/call", "ask")
        assert retry["params"]["requestState"] == "server-state"  # echoed as it was
        assert retry["params"]["inputResponses"]["s"]["model"].startswith("mock/")
        await r.server.send(result(retry["id"], {"content": [{"type": "text", "text": "done"}]}))
        assert await r.client.recv() == result(9, {"content": [{"type": "text", "text": "done"}]})
        assert r.relay.state.driving == {}


async def test_mode_always_answers_the_rounds_of_a_client_that_samples_with_tools() -> None:
    """--mode always: the client never sees a sampling request, in this revision as in the handshake
    era. A client declaring `sampling.tools` (nothing to merge) got the server's questions itself."""
    call = request(1, "tools/call", stateless({"name": "ask"}, {"sampling": {"tools": {}}}))
    async with relayed(mode="always") as r:
        await r.client.send(call)
        assert await r.server.recv() == call  # its capabilities are left as they are
        await r.server.send(result(1, input_required({"s": SAMPLE})))
        retry = await r.server.recv()
        assert retry["params"]["inputResponses"]["s"]["model"].startswith("mock/")
        await r.server.send(result(retry["id"], {"content": []}))
        assert await r.client.recv() == result(1, {"content": []})


async def test_a_mixed_round_goes_to_the_client_reduced_and_comes_back_merged() -> None:
    call = request(1, "tools/call", stateless({"name": "ask"}, {"elicitation": {}}))
    questions = {"s": {"method": protocol.SAMPLING, "params": HELLO}, "e": ELICIT}
    async with relayed() as r:
        await r.client.send(call)
        await r.server.recv()
        await r.server.send(result(1, input_required(questions, {"opaque": [1, 2]})))
        reduced = (await r.client.recv())["result"]
        assert reduced["inputRequests"] == {"e": ELICIT}
        assert reduced["requestState"].startswith("mcp-backfill.v1.")
        answer = {"action": "accept", "content": {}}
        params = {**call["params"], "inputResponses": {"e": answer}, "requestState": reduced["requestState"]}
        await r.client.send(request(2, "tools/call", params))
        retry = await r.server.recv()
        assert retry["id"] == 2
        assert retry["params"]["requestState"] == {"opaque": [1, 2]}  # the server's own state is back
        assert retry["params"]["inputResponses"]["e"] == answer
        assert retry["params"]["inputResponses"]["s"]["model"].startswith("mock/")
        await r.client.send(request(3, "tools/call", params))  # a token redeems once
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (3, protocol.INVALID_PARAMS)


async def test_client_cancels_a_request_while_the_proxy_samples_for_it() -> None:
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.client.send(request(4, "tools/call", stateless({"name": "ask"})))
        await r.server.recv()
        await r.server.send(result(4, input_required({"s": {"method": protocol.SAMPLING, "params": HELLO}})))
        await provider.started.wait()
        await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 4}})
        await r.client.send(request(5, "ping"))
        assert await r.server.recv() == request(5, "ping")  # no cancel upstream: nothing was in flight
        assert provider.cancelled
        assert r.relay.state.driving == {}
        assert r.client.nothing_waiting()


async def test_a_cancelled_round_does_not_resume_for_a_new_request_with_its_id() -> None:
    """Once its sampling stopped, a cancelled round checked only that its client's id was still
    driven: a new request reusing the id was, so the old round was re-sent too (without answers)
    and the client got two answers to one id."""
    provider = SlowToStopProvider()
    params = stateless({"name": "ask"})
    async with relayed(provider) as r:
        await r.client.send(request(4, "tools/call", params))
        await r.server.recv()
        await r.server.send(result(4, input_required({"s": SAMPLE})))
        await provider.started.wait()
        await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 4}})
        await r.client.send(request(4, "tools/call", params))  # the id is free again
        assert (await r.server.recv())["id"] == 4
        await r.server.send(result(4, input_required({"s": SAMPLE})))
        retry = await r.server.recv()
        assert retry["params"]["inputResponses"]["s"]["model"].startswith("mock/")
        provider.release.set()
        with anyio.move_on_after(0.5):
            stray = await r.server.recv()
            pytest.fail(f"the cancelled round was re-sent: {stray}")
        await r.server.send(result(retry["id"], {"content": []}))
        assert await r.client.recv() == result(4, {"content": []})
        assert r.client.nothing_waiting()
        assert r.relay.state.driving == {}


async def test_a_round_limit_fails_the_request() -> None:
    question = {"s": {"method": protocol.SAMPLING, "params": HELLO}}
    async with relayed(max_input_rounds=1) as r:
        await r.client.send(request(1, "tools/call", stateless({"name": "ask"})))
        await r.server.recv()
        await r.server.send(result(1, input_required(question)))
        retry = await r.server.recv()
        await r.server.send(result(retry["id"], input_required(question)))
        error = await r.client.recv()
        assert error["id"] == 1
        assert error["error"]["code"] == protocol.INTERNAL_ERROR
        assert "--max-input-rounds" in error["error"]["message"]


async def test_mixed_rounds_count_toward_the_round_limit() -> None:
    """A mixed round left the count as it was: a server answering every retry with one had the proxy
    sample (and bill) on every retry of the client's, without end."""
    provider = CountingProvider()
    call_params = stateless({"name": "ask"}, {"elicitation": {}})
    mixed = input_required({"s": SAMPLE, "e": ELICIT})
    async with relayed(provider, max_input_rounds=2) as r:
        await r.client.send(request(1, "tools/call", call_params))
        await r.server.recv()
        await r.server.send(result(1, mixed))
        for retry_id in (2, 3):
            token = (await r.client.recv())["result"]["requestState"]
            params = {**call_params, "inputResponses": {"e": ACCEPTED}, "requestState": token}
            await r.client.send(request(retry_id, "tools/call", params))
            assert (await r.server.recv())["id"] == retry_id
            await r.server.send(result(retry_id, mixed))
        error = await r.client.recv()
        assert error["id"] == 3
        assert "--max-input-rounds" in error.get("error", {}).get("message", ""), error
        assert provider.calls == 2


# -- the relay's review: ids, re-encoding, tasks, approval ------------------------------------------

# Ids JSON-RPC does not allow: their key used to be unhashable, and the first one ended the session.
BAD_IDS = [{"x": 1}, [1], True]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_request_with_an_id_json_rpc_does_not_allow_is_relayed_and_the_session_goes_on(
    bad: Any,
) -> None:
    async with relayed() as r:
        await r.client.send(request(1, "tools/call", {"name": "slow"}))  # something pending
        await r.server.recv()
        await r.client.send(request(bad, "ping"))
        assert (await r.server.recv())["id"] == bad
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": bad}}
        await r.client.send(cancel)
        assert await r.server.recv() == cancel
        await r.server.send(result(bad, {}))
        assert await r.client.recv() == result(bad, {})
        await r.server.send(sampling_request(bad))
        assert is_mock_answer(await r.server.recv(), bad)
        late_cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": bad}}
        await r.server.send(late_cancel)  # for a request the proxy answered: the client never saw it
        await r.client.send(request(2, "ping"))
        assert await r.server.recv() == request(2, "ping")
        await r.server.send(result(1, {}))
        assert await r.client.recv() == result(1, {})  # `true` is not `1`; the late cancel was dropped


@pytest.mark.parametrize("request_id", [1, 1000, "req-1"])
async def test_an_answer_is_relayed_as_the_bytes_it_came_in_whatever_its_id(request_id: Any) -> None:
    """A check of identity (`is`) let only small integers through as they came: an answer to id 1000
    or "req-1" was re-encoded, a float's digits cut and `1e400` turned to null."""
    async with relayed() as r:
        await r.client.send(request(request_id, "tools/call", {"name": "x"}))
        await r.server.recv()
        body = '{"content":[],"structuredContent":{"pi":3.14159265358979323846264338327950288,"big":1e400}}'
        raw = (
            b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode() + b',"result":' + body.encode() + b"}"
        )
        await r.server.send_raw(raw)
        with anyio.fail_after(5):
            assert await r.client.from_relay.receive() == raw


@pytest.mark.parametrize("size", [100, 100_000])
async def test_an_answer_under_an_id_equal_to_the_clients_but_of_another_type_gets_the_clients_id(
    size: int,
) -> None:
    """A JavaScript server answers `"id":1.0` with `"id":1`. A small answer got the client's id
    back; a large one (routed by the id at its head, undecoded) went out under the server's `1`."""
    async with relayed() as r:
        await r.client.send_raw(b'{"jsonrpc":"2.0","id":1.0,"method":"tools/call","params":{"name":"x"}}')
        await r.server.recv()
        text = "a" * size
        await r.server.send_raw(b'{"jsonrpc":"2.0","id":1,"result":{"text":"' + text.encode() + b'"}}')
        with anyio.fail_after(5):
            raw = await r.client.from_relay.receive()
        answer = json.loads(raw)
        assert (answer["id"], type(answer["id"])) == (1.0, float)
        assert answer["result"] == {"text": text}


# A message that is not JSON (here: a byte that is no UTF-8) but whose id can still be read.
def malformed(head: str, tail: str = "}") -> bytes:
    return head.encode() + b'"x\xff"' + tail.encode()


async def test_a_malformed_request_with_a_readable_id_is_refused_under_its_id() -> None:
    """The parse error went out with a null id, which no client can match to its request: the
    request waited for ever."""
    async with relayed() as r:
        await r.client.send_raw(
            malformed('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":', "}}")
        )
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (7, protocol.PARSE_ERROR)
        assert r.server.nothing_waiting()
        await r.server.send_raw(
            malformed('{"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":')
        )
        error = await r.server.recv()
        assert (error["id"], error["error"]["code"]) == ("s-1", protocol.PARSE_ERROR)
        assert r.client.nothing_waiting()
        await r.client.send(request(8, "ping"))
        assert await r.server.recv() == request(8, "ping")


async def test_a_malformed_answer_with_a_readable_id_fails_the_request_it_answers() -> None:
    """An answer the relay cannot decode was dropped: the request it answered waited for ever."""
    async with relayed() as r:
        await r.client.send(request(3, "tools/call", {"name": "x"}))
        await r.server.recv()
        await r.server.send_raw(malformed('{"jsonrpc":"2.0","id":3,"result":{"text":', "}}"))
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (3, protocol.INTERNAL_ERROR)
        assert "not valid JSON" in error["error"]["message"]
        assert r.relay.state.client_requests == {}
        ask = request("roots-1", "roots/list")
        await r.server.send(ask)
        assert await r.client.recv() == ask
        await r.client.send_raw(
            malformed('{"jsonrpc":"2.0","id":"roots-1","result":{"roots":[{"uri":', "}]}}")
        )
        error = await r.server.recv()
        assert (error["id"], error["error"]["code"]) == ("roots-1", protocol.INTERNAL_ERROR)
        assert r.client.nothing_waiting()  # the client is not told about its own answer


@pytest.mark.parametrize("broken", ["too large", "malformed"])
async def test_every_request_of_a_batch_whose_answer_is_lost_gets_an_error(broken: str) -> None:
    """A batch's answer (one array) too large or not JSON was answered for at most one id: the other
    requests of the batch waited for ever, and stayed in the relay's state for the session's life."""
    batch = [request(1, "tools/call", {"name": "x"}), request("b", "tools/list"), request(3, "ping")]
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1}}
    async with relayed() as r:
        await r.client.send([*batch, note])
        assert len(await r.server.recv()) == 4
        await r.client.send(request(9, "tools/list"))  # not in the batch: it stays waiting
        await r.server.recv()
        answers = ",".join(json.dumps(result(item["id"], {"text": "y" * 3000})) for item in batch)
        lost = f"[{answers}]".encode()
        if broken == "too large":
            await r.server.send_raw(TOO_LARGE + lost)
        else:
            await r.server.send_raw(lost[:-20] + b"\xff" + lost[-20:])
        errors = [await r.client.recv() for _ in batch]
        assert sorted(str(error["id"]) for error in errors) == ["1", "3", "b"]
        assert all(error["error"]["code"] == protocol.INTERNAL_ERROR for error in errors)
        assert [*r.relay.state.client_requests] == [(False, 9)]
        assert r.client.nothing_waiting()
        await r.server.send(result(9, {"tools": []}))
        assert (await r.client.recv())["id"] == 9


@pytest.mark.parametrize("broken", ["too large", "malformed"])
async def test_a_lost_batch_answer_whose_first_request_was_cancelled_still_fails_the_rest(
    broken: str,
) -> None:
    """The client cancelled the first request of its batch, but the server, which had not read the
    cancel yet, answered the whole batch as one array, which did not arrive whole: the relay looked
    for the batch through the id it read at the array's head, found nothing (the cancelled request
    was forgotten), and the rest of the batch waited for ever (found by test_properties_relay.py)."""
    batch = [request(1, "tools/call", {"name": "x"}), request(2, "tools/list")]
    async with relayed() as r:
        await r.client.send(batch)
        await r.server.recv()
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 1}}
        await r.client.send(cancel)
        assert await r.server.recv() == cancel
        answers = ",".join(json.dumps(result(item["id"], {"text": "y" * 3000})) for item in batch)
        lost = f"[{answers}]".encode()
        if broken == "too large":
            await r.server.send_raw(TOO_LARGE + lost)
        else:
            await r.server.send_raw(lost[:-20] + b"\xff" + lost[-20:])
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (2, protocol.INTERNAL_ERROR)
        assert r.relay.state.client_requests == {}
        assert r.client.nothing_waiting()


async def test_a_batch_of_more_messages_than_the_limit_is_refused_as_a_whole() -> None:
    """A batch of 300,000 pings (13 MB, under the size limit) held the event loop for seconds while
    the relay went through it: every other session waited."""
    async with relayed(max_batch_messages=3) as r:
        await r.client.send([request(n, "ping") for n in range(4)])
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (None, protocol.INVALID_REQUEST)
        message = error["error"]["message"]
        assert "4 messages" in message
        assert "--max-batch-messages" in message, message
        assert r.relay.state.client_requests == {}
        raw = b'[{"jsonrpc":"2.0","id":1,"method":"ping"}, {"jsonrpc":"2.0","method":"x"},'
        raw += b'{"jsonrpc":"2.0","id":2,"method":"ping"}]'
        await r.client.send_raw(raw)
        assert await r.server.from_relay.receive() == raw  # a batch within the limit: as it came
        assert r.server.nothing_waiting()
        assert r.client.nothing_waiting()


async def test_an_upstream_batch_of_more_messages_than_the_limit_is_refused_as_a_whole() -> None:
    """Client batches were bounded in count (`--max-batch-messages`), the upstream's only in bytes: a
    batch of 300,000 messages from the server held the event loop (every session) for seconds.
    Now it is dropped as a whole: each client request it answered gets an error under its own id
    that names the option, so does each request of the server's in it, and the requests it did not
    answer wait on."""
    async with relayed(max_batch_messages=3) as r:
        for n in (1, 2, 9):
            await r.client.send(request(n, "tools/list"))
            await r.server.recv()
        flood = [result(1, {"tools": []}), result(2, {"tools": []})]
        flood += [{"jsonrpc": "2.0", "method": "notifications/message", "params": {}}] * 2
        flood.append(request("srv-1", "roots/list"))
        await r.server.send(flood)
        errors = [await r.client.recv() for _ in range(2)]
        assert sorted(error["id"] for error in errors) == [1, 2]
        for error in errors:
            assert error["error"]["code"] == protocol.INTERNAL_ERROR
            message = error["error"]["message"]
            assert "batch of 5 messages" in message, message
            assert "--max-batch-messages" in message, message
        [refusal] = await r.server.recv()  # the server's request: answered, as a batch is
        assert (refusal["id"], refusal["error"]["code"]) == ("srv-1", protocol.INVALID_REQUEST)
        assert "--max-batch-messages" in refusal["error"]["message"]
        assert [*r.relay.state.client_requests] == [(False, 9)]
        assert r.client.nothing_waiting()
        assert r.server.nothing_waiting()
        within = [result(9, {"tools": []}), {"jsonrpc": "2.0", "method": "notifications/message"}]
        await r.server.send(within)
        assert await r.client.recv() == within  # a batch within the limit: relayed as before


async def test_a_malformed_answer_to_the_approval_question_refuses_the_sampling() -> None:
    """The proxy's own question is answered, not the server's: its id must not reach the server."""
    provider = CountingProvider()
    async with relayed(provider, approve="elicit") as r:
        await r.client.send(request(1, "initialize", initialize({"elicitation": {}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(3))
        question = await r.client.recv()
        head = '{"jsonrpc":"2.0","id":' + json.dumps(question["id"]) + ',"result":{"action":'
        await r.client.send_raw(malformed(head, "}"))
        refusal = await r.server.recv()
        assert (refusal["id"], refusal["error"]["code"]) == (3, protocol.USER_REJECTED)
        assert provider.calls == 0


async def test_a_sampling_task_the_proxy_declared_is_its_own_when_the_client_runs_no_tasks() -> None:
    """The client samples without tools and runs no tasks; the proxy declared sampling tasks for it.
    A tool-less task-augmented request used to go to the client, which answers with a plain result
    (or an error), not the task the server was promised."""
    async with relayed() as r:
        await r.client.send(request(1, "initialize", initialize({"sampling": {}})))
        assert (await r.server.recv())["params"]["capabilities"]["tasks"] == SAMPLING_TASKS
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        answer = await r.server.recv()
        assert answer["id"] == 7
        assert "task" in answer["result"]
        assert r.client.nothing_waiting()
        await r.server.send(sampling_request(8))  # without a task: the client's, as before
        assert (await r.client.recv())["id"] == 8


async def test_a_server_that_negotiates_a_revision_without_tasks_is_served_without_them() -> None:
    """The client asks for 2025-11-25, so the proxy declares its sampling tasks; the server answers
    with 2025-06-18, which has no tasks. Its session has none: a `task` in a sampling request is a
    field that revision does not define, and `tasks/*` are methods it does not have. The proxy
    answered the request with a task (a result that revision has no shape for) and took the
    `tasks/*` requests for its own instead of relaying them to the client."""
    async with relayed() as r:
        await r.client.send(request(1, "initialize", initialize({"sampling": {}})))
        assert (await r.server.recv())["params"]["capabilities"]["tasks"] == SAMPLING_TASKS
        await r.server.send(result(1, {"protocolVersion": "2025-06-18", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        assert (await r.client.recv())["id"] == 7  # the client's to answer, as any tool-less request
        await r.server.send(request(8, protocol.TASKS_LIST, {}))
        assert (await r.client.recv())["id"] == 8
        assert r.server.nothing_waiting()


async def test_a_tasks_list_the_server_cancelled_is_not_kept_for_the_clients_answer() -> None:
    """The id of every `tasks/list` relayed to a client that lists tasks is kept until the client
    answers it (the proxy's tasks join its last page); one the server cancelled, which the client
    need never answer, was kept for the session's life: a server listing and cancelling in a loop
    grew the session's memory."""
    async with relayed() as r:
        await r.client.send(request(1, "initialize", initialize({"sampling": {}, "tasks": {"list": {}}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        for n in range(3):
            await r.server.send(request(f"list-{n}", "tasks/list", {}))
            assert (await r.client.recv())["id"] == f"list-{n}"
            await r.server.send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": f"list-{n}"}}
            )
            assert (await r.client.recv())["params"]["requestId"] == f"list-{n}"
        await r.server.send(request("list-3", "tasks/list", {}))
        await r.client.recv()
        await r.client.send(result("list-3", {"tasks": []}))
        assert (await r.server.recv())["result"] == {"tasks": []}
        assert not r.relay.tasks._client_lists


async def test_a_task_ttl_of_infinity_gives_a_task_with_the_cap_and_the_session_goes_on() -> None:
    """`"ttl": 1e400` decodes to infinity, whose `int()` raised in the routing: the session ended."""
    async with relayed() as r:
        await handshake(r)
        params = json.dumps(HELLO).encode()[:-1] + b',"task":{"ttl":1e400}}'
        await r.server.send_raw(
            b'{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":' + params + b"}"
        )
        answer = await r.server.recv()
        assert answer["id"] == 7
        task = answer["result"]["task"]
        assert task["ttl"] == 3_600_000  # --task-ttl-max
        await r.server.send(request(8, "tasks/get", {"taskId": task["taskId"]}))
        got = await r.server.recv()
        while "id" not in got:  # notifications/tasks/status
            got = await r.server.recv()
        assert got["id"] == 8
        assert got["result"]["taskId"] == task["taskId"]
        await r.client.send(request(2, "ping"))
        assert await r.server.recv() == request(2, "ping")


async def test_a_working_task_whose_ttl_passes_is_cancelled_though_nothing_else_comes_in() -> None:
    """A task is forgotten when its TTL is up; its Claude call ran on (billed) until some later
    request of the session happened to look at the book, for an answer nobody could fetch."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await handshake(r)
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 300}}))
        assert "task" in (await r.server.recv())["result"]
        await provider.started.wait()
        with anyio.fail_after(30):
            status = await r.server.recv()
        assert status["method"] == "notifications/tasks/status"
        assert status["params"]["status"] == "cancelled"
        assert provider.cancelled


async def test_past_the_cap_a_task_whose_answer_was_never_fetched_outlives_those_already_fetched() -> None:
    """Beyond `MAX_TASKS` the oldest finished task was dropped, though its answer (paid for) had
    never been fetched and later ones, already fetched, were kept. A task whose `tasks/result` was
    answered now makes room first."""
    async with relayed(rate_limit=0) as r:
        await handshake(r)

        async def answer_to(request_id: Any) -> dict[str, Any]:
            while True:  # status notifications come between
                message: dict[str, Any] = await r.server.recv()
                if message.get("id") == request_id:
                    return message

        ids = []
        for n in range(MAX_TASKS):
            await r.server.send(sampling_request(f"s{n}", {**HELLO, "task": {"ttl": 600_000}}))
            ids.append((await answer_to(f"s{n}"))["result"]["task"]["taskId"])
            if n > 0:  # every task but the first has its answer fetched
                await r.server.send(request(f"r{n}", protocol.TASKS_RESULT, {"taskId": ids[-1]}))
                assert is_mock_answer(await answer_to(f"r{n}"), f"r{n}")
        await r.server.send(sampling_request("last", {**HELLO, "task": {"ttl": 600_000}}))
        await answer_to("last")
        await r.server.send(request("get", protocol.TASKS_RESULT, {"taskId": ids[0]}))
        assert is_mock_answer(await answer_to("get"), "get")


async def test_a_client_cancel_cancels_a_sampling_task_made_for_the_cancelled_request() -> None:
    """A task-augmented sampling request made for a request the client cancelled: its Claude call
    ran on (billed) for a result nobody would read; now the task is cancelled with -32800, as a
    later one is refused."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await handshake(r)
        await r.client.send(request("call", "tools/call", {"name": "slow"}))
        await r.server.recv()
        await r.server.send_on("call", sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        await provider.started.wait()
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": "call"}}
        await r.client.send(cancel)
        to_server = [await r.server.recv(), await r.server.recv()]
        assert cancel in to_server
        [status] = [m for m in to_server if m.get("method") == protocol.TASKS_STATUS]
        assert (status["params"]["taskId"], status["params"]["status"]) == (task["taskId"], "cancelled")
        await r.server.send(request(8, protocol.TASKS_RESULT, {"taskId": task["taskId"]}))
        assert cut_off(await r.server.recv(), 8, "call")
        assert provider.cancelled
        await r.server.send_on("call", sampling_request(9, {**HELLO, "task": {"ttl": 60000}}))
        assert cut_off(await r.server.recv(), 9, "call")


async def test_a_sampling_request_cancelled_while_the_user_is_asked_withdraws_the_question() -> None:
    provider = GatedProvider()
    async with relayed(provider, approve="elicit") as r:
        await r.client.send(request(1, "initialize", initialize({"elicitation": {}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(3))
        question = await r.client.recv()
        assert question["method"] == protocol.ELICIT
        await r.server.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}})
        withdrawn = await r.client.recv()
        assert withdrawn["method"] == protocol.CANCELLED
        assert withdrawn["params"]["requestId"] == question["id"]
        assert not provider.started.is_set()


async def cancelled_call(r: Relayed, request_id: Any) -> None:
    """The client's `tools/call` `request_id` reaches the server, then the client cancels it."""
    await r.client.send(request(request_id, "tools/call", {"name": "slow"}))
    await r.server.recv()
    await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": request_id}})


def cut_off(message: Any, sampling_id: Any, client_id: Any) -> bool:
    """Is `message` the proxy's -32800 answer to the server's sampling request `sampling_id`, made
    for the client request `client_id` that the client cancelled?"""
    error = message.get("error", {})
    return bool(
        message.get("id") == sampling_id
        and error.get("code") == protocol.REQUEST_CANCELLED
        and f"the client cancelled request {json.dumps(client_id)}," in error.get("message", "")
    )


async def test_a_client_cancel_withdraws_the_approval_question_of_a_sampling_request_made_for_it() -> None:
    provider = GatedProvider()
    async with relayed(provider, approve="elicit") as r:
        await r.client.send(request(1, "initialize", initialize({"elicitation": {}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.client.send(request("call", "tools/call", {"name": "slow"}))
        await r.server.recv()
        await r.server.send_on("call", sampling_request(3))
        question = await r.client.recv()
        assert question["method"] == protocol.ELICIT
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": "call"}}
        await r.client.send(cancel)
        withdrawn = await r.client.recv()
        assert withdrawn["method"] == protocol.CANCELLED
        assert withdrawn["params"]["requestId"] == question["id"]
        to_server = [await r.server.recv(), await r.server.recv()]
        assert cancel in to_server  # the client's cancel still goes to the server, unchanged
        assert any(cut_off(message, 3, "call") for message in to_server)
        await r.server.send_on("call", sampling_request(4))  # a later one: refused, nobody asked
        assert cut_off(await r.server.recv(), 4, "call")
        assert r.client.nothing_waiting()
        assert not provider.started.is_set()


async def test_a_client_cancel_leaves_the_sampling_of_other_requests_alone() -> None:
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.client.send(request(4, "tools/call", {"name": "slow"}))
        await r.server.recv()
        await r.server.send_on(4, sampling_request(5))  # another request's
        await r.server.send(sampling_request(6))  # on no request's stream (or over a pipe)
        await provider.started.wait()
        await cancelled_call(r, 2)
        assert (await r.server.recv())["method"] == protocol.CANCELLED
        provider.gate.set()
        answers = [await r.server.recv(), await r.server.recv()]
        assert sorted(m["id"] for m in answers if is_mock_answer(m, m["id"])) == [5, 6]
        await r.server.send_on(2, sampling_request(7))  # made for the cancelled one
        assert cut_off(await r.server.recv(), 7, 2)
        await r.server.send(sampling_request(8))
        assert is_mock_answer(await r.server.recv(), 8)


async def test_a_request_sent_in_a_batch_is_not_tied_to_the_sampling_on_its_stream() -> None:
    """A batch's stream carries the sampling of each of its requests: which one a sampling request
    was made for cannot be told, and a cancel of one of them stops none."""
    async with relayed() as r:
        await r.client.send(
            [request(2, "tools/call", {"name": "a"}), request(4, "tools/call", {"name": "b"})]
        )
        await r.server.recv()
        await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 2}})
        await r.server.recv()
        await r.server.send_on(2, sampling_request(3))
        assert is_mock_answer(await r.server.recv(), 3)


async def test_a_cancelled_requests_id_used_again_samples_again() -> None:
    async with relayed() as r:
        await cancelled_call(r, 2)
        await r.server.recv()
        await r.server.send_on(2, sampling_request(3))
        assert cut_off(await r.server.recv(), 3, 2)
        await r.client.send(request(2, "tools/call", {"name": "again"}))
        await r.server.recv()
        await r.server.send_on(2, sampling_request(5))
        assert is_mock_answer(await r.server.recv(), 5)


async def test_the_approval_form_of_a_round_shows_every_question_that_needs_approval() -> None:
    """--approve elicit-tools: the form previewed only the round's first sampling question, so a
    server could put a harmless one first and have the user allow one with tools they never saw."""
    sneaky = {
        "messages": [{"role": "user", "content": {"type": "text", "text": "RUN rm -rf WITH TOOLS"}}],
        "maxTokens": 10,
        "tools": [{"name": "shell_exec", "inputSchema": {"type": "object"}}],
    }
    questions = {"a": SAMPLE, "b": {"method": protocol.SAMPLING, "params": sneaky}}
    async with relayed(approve="elicit-tools") as r:
        await r.client.send(request(1, "tools/call", stateless({"name": "ask"}, {"elicitation": {}})))
        await r.server.recv()
        await r.server.send(result(1, input_required(questions)))
        reduced = (await r.client.recv())["result"]
        message = reduced["inputRequests"][APPROVAL_KEY]["params"]["message"]
        assert "shell_exec" in message
        assert "RUN rm -rf WITH TOOLS" in message


@pytest.mark.parametrize("sealed", [False, True])
async def test_a_server_question_under_the_proxys_approval_key_is_kept_and_answered(sealed: bool) -> None:
    """A server question keyed `mcp-backfill-approval` was overwritten by the proxy's approval
    question: the client never saw it, and its "allow" went to the server as the answer to it."""
    questions = {"s": SAMPLE, APPROVAL_KEY: ELICIT}
    allow = {"action": "accept", "content": {"decision": "allow_once"}}
    theirs = {"action": "accept", "content": {"name": "the server's answer"}}
    sealing: dict[str, Any] = {"request_state_key": SHARED_KEY} if sealed else {}
    async with relayed(approve="elicit", **sealing) as r:
        await r.client.send(request(1, "tools/call", ASKING))
        await r.server.recv()
        await r.server.send(result(1, input_required(questions)))
        reduced = (await r.client.recv())["result"]
        asked = reduced["inputRequests"]
        assert asked[APPROVAL_KEY] == ELICIT  # the server's own question, as it sent it
        (proxy_key,) = (key for key in asked if key != APPROVAL_KEY)
        assert "Send it to Claude?" in asked[proxy_key]["params"]["message"]
        answers = {APPROVAL_KEY: theirs, proxy_key: allow}
        retry = {**ASKING, "inputResponses": answers, "requestState": reduced["requestState"]}
        await r.client.send(request(2, "tools/call", retry))
        resent = (await r.server.recv())["params"]
        assert resent["inputResponses"][APPROVAL_KEY] == theirs
        assert set(resent["inputResponses"]) == {APPROVAL_KEY, "s"}
        assert resent["requestState"] == "server-state"


async def test_a_round_asking_approval_for_more_prompts_than_a_form_shows_is_refused() -> None:
    """A round could hold any number of sampling questions, and the approval form listed them all:
    a server could make the question the user must read as long as it liked."""
    many = {f"s{n}": SAMPLE for n in range(MAX_APPROVAL_PROMPTS + 1)}
    provider = CountingProvider()
    async with relayed(provider, approve="elicit") as r:
        await r.client.send(request(1, "tools/call", ASKING))
        await r.server.recv()
        await r.server.send(result(1, input_required(many)))
        refused = await r.client.recv()
        assert refused["id"] == 1
        assert refused["error"]["code"] == protocol.INTERNAL_ERROR
        message = refused["error"]["message"]
        assert f"{MAX_APPROVAL_PROMPTS + 1} sampling requests" in message
        assert "--approve" in message
        assert "MCP_BACKFILL_APPROVE" in message
        assert provider.calls == 0
        # As many as a form shows are asked about in one form.
        await r.client.send(request(2, "tools/call", ASKING))
        await r.server.recv()
        some = {f"s{n}": SAMPLE for n in range(MAX_APPROVAL_PROMPTS)}
        await r.server.send(result(2, input_required(some)))
        asked = (await r.client.recv())["result"]["inputRequests"]
        assert f"answer {MAX_APPROVAL_PROMPTS} prompts" in asked[APPROVAL_KEY]["params"]["message"]


SHARED_KEY = Secret("a secret the replicas share, 32+ characters long")
ASKING = stateless({"name": "ask"}, {"elicitation": {}})


async def approving_retry(r: Relayed, decision: str) -> dict[str, Any]:
    """A sealed approval round opened by `tools/call` 1, and the params of its retry that answers
    the approval question with `decision`."""
    await r.client.send(request(1, "tools/call", ASKING))
    await r.server.recv()
    await r.server.send(result(1, input_required({"s": SAMPLE})))
    reduced = (await r.client.recv())["result"]
    answer = {"action": "accept", "content": {"decision": decision}}
    return {**ASKING, "inputResponses": {APPROVAL_KEY: answer}, "requestState": reduced["requestState"]}


async def test_a_sealed_approval_token_buys_one_sampling() -> None:
    """With --request-state-key a token could be redeemed again before it expired: replaying the
    retry that allowed an approval round "once" sampled (and billed) again, each time."""
    provider = CountingProvider()
    async with relayed(provider, approve="elicit", request_state_key=SHARED_KEY) as r:
        params = await approving_retry(r, "allow_once")
        await r.client.send(request(2, "tools/call", params))
        retry = await r.server.recv()
        await r.server.send(result(retry["id"], {"content": []}))
        assert await r.client.recv() == result(2, {"content": []})
        await r.client.send(request(3, "tools/call", params))  # the same retry, replayed
        error = await r.client.recv()
        assert (error["id"], error["error"]["code"]) == (3, protocol.INVALID_PARAMS)
        assert provider.calls == 1
        assert r.server.nothing_waiting()


class ClaimsDownStore(MemoryStore):
    """A store shared with other replicas whose claims fail while `down`."""

    shared = True
    description = "redis://ledger:6379/0"
    down = False

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        if self.down:
            raise StoreUnavailable(self.description, "ConnectionError: refused")
        return await super().claim(key, claimant, until)


async def test_a_sealed_approval_whose_claim_met_a_store_outage_can_be_retried() -> None:
    """The replica's own memory took the token before the shared store was asked; when the store
    was down the retry was refused, and so was every later one (`requestState expired or
    unknown`), though nothing had been sampled: the user had to be asked again."""
    provider, store = CountingProvider(), ClaimsDownStore()
    async with relayed(provider, store, approve="elicit", request_state_key=SHARED_KEY) as r:
        params = await approving_retry(r, "allow_once")
        store.down = True
        await r.client.send(request(2, "tools/call", params))
        refused = await r.client.recv()
        assert refused["id"] == 2
        assert "state store" in refused["error"]["message"]
        store.down = False
        await r.client.send(request(3, "tools/call", params))  # the same retry, once the store is back
        retry = await r.server.recv()
        await r.server.send(result(retry["id"], {"content": []}))
        assert await r.client.recv() == result(3, {"content": []})
        assert provider.calls == 1


async def test_allow_for_the_session_counts_only_once_its_sealed_token_was_claimed() -> None:
    """ "Allow for this session" was applied before the token was claimed: a retry whose claim failed
    (the store down, or the token redeemed on another replica) still left every later round of the
    session approved without the user being asked there."""
    provider, store = CountingProvider(), ClaimsDownStore()
    async with relayed(provider, store, approve="elicit", request_state_key=SHARED_KEY) as r:
        params = await approving_retry(r, "allow_session")
        store.down = True
        await r.client.send(request(2, "tools/call", params))
        assert "state store" in (await r.client.recv())["error"]["message"]
        store.down = False
        await r.client.send(request(3, "tools/call", ASKING))  # a new round: the user is asked
        await r.server.recv()
        await r.server.send(result(3, input_required({"s": SAMPLE})))
        asked = (await r.client.recv())["result"]
        assert APPROVAL_KEY in asked["inputRequests"]
        assert provider.calls == 0


class GatedClaimsStore(MemoryStore):
    """A store shared with other replicas whose claims wait for `gate` (`claiming` set meanwhile)."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.claiming, self.gate = anyio.Event(), anyio.Event()

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        self.claiming.set()
        await self.gate.wait()
        return await super().claim(key, claimant, until)


async def test_an_approved_round_the_client_cancels_before_its_sampling_starts_is_refused_in_the_audit_log(
    tmp_path: Path,
) -> None:
    """The client cancels its retry that allowed the round's sampling while the sealed token is
    being claimed (before the proxy samples): nothing is sampled, and its sampling requests had no
    audit line at all. They are `refused` with `-32800`, as those the client's cancel cuts while
    the user is asked."""
    provider, store = CountingProvider(), GatedClaimsStore()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    options: dict[str, Any] = {"approve": "elicit", "request_state_key": SHARED_KEY}
    async with auditing(audit), relayed(provider, store, audit=audit, **options) as r:
        params = await approving_retry(r, "allow_once")
        await r.client.send(request(2, "tools/call", params))
        with anyio.fail_after(10):
            await store.claiming.wait()
        await r.client.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 2}})
        with anyio.fail_after(10):
            while r.relay.state.driving:  # the cancel is in
                await anyio.sleep(0.01)
        store.gate.set()
        with anyio.fail_after(10):
            while not (tmp_path / "audit.jsonl").exists() or not (tmp_path / "audit.jsonl").read_text():
                await anyio.sleep(0.01)
        assert r.server.nothing_waiting()
        assert r.client.nothing_waiting()
    assert provider.calls == 0
    [line] = [json.loads(text) for text in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("refused", 0, None), line
    assert line["error"]["code"] == protocol.REQUEST_CANCELLED


async def test_a_client_id_like_the_proxys_own_is_not_confused_with_a_round_it_resends() -> None:
    """The proxy numbered its re-sent rounds `mcp-backfill:1`, `:2`...: a client request with such
    an id had its answer delivered as the final answer of another request, and got none."""
    async with relayed() as r:
        await r.client.send(request("mcp-backfill:1", "tools/call", stateless({"name": "slow"})))
        await r.server.recv()
        await r.client.send(request(2, "tools/call", stateless({"name": "ask"})))
        await r.server.recv()
        await r.server.send(result(2, input_required({"s": {"method": protocol.SAMPLING, "params": HELLO}})))
        retry = await r.server.recv()
        assert retry["id"] != "mcp-backfill:1"
        await r.server.send(result("mcp-backfill:1", {"content": [{"type": "text", "text": "A"}]}))
        assert (await r.client.recv())["id"] == "mcp-backfill:1"
        await r.server.send(result(retry["id"], {"content": [{"type": "text", "text": "B"}]}))
        assert (await r.client.recv())["id"] == 2


async def test_a_sampling_request_reusing_the_id_of_one_in_flight_is_refused_and_the_first_goes_on() -> None:
    """A server that sent a second sampling request under the id of one the proxy was still answering
    had both sampled (billed twice) and answered under the same id, and the first one's end forgot
    the second: a cancel of that id no longer reached it. The duplicate is refused at once, with no
    Claude call, and the first request is answered (or cancelled) as before."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        provider.started = anyio.Event()
        await r.server.send(sampling_request(3, {**HELLO, "maxTokens": 20}))
        refused = await r.server.recv()
        assert refused["id"] == 3
        assert refused["error"]["code"] == protocol.INVALID_REQUEST
        assert "already in flight" in refused["error"]["message"]
        assert not provider.started.is_set()  # the duplicate was never sampled
        provider.gate.set()
        assert is_mock_answer(await r.server.recv(), 3)  # the first one, answered once
        await r.server.send(sampling_request(3))  # the id is free again once answered
        assert is_mock_answer(await r.server.recv(), 3)
        assert r.client.nothing_waiting()


async def test_a_cancel_reaches_a_sampling_request_whose_id_an_earlier_one_used() -> None:
    """Two sampling requests, the second under a reused id: with the duplicate refused, the id's
    cancel stops the one in flight and is not forwarded to the client."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(sampling_request(3))
        assert (await r.server.recv())["error"]["code"] == protocol.INVALID_REQUEST
        await r.server.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}})
        await r.server.send(request(4, "ping"))
        assert await r.client.recv() == request(4, "ping")  # the cancel was the proxy's, not forwarded
        assert provider.cancelled


async def test_a_request_the_proxy_would_answer_under_the_id_of_one_the_client_answers_is_refused() -> None:
    """The client samples without tools: a plain sampling request goes to it, one offering tools is
    the proxy's. A server reusing the id of the first (still with the client) for the second had
    Claude called (and billed) for it, both answers went to the server under one id, and the id's
    cancel was taken for the proxy's (dropped), so the client's dialog stayed open."""
    provider = CountingProvider()
    async with relayed(provider) as r:
        await r.client.send(request(1, "initialize", initialize({"sampling": {}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(3))
        assert await r.client.recv() == sampling_request(3)
        await r.server.send(sampling_request(3, WITH_TOOLS))  # the proxy's to answer, under id 3
        refused = await r.server.recv()
        assert refused["id"] == 3
        assert refused["error"]["code"] == protocol.INVALID_REQUEST
        assert "already in flight" in refused["error"]["message"]
        assert provider.calls == 0
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}}
        await r.server.send(cancel)
        assert await r.client.recv() == cancel  # the client's request: its cancel reaches it
        await r.server.send(sampling_request(3, WITH_TOOLS))  # the id is free again once cancelled
        assert is_mock_answer(await r.server.recv(), 3)
        await r.server.send(sampling_request(4))
        assert await r.client.recv() == sampling_request(4)
        await r.client.send(result(4, {"role": "assistant", "content": {"type": "text", "text": "x"}}))
        assert (await r.server.recv())["id"] == 4
        await r.server.send(sampling_request(4, WITH_TOOLS))  # and once the client answered it
        assert is_mock_answer(await r.server.recv(), 4)
        assert provider.calls == 2


async def test_a_request_for_the_client_under_the_id_of_one_the_proxy_answers_is_refused() -> None:
    """The reverse: an elicitation under the id of a sampling request the proxy is still answering
    reached the client, and the server got two answers under one id."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(request(3, "elicitation/create", ELICIT["params"]))
        refused = await r.server.recv()
        assert refused["id"] == 3
        assert refused["error"]["code"] == protocol.INVALID_REQUEST
        provider.gate.set()
        assert is_mock_answer(await r.server.recv(), 3)
        await r.server.send(request(4, "ping"))
        assert await r.client.recv() == request(4, "ping")  # the elicitation never reached it


class PlaceholderCaller(MockProvider):
    """Claude calling the last tool of the request: the placeholder of a tool only the history names."""

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        message = await super().create_message(request, on_progress=on_progress, meter=meter)
        call = {"type": "tool_use", "id": "toolu_x", "name": request["tools"][-1]["name"], "input": {}}
        return {**message, "content": [call], "stop_reason": "tool_use"}


async def test_claude_calling_a_tool_the_request_does_not_offer_is_an_error_and_is_charged() -> None:
    history = {
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "weather?"}},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "gone", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "toolUseId": "a", "content": []}]},
        ],
        "maxTokens": 10,
        "tools": [{"name": "kept", "inputSchema": {"type": "object"}}],
        "toolChoice": {"mode": "required"},
    }
    async with relayed(PlaceholderCaller()) as r:
        await r.server.send(sampling_request(3, history))
        answer = await r.server.recv()
        assert answer["id"] == 3
        assert answer["error"]["code"] == protocol.INTERNAL_ERROR
        assert '"gone"' in answer["error"]["message"]
        assert r.relay.answerer.session is not None
        assert r.relay.answerer.session.budget.used > 0  # the call was made: it is charged


async def test_a_tasks_result_reusing_the_id_of_a_sampling_request_in_flight_is_refused() -> None:
    """The proxy answers both; under one id, the sampling's cancel would have stopped the wrong one."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await handshake(r)
        await r.server.send(sampling_request(9, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(request(3, "tasks/result", {"taskId": task["taskId"]}))
        refused = await r.server.recv()
        assert refused["id"] == 3
        assert refused["error"]["code"] == protocol.INVALID_REQUEST
        await r.server.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}})
        await r.server.send(request(4, "ping"))
        assert await r.client.recv() == request(4, "ping")
        assert provider.cancelled  # the sampling request 3 was the one cancelled


async def test_an_id_the_server_cancelled_is_free_at_once_though_its_call_is_still_stopping() -> None:
    """The server cancelled request 3 and then used 3 again while the cancelled call was still
    stopping (settling its charge): that is no duplicate, the new request is answered, and the old
    one's end does not forget it (a cancel of 3 still reaches it)."""
    provider = SlowToStopProvider()
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}})
        await r.server.send(sampling_request(3))
        try:
            assert is_mock_answer(await r.server.recv(), 3)
        finally:
            provider.release.set()  # else a failure would hang: the cancelled call waits for it
        await r.server.send(request(4, "ping"))
        assert await r.client.recv() == request(4, "ping")
        assert r.server.nothing_waiting()  # the cancelled request got no answer


class StopsSlowlyThenGated(SlowToStopProvider):
    """The first call as `SlowToStopProvider`'s; the second waits for `gate`, noting a cancellation."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.second_started = anyio.Event()
        self.second_cancelled = False

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        if self.calls == 1:
            self.calls += 1
            self.second_started.set()
            try:
                await self.gate.wait()
            except anyio.get_cancelled_exc_class():
                self.second_cancelled = True
                raise
        return await super().create_message(request, on_progress=on_progress, meter=meter)


async def test_a_cancel_reaches_a_request_reusing_the_id_of_a_cancelled_one_that_ended_since() -> None:
    """The cancelled request's end removed the new request's entry under their shared id: the
    server's cancel of the new one went to the client, and its Claude call ran (and billed) on."""
    provider = StopsSlowlyThenGated()
    cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 3}}
    async with relayed(provider) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(cancel)
        await r.server.send(sampling_request(3))
        try:
            await provider.second_started.wait()
        finally:
            provider.release.set()
        await anyio.wait_all_tasks_blocked()  # the cancelled request has ended
        await r.server.send(cancel)
        await r.server.send(request(4, "ping"))
        try:
            assert await r.client.recv() == request(4, "ping")  # the cancel was the proxy's
            assert provider.second_cancelled
        finally:
            provider.gate.set()


async def test_an_upstream_flooding_sampling_requests_is_read_only_as_fast_as_they_are_answered() -> None:
    """An upstream writing sampling requests and not reading the answers (here: Claude never answers,
    and the upstream's input fills up) had the relay read on without end, each request a task holding
    its params: 1 GB of requests grew the proxy by 1.2 GB. The relay reads no further while
    `ANSWERING_LIMIT` are being answered (the upstream's writes wait), and nothing is lost: once
    Claude answers, every request gets its answer."""
    total = 2000
    provider = GatedProvider()
    sent = 0
    async with relayed(provider=provider, rate_limit=0) as r, anyio.create_task_group() as tg:

        async def flood() -> None:
            nonlocal sent
            for n in range(total):
                await r.server.send(sampling_request(n))
                sent += 1

        tg.start_soon(flood)
        await anyio.wait_all_tasks_blocked()
        assert r.relay.answerer.hand.running <= ANSWERING_LIMIT
        assert sent < total
        provider.gate.set()
        answered: set[Any] = set()
        while len(answered) < total:
            message = await r.server.recv()
            answered.add(message["id"])
        assert answered == set(range(total))


async def test_an_upstream_flooding_task_augmented_sampling_is_read_only_as_fast_as_it_is_answered() -> None:
    """The same with sampling tasks, and `tasks/result` requests for them: each was a task of the
    relay's, held while its answer waited for an upstream not reading."""
    total = 1500
    provider = GatedProvider()
    sent = 0
    async with relayed(provider=provider, rate_limit=0) as r, anyio.create_task_group() as tg:
        await handshake(r)

        async def flood() -> None:
            nonlocal sent
            for n in range(total):
                await r.server.send(sampling_request(f"t{n}", {**HELLO, "task": {"ttl": 60000}}))
                sent += 1

        tg.start_soon(flood)
        await anyio.wait_all_tasks_blocked()
        assert r.relay.answerer.hand.running <= ANSWERING_LIMIT
        assert sent < total
        provider.gate.set()
        created: set[Any] = set()
        while len(created) < total:
            message = await r.server.recv()
            if "id" in message:
                assert "task" in message["result"]
                created.add(message["id"])
        assert created == {f"t{n}" for n in range(total)}


@pytest.mark.parametrize("sealed", [False, True])
async def test_an_approval_answered_after_approve_timeout_samples_nothing(sealed: bool) -> None:
    """2026-07-28: the approval question of a round waited for `--input-stash-ttl` (300 s), not
    `--approve-timeout`: with `--approve-timeout 0.1` an "Allow" given long after still sampled."""
    provider = CountingProvider()
    key = SHARED_KEY if sealed else None
    async with relayed(provider, approve="elicit", approve_timeout=0.1, request_state_key=key) as r:
        params = await approving_retry(r, "allow_once")
        await anyio.sleep(0.3)  # the user answers after --approve-timeout
        await r.client.send(request(2, "tools/call", params))
        refused = await r.client.recv()
        assert refused["id"] == 2
        assert "--approve-timeout" in refused["error"]["message"]
        assert provider.calls == 0
        assert r.server.nothing_waiting()


async def test_a_batch_the_proxy_answers_wholly_gets_one_array() -> None:
    """--era handshake: `server/discover` in a client batch was answered as a message of its own;
    a batch is answered with one array (JSON-RPC 2.0)."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}}
    async with relayed(era="handshake") as r:
        await r.client.send([request(1, "server/discover"), request(2, "server/discover")])
        answer = await r.client.recv()
        assert isinstance(answer, list)
        assert [(item["id"], item["error"]["code"]) for item in answer] == [
            (1, protocol.METHOD_NOT_FOUND),
            (2, protocol.METHOD_NOT_FOUND),
        ]
        await r.client.send([request(3, "server/discover"), note])  # the note goes on alone
        assert await r.server.recv() == [note]
        answer = await r.client.recv()
        assert isinstance(answer, list)
        assert [item["id"] for item in answer] == [3]
        assert r.client.nothing_waiting()


async def test_a_batch_partly_answered_by_the_proxy_gets_one_array_with_the_servers_answers() -> None:
    async with relayed(era="handshake") as r:
        await r.client.send([request(1, "tools/list"), request(2, "server/discover"), request(3, "ping")])
        assert [item["id"] for item in await r.server.recv()] == [1, 3]
        assert r.client.nothing_waiting()  # the proxy's answer waits for the batch's
        await r.server.send([result(1, {"tools": []}), result(3, {})])
        answer = await r.client.recv()
        assert isinstance(answer, list)
        assert sorted(str(item["id"]) for item in answer) == ["1", "2", "3"]
        assert next(item for item in answer if item["id"] == 2)["error"]["code"] == protocol.METHOD_NOT_FOUND
        assert r.client.nothing_waiting()


async def test_a_large_answer_to_a_batch_gets_the_proxys_answers_too() -> None:
    """A large response is relayed without being decoded; one the proxy holds answers for is not."""
    async with relayed(era="handshake") as r:
        await r.client.send([request(1, "tools/call", {"name": "x"}), request(2, "server/discover")])
        await r.server.recv()
        await r.server.send(result(1, {"text": "y" * (LARGE_MESSAGE + 10)}))
        answer = await r.client.recv()
        assert isinstance(answer, list)
        assert [item["id"] for item in answer] == [1, 2]
        assert r.client.nothing_waiting()


async def test_the_proxys_answer_in_a_batch_is_not_lost_when_the_servers_answer_never_comes() -> None:
    async with relayed(era="handshake") as r:
        await r.client.send([request(1, "tools/call", {"name": "x"}), request(2, "server/discover")])
        await r.server.recv()
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 1}}
        await r.client.send(cancel)  # the server's answer will not be relayed
        assert await r.server.recv() == cancel
        answer = await r.client.recv()
        answer = answer if isinstance(answer, list) else [answer]
        assert [(item["id"], item["error"]["code"]) for item in answer] == [(2, protocol.METHOD_NOT_FOUND)]


# -- duplicate members ------------------------------------------------------------------------------


def large_with_tail(message: dict[str, Any], tail: bytes) -> bytes:
    """`message` padded past `LARGE_MESSAGE`, with `tail` (`,"name":value` members) written after its
    own members: what a parser keeping the last of duplicate members (orjson, `json`, pydantic's,
    `JSON.parse`) reads, and the client's SDK with it, is the tail's."""
    raw = json.dumps({**message, "pad": "x" * LARGE_MESSAGE}).encode()
    return raw[:-1] + tail + b"}"


async def test_a_large_answer_repeating_its_id_is_routed_by_the_id_the_client_reads() -> None:
    """Its head names request 1, its last `id` request 9 (a round the proxy drives): the client reads
    9, so must the proxy, which answers the round's sampling question instead of handing it on."""
    call = request(9, "tools/call", stateless({"name": "ask"}))
    async with relayed() as r:
        await r.client.send(request(1, "tools/list", stateless({})))
        await r.server.recv()
        await r.client.send(call)
        await r.server.recv()
        await r.server.send_raw(large_with_tail(result(1, input_required({"s": SAMPLE})), b',"id":9'))
        retry = await r.server.recv()
        assert retry["id"].startswith("mcp-backfill:")
        assert retry["params"]["inputResponses"]["s"]["model"].startswith("mock/")
        await r.server.send(result(retry["id"], {"content": []}))
        assert await r.client.recv() == result(9, {"content": []})
        await r.server.send(result(1, {"tools": []}))
        assert await r.client.recv() == result(1, {"tools": []})
        assert r.client.nothing_waiting()


async def test_a_large_answer_that_is_also_a_sampling_request_is_answered_by_the_proxy() -> None:
    """`result` at its head, `method` after it: the client's SDK reads a sampling request (a
    message with a `method` is a request), which --mode always must never let reach the client."""
    async with relayed(era="handshake", mode="always") as r:
        await r.client.send(request(0, protocol.INITIALIZE, initialize({"sampling": {}})))
        await r.server.recv()
        await r.server.send(result(0, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.client.send(request(1, "tools/call", {"name": "x"}))
        await r.server.recv()
        sampling = json.dumps({"method": protocol.SAMPLING, "params": HELLO})[1:-1].encode()
        await r.server.send_raw(large_with_tail(result(1, {"content": []}), b"," + sampling))
        answer = await r.server.recv()
        assert is_mock_answer(answer, 1)
        assert r.client.nothing_waiting()


async def test_a_request_repeating_its_members_is_read_as_the_server_reads_it() -> None:
    """The relay decides from its own reading (orjson: the last of duplicate members) and forwards the
    bytes: the server's SDK (pydantic's, `JSON.parse`) reads the same message, so the answer it gives
    under the last `id` is the one the relay routes, and the initialize it reads is the one whose
    capabilities the relay read (here: sampling declared, nothing backfilled)."""
    params = json.dumps(initialize({"sampling": {"tools": {}}})).encode()
    opening = (
        b'{"jsonrpc":"2.0","id":"first","method":"ping","params":{"capabilities":{}},"id":0,'
        b'"method":"initialize","params":' + params + b"}"
    )
    async with relayed(era="handshake") as r:
        await r.client.send_raw(opening)
        assert await r.server.from_relay.receive() == opening  # its bytes, as the server reads them
        assert json.loads(opening)["params"]["capabilities"] == {"sampling": {"tools": {}}}
        await r.server.send(result(0, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        assert (await r.client.recv())["id"] == 0
        call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"id":2}'
        await r.client.send_raw(call)
        assert await r.server.from_relay.receive() == call
        await r.server.send(result(2, {"content": []}))
        assert await r.client.recv() == result(2, {"content": []})
        assert r.relay.state.client_requests == {}
        assert r.relay.state.client.sampling == {"tools": {}}


async def test_unknown_protocol_revisions_are_warned_about_a_bounded_number_of_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client whose every request names another revision (a long-lived 2026-07-28 hub serves one
    identity's requests for weeks) grows neither the session's memory nor the log without bound."""
    versions = 500
    async with relayed() as flow:
        for i in range(versions):
            meta = {protocol.META_PROTOCOL_VERSION: f"2099-{i:04d}-{'x' * 1000}"}
            await flow.client.send(request(i, "tools/list", {"_meta": meta}))
            assert (await flow.server.recv())["id"] == i  # passed through untouched
        remembered = len(flow.relay.state.warned_versions)
    warnings = [r for r in caplog.records if "protocol revision not known" in r.getMessage()]
    assert remembered <= 16
    assert 1 <= len(warnings) <= 17
    assert all(len(str(getattr(r, "protocol_version", ""))) <= 256 for r in warnings)


async def test_a_sampling_request_refused_for_reusing_an_id_in_flight_is_in_the_audit_log(
    tmp_path: Path,
) -> None:
    """The audit log has every sampling exchange, whatever its outcome: a sampling request refused at
    once (-32600) for reusing the id of one the proxy is still answering was missing from it."""
    provider = GatedProvider()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    async with auditing(audit), relayed(provider, audit=audit) as r:
        await r.server.send(sampling_request(3))
        await provider.started.wait()
        await r.server.send(sampling_request(3))
        assert (await r.server.recv())["error"]["code"] == protocol.INVALID_REQUEST
        provider.gate.set()
        assert "result" in await r.server.recv()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(line["request_id"], line["outcome"]) for line in lines] == [(3, "refused"), (3, "answered")]
    refused = lines[0]
    assert refused["error"]["code"] == protocol.INVALID_REQUEST
    assert (refused["calls"], refused["charged"], refused["client"]) == (0, None, "process")


async def test_a_sampling_task_the_clients_cancel_cuts_while_the_user_is_asked_is_refused_in_the_audit_log(
    tmp_path: Path,
) -> None:
    """The client cancels the request a sampling task was made for while the task's approval
    question is open: nothing is sampled, and the audit line is `refused` with `-32800`, as for a
    plain sampling request cut then (and as the task's result has it); it said `cancelled`."""
    provider = GatedProvider()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    async with auditing(audit), relayed(provider, audit=audit, approve="elicit") as r:
        await r.client.send(request(1, "initialize", initialize({"elicitation": {}})))
        await r.server.recv()
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.client.send(request("call", "tools/call", {"name": "slow"}))
        await r.server.recv()
        await r.server.send_on("call", sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        assert (await r.client.recv())["method"] == protocol.ELICIT
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": "call"}}
        await r.client.send(cancel)
        await r.server.send(request(8, protocol.TASKS_RESULT, {"taskId": task["taskId"]}))
        with anyio.fail_after(10):
            while True:
                answer = await r.server.recv()
                if answer.get("id") == 8:
                    break
        assert answer["error"]["code"] == protocol.REQUEST_CANCELLED
    assert not provider.started.is_set()
    [line] = [json.loads(text) for text in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (line["outcome"], line["calls"], line["charged"]) == ("refused", 0, None), line
    assert line["error"]["code"] == protocol.REQUEST_CANCELLED


async def test_a_task_augmented_request_the_server_cancels_before_its_task_is_sent_samples_nothing() -> None:
    """The server cancelled its task-augmented sampling request while the proxy's answer (the task)
    had yet to go out: its upstream input was full. It has no task id to `tasks/cancel`, so its
    `notifications/cancelled` (the TypeScript SDK's on a timeout or an abort) is all it can send;
    the proxy dropped it as the cancel of a request already answered, and once the task had gone
    out ran its Claude call (billed) for an answer the server had given up on."""
    provider = CountingProvider()
    async with relayed(provider) as r:
        await handshake(r)
        for n in range(100):  # the server's input fills up: it reads nothing for now
            await r.client.send(request(f"p{n}", "ping"))
        await anyio.wait_all_tasks_blocked()
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        await anyio.wait_all_tasks_blocked()  # the task waits to go out
        await r.server.send({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 7}})
        await anyio.wait_all_tasks_blocked()
        for _ in range(100):
            await r.server.recv()
        await r.server.send(request(8, "ping"))
        assert await r.client.recv() == request(8, "ping")
        await anyio.wait_all_tasks_blocked()
        assert provider.calls == 0
        assert not r.relay.tasks.book.tasks
        assert not any(m.get("method") == protocol.TASKS_STATUS for m in await drained(r.server))


async def drained(peer: Peer) -> list[Any]:
    """What `peer` has been sent and not read yet."""
    messages = []
    while not peer.nothing_waiting():
        messages.append(await peer.recv())
    return messages


async def test_the_server_can_poll_and_cancel_its_tasks_while_the_most_the_proxy_answers_are_working() -> (
    None
):
    """With `ANSWERING_LIMIT` sampling tasks working (long Claude answers: what tasks are for), the
    relay read nothing more from the upstream until one ended: the server's `tasks/get` polls went
    unanswered (its SDK's request timeout failed them) and its `tasks/cancel` could not stop a call.
    Those are answered at once, without the upstream being read any faster than they are answered.
    (As many wait with `--max-waiting-sampling` raised, or with the user asked to approve each.)"""
    provider = GatedProvider()
    async with relayed(provider=provider, rate_limit=0, max_waiting_sampling=ANSWERING_LIMIT) as r:
        await handshake(r)
        tasks = []
        for n in range(ANSWERING_LIMIT):
            await r.server.send(sampling_request(f"t{n}", {**HELLO, "task": {"ttl": 600_000}}))
            tasks.append((await r.server.recv())["result"]["task"]["taskId"])
        await anyio.wait_all_tasks_blocked()
        assert r.relay.answerer.hand.full
        try:
            await r.server.send(request("get", protocol.TASKS_GET, {"taskId": tasks[0]}))
            got = await r.server.recv()
            assert (got["id"], got["result"]["status"]) == ("get", "working")
            await r.server.send(request("list", protocol.TASKS_LIST, {}))
            assert len((await r.server.recv())["result"]["tasks"]) == 50
            await r.server.send(request("cancel", protocol.TASKS_CANCEL, {"taskId": tasks[1]}))
            answers = [await r.server.recv(), await r.server.recv()]  # and its status notification
            [cancelled] = [m for m in answers if m.get("id") == "cancel"]
            assert cancelled["result"]["status"] == "cancelled"
        finally:
            provider.gate.set()


async def test_a_new_session_the_proxy_declares_no_tasks_for_has_none() -> None:
    """The client began a new session (`initialize` again), now able to sample with tools: the
    proxy passed its capabilities on untouched, declaring no tasks, but still took the session for
    one it had declared them in (as the first one). A task-augmented sampling request was answered
    by the proxy (a Claude call, billed) instead of going to the client that samples itself."""
    provider = CountingProvider()
    async with relayed(provider) as r:
        await r.client.send(request(1, "initialize", initialize({})))
        assert (await r.server.recv())["params"]["capabilities"]["tasks"] == SAMPLING_TASKS
        await r.server.send(result(1, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        sampling: dict[str, Any] = {"sampling": {"tools": {}}}
        await r.client.send(request(2, "initialize", initialize(sampling)))
        assert (await r.server.recv())["params"]["capabilities"] == sampling
        await r.server.send(result(2, {"protocolVersion": "2025-11-25", "capabilities": {}}))
        await r.client.recv()
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        assert (await r.client.recv())["id"] == 7  # the client's, as it would be in a first session
        await r.server.send(request(8, protocol.TASKS_GET, {"taskId": "the-clients"}))
        assert (await r.client.recv())["id"] == 8
        assert provider.calls == 0
        assert r.server.nothing_waiting()


async def test_answers_and_cancels_from_the_server_pass_while_the_most_the_proxy_answers_wait() -> None:
    """With `ANSWERING_LIMIT` of the server's sampling requests in hand, the relay read nothing more
    from the upstream until one ended, although answers and notifications add nothing to the hand:
    the server's answer to a client request waited for a Claude call, and so did the server's
    cancel of a sampling request, which would have made room itself."""
    provider = GatedProvider()
    async with relayed(provider=provider, rate_limit=0, max_waiting_sampling=ANSWERING_LIMIT) as r:
        await handshake(r)
        await r.client.send(request(2, "tools/list"))
        assert (await r.server.recv())["id"] == 2
        for n in range(ANSWERING_LIMIT):
            await r.server.send(sampling_request(f"s{n}"))
        await anyio.wait_all_tasks_blocked()
        assert r.relay.answerer.hand.full
        try:
            with anyio.fail_after(10):
                await r.server.send(result(2, {"tools": []}))
                assert (await r.client.recv())["id"] == 2  # the client's answer, not held back
                cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": "s200"}}
                await r.server.send(cancel)
                while r.relay.answerer.hand.full:  # the cancelled request leaves the hand
                    await anyio.sleep(0.01)
        finally:
            provider.gate.set()


async def reinitialized(r: Relayed) -> list[Any]:
    """The client begins a new session (`initialize` again, id 2): what the server is sent from then
    on, once the relay has settled, the new `initialize` first."""
    await r.client.send(request(2, "initialize", initialize({})))
    sent = [await r.server.recv()]
    await anyio.wait_all_tasks_blocked()
    return sent + await drained(r.server)


async def test_a_tasks_result_of_the_session_before_gets_no_answer_in_the_new_one() -> None:
    """The server of the first session waited on `tasks/result` for a working task when the client
    began a new session: ending the task woke the wait, and its answer (the task's cancellation
    error) went to the upstream after the new `initialize`, into a session that never asked (over
    `--upstream-url`, POSTed to the new upstream session). It is dropped."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await handshake(r)
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        await provider.started.wait()
        await r.server.send(request(8, protocol.TASKS_RESULT, {"taskId": task["taskId"]}))
        await anyio.wait_all_tasks_blocked()
        sent = await reinitialized(r)
        assert [m.get("method") for m in sent] == ["initialize"], sent
        assert provider.cancelled


async def test_a_task_whose_answer_had_yet_to_go_out_is_not_sent_into_the_new_session() -> None:
    """A task-augmented sampling request read just before the client's new `initialize` (the stdio
    pipes' read callbacks relay both before any task runs): the task was ended with the session,
    but its `CreateTaskResult` had yet to be sent, and went to the upstream after the new
    `initialize`, into the new session (a task it never asked for, cancelled already)."""
    provider = CountingProvider()
    async with relayed(provider, at_once=True) as r:
        await handshake(r)
        tasked = sampling_request(7, {**HELLO, "task": {"ttl": 60000}})
        assert r.relay.from_upstream_now(json.dumps(tasked).encode())
        assert r.relay.from_client_now(json.dumps(request(2, "initialize", initialize({}))).encode())
        await anyio.wait_all_tasks_blocked()
        sent = await drained(r.server)
        assert [m.get("method") for m in sent] == ["initialize"], sent
        assert provider.calls == 0
        assert not r.relay.tasks.book.tasks


@pytest.mark.parametrize("cancelled_by", ["server", "client"])
async def test_the_status_of_a_task_cancelled_just_before_a_new_session_is_not_sent_into_it(
    cancelled_by: str,
) -> None:
    """A task cancelled (by the server's `tasks/cancel`, or by the client's cancel of the request it
    was made for) just before the client's new `initialize`: its `notifications/tasks/status`, sent
    from a task of its own, went to the upstream after the new `initialize`, about a task of a
    session that no longer exists."""
    provider = GatedProvider()
    async with relayed(provider, at_once=True) as r:
        await handshake(r)
        await r.client.send(request("call", "tools/call", {"name": "slow"}))
        await r.server.recv()
        await r.server.send_on("call", sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        await provider.started.wait()
        await anyio.wait_all_tasks_blocked()
        if cancelled_by == "server":
            cancel = request(8, protocol.TASKS_CANCEL, {"taskId": task["taskId"]})
            assert r.relay.from_upstream_now(json.dumps(cancel).encode())
        else:
            cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": "call"}}
            assert r.relay.from_client_now(json.dumps(cancel).encode())
        assert r.relay.from_client_now(json.dumps(request(2, "initialize", initialize({}))).encode())
        await anyio.wait_all_tasks_blocked()
        sent = await drained(r.server)
        assert protocol.TASKS_STATUS not in [m.get("method") for m in sent], sent
        assert sent[-1]["method"] == "initialize"
        assert provider.cancelled


class BilledThenGated(GatedProvider):
    """The gated provider whose call has begun streaming (its usage reported, billed) when it waits."""

    USAGE = {"input_tokens": 5, "output_tokens": 3}

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        if meter is not None and not self.started.is_set():
            meter.begin_attempt()
            meter.report(self.USAGE)
        return await super().create_message(request, on_progress=on_progress, meter=meter)


async def test_a_working_task_evicted_to_make_room_is_said_to_be_evicted_not_expired(tmp_path: Path) -> None:
    """Past `MAX_TASKS` with none of the session's tasks finished (the server sent a batch of them),
    the oldest, still working, is dropped to make room: its Claude call is stopped (and audited as
    cancelled, charged like any cancelled call). Its status, its waiting `tasks/result` and any later
    lookup said it had expired (or was not found), though its TTL had ten minutes to run: they say
    it was evicted, and by which limit."""
    provider = BilledThenGated()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    async with auditing(audit), relayed(provider, audit=audit, rate_limit=0) as r:
        await handshake(r)
        await r.server.send(sampling_request("first", {**HELLO, "task": {"ttl": 600_000}}))
        first = (await r.server.recv())["result"]["task"]["taskId"]
        await provider.started.wait()
        await r.server.send(request("wait", protocol.TASKS_RESULT, {"taskId": first}))
        await anyio.wait_all_tasks_blocked()
        await r.server.send(
            [sampling_request(f"s{n}", {**HELLO, "task": {"ttl": 600_000}}) for n in range(MAX_TASKS)]
        )
        answers: dict[Any, dict[str, Any]] = {}
        statuses: list[dict[str, Any]] = []
        asked = False
        try:
            with anyio.fail_after(30):
                while "wait" not in answers or not statuses or "get" not in answers:
                    message = await r.server.recv()
                    if (
                        message.get("method") == protocol.TASKS_STATUS
                        and message["params"]["taskId"] == first
                    ):
                        statuses.append(message["params"])
                    elif "id" in message:
                        answers[message["id"]] = message
                    if "wait" in answers and statuses and not asked:
                        asked = True
                        await r.server.send(request("get", protocol.TASKS_GET, {"taskId": first}))
        finally:
            provider.gate.set()
        assert provider.cancelled
    [status] = statuses
    assert status["status"] == "cancelled"
    for said in (
        status["statusMessage"],
        answers["wait"]["error"]["message"],
        answers["get"]["error"]["message"],
    ):
        assert all(word in said for word in ("evicted", "MAX_TASKS", str(MAX_TASKS))), said
        assert "expired" not in said, said
    assert answers["wait"]["error"]["code"] == protocol.REQUEST_CANCELLED
    assert answers["get"]["error"]["code"] == protocol.INVALID_PARAMS
    assert answers["get"]["error"]["message"].startswith("Failed to retrieve task: Task not found")
    lines = [json.loads(text) for text in (tmp_path / "audit.jsonl").read_text().splitlines()]
    [line] = [line for line in lines if line["request_id"] == "first"]
    assert (line["outcome"], line["calls"]) == ("cancelled", 1), line
    assert line["charged"]["input_tokens"] == BilledThenGated.USAGE["input_tokens"], line  # billed: charged
    assert line["charged"]["output_tokens"] >= BilledThenGated.USAGE["output_tokens"], line


async def test_a_tasks_result_the_server_cancels_before_the_proxy_looks_at_it_gets_no_answer() -> None:
    """The server's `tasks/result` and its cancel read together (the stdio pipe's read callback
    relays both before any task runs): the cancel found no wait to stop yet (the wait began when
    the answering task first ran), so it was dropped, and the answer went out all the same once the
    task finished, for a request the server had given up (its id perhaps used again by then)."""
    provider = GatedProvider()
    async with relayed(provider, at_once=True) as r:
        await handshake(r)
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        await provider.started.wait()
        await anyio.wait_all_tasks_blocked()
        fetch = request(8, protocol.TASKS_RESULT, {"taskId": task["taskId"]})
        cancel = {"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": {"requestId": 8}}
        assert r.relay.from_upstream_now(json.dumps(fetch).encode())
        assert r.relay.from_upstream_now(json.dumps(cancel).encode())
        provider.gate.set()
        await anyio.wait_all_tasks_blocked()
        sent = await drained(r.server)
        assert [m.get("method") for m in sent] == [protocol.TASKS_STATUS], sent
        assert r.client.nothing_waiting()


async def test_a_tasks_result_under_the_id_of_one_just_read_is_refused_as_a_duplicate() -> None:
    """Two `tasks/result` under one id read together: the first was not yet counted as being
    answered (it was from when its answering task first ran until its wait ended), so the second
    was taken too, and the server got two answers under one id."""
    async with relayed(at_once=True) as r:
        await handshake(r)
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 60000}}))
        task = (await r.server.recv())["result"]["task"]
        assert (await r.server.recv())["params"]["status"] == "completed"
        fetch = json.dumps(request(8, protocol.TASKS_RESULT, {"taskId": task["taskId"]})).encode()
        assert r.relay.from_upstream_now(fetch)
        assert r.relay.from_upstream_now(fetch)
        await anyio.wait_all_tasks_blocked()
        sent = await drained(r.server)
        assert sorted("result" in m for m in sent) == [False, True], sent
        [refusal] = [m for m in sent if "error" in m]
        assert (refusal["id"], refusal["error"]["code"]) == (8, protocol.INVALID_REQUEST)


async def test_a_task_whose_ttl_passed_while_working_is_forgotten_not_kept_past_it() -> None:
    """A task whose TTL passes while it works is cancelled and forgotten: requests about it get the
    spec's error. When its call's deadline ended it before anything looked at the book, ending it
    counted as a task that had just finished, kept three seconds past its TTL for its answer to be
    fetched (it has none): `tasks/get` and `tasks/list` showed it, or not, by the timing."""
    provider = GatedProvider()
    async with relayed(provider) as r:
        await handshake(r)
        await r.server.send(sampling_request(7, {**HELLO, "task": {"ttl": 300}}))
        task = (await r.server.recv())["result"]["task"]
        with anyio.fail_after(30):
            status = await r.server.recv()
        assert (status["params"]["status"], status["params"]["statusMessage"]) == (
            "cancelled",
            "The task expired.",
        )
        await r.server.send(request(8, protocol.TASKS_GET, {"taskId": task["taskId"]}))
        got = await r.server.recv()
        assert got["error"] == {
            "code": protocol.INVALID_PARAMS,
            "message": "Failed to retrieve task: Task not found",
        }
        await r.server.send(request(9, protocol.TASKS_LIST, {}))
        assert (await r.server.recv())["result"] == {"tasks": []}
