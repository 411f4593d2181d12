"""Which HTTP stream each server message goes to: handshake sessions and the 2026-07-28 mux."""

from __future__ import annotations

import contextlib
import gc
import json
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import anyio
import pytest

from mcp_backfill.errors import DuplicateRequestId, TooManyPosts
from mcp_backfill.sidecar.http_io import HttpCall, pump_sse
from mcp_backfill.transports.event_stream import EventStream, parse_event_id, sse_event
from mcp_backfill.transports.http_mux import EXCHANGE_BUFFER, HOLD_UP_EVENTS, MuxChannel
from mcp_backfill.transports.http_server import (
    FINISHED_STREAMS_KEPT,
    MAX_OPEN_POSTS,
    SessionChannel,
    SessionRouter,
)
from mcp_backfill.transports.queue import MessageQueue
from tests.sidecar_harness import sse_messages

pytestmark = pytest.mark.anyio


def encode(message: Any) -> bytes:
    return json.dumps(message).encode()


def request(request_id: Any, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def notification(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def result(request_id: Any, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": fields}


def batch_router() -> SessionRouter:
    """A session at 2025-03-26, the last revision whose clients read batches."""
    router = SessionRouter(16)
    router.protocol_version = "2025-03-26"
    return router


def messages(stream: EventStream) -> list[Any]:
    return [json.loads(data) for _, data in stream.after(0)]


async def test_responses_go_to_the_post_that_carried_the_request() -> None:
    router = SessionRouter(16)
    first = router.open_post([request(1)])
    second = router.open_post([request("1")])
    router.route(encode(result("1", n=2)))
    router.route(encode(result(1, n=1)))
    assert messages(first) == [result(1, n=1)]
    assert messages(second) == [result("1", n=2)]
    assert first.finished
    assert second.finished
    assert router.in_flight == 0


async def test_routing_names_the_post_stream_a_message_completed_and_no_other() -> None:
    router = SessionRouter(16)
    batch = router.open_post([request(1), request(2)])
    single = router.open_post([request(3)])
    assert router.route(encode(notification("notifications/message", data="log")), related=3) is None
    assert router.route(encode(result(1))) is None  # the batch still waits for 2
    assert router.route(encode(result(2))) is batch
    assert router.route(encode(result(3))) is single
    assert router.route(encode(result(3))) is None  # nobody waits for it any more: the GET stream


async def test_sending_a_quick_answer_hands_it_to_the_waiting_handler_from_the_sending_task() -> None:
    router = SessionRouter(16)
    inbox = MessageQueue[bytes](4)
    channel = SessionChannel(router, inbox)
    stream = router.open_post([request(1)])
    written: list[bytes] = []

    async def answer_now() -> None:
        written.extend(data for _, data in stream.after(0))

    stream.answer_now = answer_now
    await channel.send(encode(notification("notifications/message", data="log")))
    assert written == []  # not complete yet
    await channel.send(encode(result(1)))
    assert [json.loads(data) for data in written] == [
        notification("notifications/message", data="log"),
        result(1),
    ]


async def test_a_failing_quick_answer_does_not_stop_the_relay() -> None:
    router = SessionRouter(16)
    channel = SessionChannel(router, MessageQueue[bytes](4))
    stream = router.open_post([request(1)])

    async def answer_now() -> None:
        raise RuntimeError("the client's answer failed")

    stream.answer_now = answer_now
    await channel.send(encode(result(1)))  # logged, not raised
    assert stream.finished


class FirstLane:
    """A stream's lane as `sidecar/lane.py`'s behaves towards the router, recording what it is told."""

    def __init__(self, stream: EventStream, *, takes: bool = True, fails: str | None = None) -> None:
        self.stream = stream
        self.takes = takes
        self.fails = fails  # the call that raises
        self.told: list[tuple[Any, ...]] = []
        self.ahead = False
        stream.lane = self

    def changed(self) -> None:
        self.told.append(("changed",))

    def answer(self) -> None:
        self.told.append(("answer",))

    def answer_ahead(self, message: bytes) -> Callable[[], None] | None:
        if not self.takes:
            return None
        self.told.append(("ahead", json.loads(message), self.stream.empty))
        self.ahead = True
        return self.answered

    def answer_first(self, message: bytes) -> bool:
        if self.ahead:
            self.told.append(("first, written already",))
            return True
        if self.fails == "answer_first":
            raise RuntimeError("the client's connection failed")
        self.told.append(("first", json.loads(message), self.stream.empty))
        if self.takes:
            self.stream.lane = None  # (its answer is written: it watches no more)
        return self.takes

    def answered(self) -> None:
        if self.fails == "answered":
            raise RuntimeError("the client's connection failed")
        self.told.append(("answered", messages(self.stream), self.stream.finished))


async def test_a_streams_one_answer_goes_to_its_lane_before_the_stream_keeps_it() -> None:
    """The lane writes the answer before the router's bookkeeping (`LaneWatch.answer_first`), and
    finishes its own once the stream holds the answer: nobody else is handed the stream."""
    router = SessionRouter(16)
    stream = router.open_post([request(1)])
    lane = FirstLane(stream)
    assert router.route(encode(result(1, n=1))) is None
    assert lane.told == [("first", result(1, n=1), True), ("answered", [result(1, n=1)], True)]
    assert router.in_flight == 0


@pytest.mark.parametrize("before", ["a notification", "a batch"])
async def test_an_answer_that_is_not_its_streams_only_message_is_not_offered_first(before: str) -> None:
    router = SessionRouter(16)
    if before == "a batch":
        stream = router.open_post([request(1), request(2)], batch=True)
        router.route(encode(result(2)))
    else:
        stream = router.open_post([request(1)])
        router.route(encode(notification("notifications/message", data="log")), related=1)
    lane = FirstLane(stream)
    assert router.route(encode(result(1))) is stream  # for its lane (or handler) to answer
    assert ("first", result(1), False) not in lane.told
    assert ("changed",) in lane.told


@pytest.mark.parametrize("fails", [None, "answer_first"])
async def test_a_lane_that_does_not_answer_first_is_told_as_before(fails: str | None) -> None:
    """A lane not ready to answer (its request is still being handed on), or whose write failed:
    the stream keeps the answer, is finished, and goes back to the caller as any completed one."""
    router = SessionRouter(16)
    stream = router.open_post([request(1)])
    lane = FirstLane(stream, takes=False, fails=fails)
    assert router.route(encode(result(1))) is stream
    assert messages(stream) == [result(1)]
    assert stream.finished
    assert ("changed",) in lane.told
    assert not any(told[0] == "answered" for told in lane.told)


async def test_a_lane_failing_after_its_answer_does_not_stop_the_routing() -> None:
    router = SessionRouter(16)
    stream = router.open_post([request(1)])
    FirstLane(stream, fails="answered")
    assert router.route(encode(result(1))) is None  # logged, not raised
    assert messages(stream) == [result(1)]
    assert stream.finished
    assert router.in_flight == 0


async def test_an_answer_written_ahead_is_routed_later_as_any_other() -> None:
    """`answer_ahead`: the lane writes the answer before the router has it; routing it later finds
    it written (no second write), keeps it on the stream and tells the lane it is answered."""
    router = SessionRouter(16)
    stream = router.open_post([request(1)])
    lane = FirstLane(stream)
    done = router.answer_ahead(encode(result(1, n=1)), result(1, n=1))
    assert done is not None
    assert lane.told == [("ahead", result(1, n=1), True)]
    assert not router.may_open(request(1))  # in flight until routed
    assert router.route(encode(result(1, n=1))) is None
    told = [told for told in lane.told[1:] if told != ("changed",)]  # (the real lane ignores it, over)
    assert told == [("first, written already",), ("answered", [result(1, n=1)], True)]
    assert router.in_flight == 0
    assert router.may_open(request(1))


@pytest.mark.parametrize("case", ["another message first", "no lane", "not waiting", "closed"])
async def test_an_answer_is_written_ahead_only_as_its_streams_one_message(case: str) -> None:
    router = SessionRouter(16)
    stream = router.open_post([request(1)])
    lane = FirstLane(stream, takes=case != "no lane")
    answer = result(2) if case == "not waiting" else result(1)
    if case == "another message first":
        router.route(encode(notification("notifications/message", data="log")), related=1)
    elif case == "closed":
        router.close("the session ended")
    assert router.answer_ahead(encode(answer), answer) is None
    assert not any(told[0] == "ahead" for told in lane.told)


def test_may_open_says_what_open_post_does() -> None:
    router = SessionRouter(16)
    for n in range(MAX_OPEN_POSTS - 1):
        router.open_post([request(n)])
    assert not router.may_open(request(0))  # in flight
    assert router.may_open(request("last"))
    router.open_post([request("last")])
    assert not router.may_open(request("one more"))
    with pytest.raises(TooManyPosts):
        router.open_post([request("one more")])


async def test_related_then_progress_token_then_single_request_then_get_stream() -> None:
    router = SessionRouter(16)
    a = router.open_post([request(1, _meta={"progressToken": "tok-a"})])
    b = router.open_post([request(2)])
    router.route(encode(notification("notifications/message", data="for b")), related=2)
    router.route(encode(notification("notifications/progress", progressToken="tok-a", progress=1)))
    router.route(encode(notification("notifications/tools/list_changed")))
    assert [m["method"] for m in messages(b)] == ["notifications/message"]
    assert [m["method"] for m in messages(a)] == ["notifications/progress"]
    assert [m["method"] for m in messages(router.get_stream)] == ["notifications/tools/list_changed"]
    router.route(encode(result(2)))
    router.route(encode(request("s-1", "sampling/createMessage")))  # only request 1 is left in flight
    assert messages(a)[-1]["method"] == "sampling/createMessage"


async def test_a_batch_post_finishes_when_every_request_is_answered() -> None:
    router = SessionRouter(16)
    stream = router.open_post([request(1), request(2)])
    router.route(encode([result(1)]))
    assert not stream.finished
    router.route(encode(result(2)))
    assert stream.finished
    with pytest.raises(DuplicateRequestId):
        router.open_post([request(3), request(3)])
    router.open_post([request(4)])
    with pytest.raises(DuplicateRequestId):
        router.open_post([request(4)])


async def test_a_server_request_in_an_upstream_batch_answers_no_client_request_of_its_id() -> None:
    """The server's requests and the client's have ids of their own spaces: a batch holding the
    answer to request 1 and the server's `ping` under id 2 took the ping for the answer to the
    client's request 2, so that request's real answer went to the GET stream and its POST stayed
    open for ever."""
    router = batch_router()
    first = router.open_post([request(1)])
    second = router.open_post([request(2)])
    assert router.route(encode([result(1), request(2, "ping")])) is first
    assert messages(first) == [[result(1), request(2, "ping")]]
    assert not second.finished
    assert router.in_flight == 1
    assert router.route(encode(result(2, n=2))) is second
    assert messages(second) == [result(2, n=2)]
    assert messages(router.get_stream) == []


async def test_an_upstream_batch_answers_its_requests_wherever_its_answers_stand() -> None:
    """A batch whose answer comes after a notification (or a request of the server's) was routed as
    a notification: the request it answered stayed in flight, its POST open for ever, and its id
    refused as a duplicate when the client used it again."""
    router = batch_router()
    stream = router.open_post([request(1)])
    log = notification("notifications/message", data="log")
    assert router.route(encode([log, result(1)])) is stream
    assert messages(stream) == [[log, result(1)]]
    assert router.in_flight == 0
    router.open_post([request(1)])  # not a duplicate: its answer came


async def test_an_upstream_batch_answering_requests_of_several_posts_reaches_each() -> None:
    """Answers to requests POSTed apart, in one array from the upstream, all went to the first
    one's stream; the other POST lost its answer and stayed open for ever. Each POST now gets its own."""
    router = SessionRouter(16)
    first = router.open_post([request(1)])
    second = router.open_post([request("b"), request(3)])
    log = notification("notifications/message", data="log")
    router.route(encode([result("b"), log, result(1), result(3)]))
    assert messages(first) == [[result(1)]]
    assert messages(second) == [[result("b"), log, result(3)]]  # the first answer's POST: the rest
    assert first.finished
    assert second.finished
    assert router.in_flight == 0


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", None])
async def test_an_upstream_array_reaches_a_client_without_batches_as_single_messages(
    version: str | None,
) -> None:
    """A stdio upstream's array answering a single request went on as an array, which a client of
    2025-06-18 or later (or one not yet told its revision) cannot read: its answer never arrived.
    Each message now goes as it would alone: the answer to its POST, alone there a JSON body."""
    router = SessionRouter(16)
    router.protocol_version = version
    first = router.open_post([request(1)])
    assert router.route(encode([result(1)])) is first
    assert messages(first) == [result(1)]
    second = router.open_post([request(2)])
    third = router.open_post([request(3)])
    log = notification("notifications/message", data="log")
    ping = request(3, "ping")  # the server's own id: not the client's 3
    router.route(encode([log, result(2), ping, result(3)]))
    assert messages(second) == [result(2)]
    assert messages(third) == [ping, result(3)]  # once 2 was answered, the only one in flight
    assert messages(router.get_stream) == [log]  # two requests in flight: no one's
    assert second.finished
    assert third.finished
    assert router.in_flight == 0


async def test_an_upstream_array_answering_a_client_batch_stays_one_at_any_revision() -> None:
    """A client that sent a batch reads one back: its answers go as the array they came in."""
    router = SessionRouter(16)
    router.protocol_version = "2025-11-25"
    stream = router.open_post([request(1)], batch=True)
    log = notification("notifications/message", data="log")
    assert router.route(encode([log, result(1)])) is stream
    assert messages(stream) == [[log, result(1)]]


async def test_client_cancel_answers_at_once_and_drops_the_late_response() -> None:
    router = SessionRouter(16)
    stream = router.open_post([request(5)])
    router.client_cancelled(5, "user pressed stop")
    [answer] = messages(stream)
    assert answer["error"]["code"] == -32800
    assert "user pressed stop" in answer["error"]["message"]
    router.route(encode(result(5)))
    assert messages(router.get_stream) == []
    assert len(messages(stream)) == 1


async def test_a_late_answer_to_a_cancelled_request_takes_no_server_request_with_it() -> None:
    router = batch_router()
    router.open_post([request(5)])
    router.client_cancelled(5)
    ping = request(9, "ping")
    router.route(encode([result(5), ping]))
    assert messages(router.get_stream) == [[ping]]  # the late answer dropped, the server's ping not


async def test_closing_answers_waiting_requests_and_ends_every_stream() -> None:
    router = SessionRouter(16)
    stream = router.open_post([request("x")])
    router.close("upstream exited")
    [answer] = messages(stream)
    assert answer == {"jsonrpc": "2.0", "id": "x", "error": {"code": -32603, "message": "upstream exited"}}
    assert router.get_stream.finished
    router.route(encode(notification("notifications/late")))
    assert messages(router.get_stream) == []


async def test_the_initialize_response_records_the_negotiated_version() -> None:
    router = SessionRouter(16)
    router.open_post([request(0, "initialize")])
    router.route(encode(result(0, protocolVersion="2025-06-18")))
    assert router.protocol_version == "2025-06-18"


async def test_event_stream_numbers_keeps_the_last_events_and_formats_sse() -> None:
    stream = EventStream("s1", 2)
    for n in range(3):
        stream.append(encode({"n": n}))
    assert [seq for seq, _ in stream.after(0)] == [2, 3]
    assert stream.first_kept() == 2
    assert parse_event_id(stream.event_id(3)) == ("s1", 3)
    assert parse_event_id("garbage") is None
    assert sse_event(b'{"a":\n1}', "s1.3") == b'id: s1.3\nevent: message\ndata: {"a":\ndata: 1}\n\n'
    assert sse_event(b"", "s1.0") == b"id: s1.0\nevent: message\ndata: \n\n"


async def test_mux_gives_each_post_its_own_id_and_token_and_restores_them() -> None:
    mux = MuxChannel()
    a, raw_a = mux.open(request(1, _meta={"progressToken": 1}))
    b, raw_b = mux.open(request(1, _meta={"progressToken": "p"}))
    sent_a, sent_b = json.loads(raw_a), json.loads(raw_b)
    assert sent_a["id"] != sent_b["id"]
    assert sent_a["params"]["_meta"]["progressToken"] == sent_a["id"]
    assert sent_b["params"]["_meta"]["progressToken"] == sent_b["id"]

    await mux.send(encode(notification("notifications/progress", progressToken=sent_b["id"], progress=1)))
    await mux.send(encode(result(sent_a["id"], ok=True)))
    assert messages(b.stream) == [notification("notifications/progress", progressToken="p", progress=1)]
    assert messages(a.stream) == [result(1, ok=True)]
    assert a.stream.finished
    assert not b.stream.finished


async def test_mux_drops_what_it_cannot_attribute_and_restores_subscription_ids() -> None:
    mux = MuxChannel()
    listen, raw = mux.open(request("L1", "subscriptions/listen"))
    other, _ = mux.open(request(9))
    upstream_id = json.loads(raw)["id"]
    meta = {"io.modelcontextprotocol/subscriptionId": upstream_id}
    await mux.send(encode(notification("notifications/tools/list_changed", _meta=meta)))
    await mux.send(encode(notification("notifications/message", data="whose?")))
    assert messages(listen.stream) == [
        notification(
            "notifications/tools/list_changed", _meta={"io.modelcontextprotocol/subscriptionId": "L1"}
        )
    ]
    assert messages(other.stream) == []


async def test_mux_turns_an_abandoned_post_into_a_cancel_for_the_relay() -> None:
    mux = MuxChannel()
    exchange, raw = mux.open(request("c", "tools/call"))
    await mux.deliver(raw)
    await mux.abandon(exchange, "gone")
    assert json.loads(await mux.receive())["id"] == exchange.mux_id
    cancel = json.loads(await mux.receive())
    assert cancel == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": exchange.mux_id, "reason": "gone"},
    }
    await mux.send(encode(result(exchange.mux_id)))  # a late answer goes nowhere
    assert messages(exchange.stream) == []
    mux.close("bye")
    assert mux.in_flight == 0


async def test_mux_ends_listen_streams_on_shutdown_and_cancels_them_upstream() -> None:
    """A `subscriptions/listen` never ends by itself: the drain ends it, as a GET stream, and the
    subscription is cancelled upstream; other requests in flight are left to finish."""
    mux = MuxChannel()
    listen, _ = mux.open(request("L", "subscriptions/listen"))
    call, _ = mux.open(request(7, "tools/call"))
    mux.end_listens("shutting down")
    assert listen.stream.finished
    assert not call.stream.finished
    assert mux.in_flight == 1
    cancel = json.loads(await mux.receive())
    assert cancel["params"] == {"requestId": listen.mux_id, "reason": "shutting down"}


async def test_mux_does_not_give_a_gone_requests_messages_to_the_one_left_in_flight() -> None:
    """ "The one request in flight" took messages that named another, finished request: a notification
    of an abandoned subscription, a late progress notification. With clients sharing a hub, another
    client's."""
    mux = MuxChannel()
    listen, _ = mux.open(request("A-listen", "subscriptions/listen"))
    call, _ = mux.open(request(7, "tools/call"))
    await mux.abandon(listen, "client A closed its POST")
    meta = {"io.modelcontextprotocol/subscriptionId": listen.mux_id}
    await mux.send(encode(notification("notifications/resources/updated", uri="file:///a", _meta=meta)))
    await mux.send(encode(notification("notifications/progress", progressToken=listen.mux_id, progress=1)))
    await mux.send(encode(notification("notifications/message", data="x")), related=listen.mux_id)
    assert messages(call.stream) == []
    await mux.send(encode(notification("notifications/message", data="whose?")))  # names nobody
    assert messages(call.stream) == [notification("notifications/message", data="whose?")]


async def test_an_event_stream_keeps_no_waiter_of_a_wait_that_timed_out() -> None:
    """A cancelled wait cancels its future, so `done()` was always true and the cleanup never ran:
    an idle GET stream kept one dead future per keep-alive period."""
    stream = EventStream("g", 1024)
    for _ in range(50):
        with anyio.move_on_after(0.001):
            await stream.changed()
    assert stream._waiting == []


async def test_a_sender_waits_for_a_live_reader_far_behind_and_not_for_one_that_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("mcp_backfill.transports.event_stream.STALL_SECONDS", 0.2)
    stream = EventStream("p1", 8)
    generation = stream.attach()
    for n in range(5):
        stream.append(encode(notification("n", n=n)))
    assert stream.behind  # 5 of 8 unwritten, with a reader attached
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.catch_up)
        await anyio.sleep(0.05)
        stream.handed_out(3)  # the reader writes: the sender may go on
    assert not stream.behind
    for n in range(5, 12):
        stream.append(encode(notification("n", n=n)))
    with anyio.fail_after(5):
        await stream.catch_up()  # the reader writes nothing more: given up on after STALL_SECONDS
    assert not stream.behind
    stream.detach(generation)


async def test_a_burst_before_the_handler_writes_is_held_for_it_not_dropped() -> None:
    """Between a POST's arrival and its SSE response's first write (the quick-answer window, the
    switch to SSE) no reader was attached, so a burst routed then was not held up: on a loaded
    machine the oldest messages were dropped (the sidecar test of a 5,000-message burst lost 255)."""
    stream = EventStream("p1", 8)
    with stream.expecting_reader():
        for n in range(5):
            stream.append(encode(notification("n", n=n)))
        assert stream.behind  # 5 of 8 unwritten, a handler about to write them
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.catch_up)
            await anyio.sleep(0.05)
            generation = stream.attach()  # the handler starts its SSE response and writes
            stream.handed_out(5)
        assert not stream.behind
    for n in range(5, 10):
        stream.append(encode(notification("n", n=n)))
    stream.detach(generation)
    assert not stream.behind  # no handler and no response: nobody to wait for


class SlowCall:
    """An HTTP response whose client reads slowly: each body write takes a little while."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.finished = False

    async def body(self, data: bytes, more: bool = False) -> None:
        self.chunks.append(data)
        await anyio.sleep(0.0005)


async def test_events_that_come_while_the_writer_writes_go_out_without_waiting() -> None:
    """A response's writer wrote the events it saw, then waited for the next one to come: those that
    had come while it wrote (its client's connection backed up) waited for yet another, or for the
    15 s keep-alive ping; a POST's answer among them reached its client 15 s late."""
    stream = EventStream("s1", 16)
    stream.append(b"1")

    class BackedUpCall(SlowCall):
        async def body(self, data: bytes, more: bool = False) -> None:
            await super().body(data, more)
            if len(self.chunks) == 1:  # while the first event is written, the answer comes
                stream.append(b"2")
                stream.finish()

    call = BackedUpCall()
    with anyio.fail_after(10):
        await pump_sse(cast(HttpCall, call), stream, 0, with_ids=True, keepalive=3600)
    assert [message for _, message in sse_messages(b"".join(call.chunks).decode())] == [1, 2]


async def test_mux_holds_a_burst_for_a_live_sse_reader_instead_of_dropping_progress() -> None:
    """More notifications than a POST's stream keeps, ahead of a slow but live SSE writer: the mux
    dropped the oldest (progress lost); now, as a handshake session does, it waits for the writer."""
    mux = MuxChannel()
    exchange, raw = mux.open(request("c1", "tools/call", _meta={"progressToken": "client-token"}))
    mux_id = json.loads(raw)["id"]
    call = SlowCall()
    count = EXCHANGE_BUFFER + 500
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(pump_sse, cast(HttpCall, call), exchange.stream, 0, with_ids=False, keepalive=5)
            )
            await anyio.sleep(0.01)  # the SSE response is being written
            for n in range(count):
                await mux.send(
                    encode(notification("notifications/progress", progressToken=mux_id, progress=n))
                )
            await mux.send(encode(result(mux_id)))
    written = [message for _, message in sse_messages(b"".join(call.chunks).decode())]
    assert written[-1] == result("c1")
    progress = [m["params"] for m in written if m.get("method") == "notifications/progress"]
    assert all(params["progressToken"] == "client-token" for params in progress)
    assert [params["progress"] for params in progress] == list(range(count))


async def test_mux_holds_its_relay_up_for_a_slow_reader_only_past_the_hubs_bounds() -> None:
    """The requests of one client identity (every client without a token) share a hub's relay: a
    burst for a reader that had stopped a moment held it up, and every other client's answer with
    it. Now only a reader that many events behind (or the hub that full) holds it up."""
    mux = MuxChannel()
    exchange, raw = mux.open(request("c1", "tools/call", _meta={"progressToken": "client-token"}))
    mux_id = json.loads(raw)["id"]
    gate = anyio.Event()

    class StoppedCall(SlowCall):
        async def body(self, data: bytes, more: bool = False) -> None:
            await gate.wait()
            self.chunks.append(data)

    def progress(n: int) -> bytes:
        return encode(notification("notifications/progress", progressToken=mux_id, progress=n))

    call = StoppedCall()
    sent = anyio.Event()

    async def one_more() -> None:
        await mux.send(progress(HOLD_UP_EVENTS))
        sent.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(pump_sse, cast(HttpCall, call), exchange.stream, 0, with_ids=False))
            await anyio.sleep(0.01)  # the SSE response is being written, its client not reading
            for n in range(HOLD_UP_EVENTS):
                await mux.send(progress(n))  # kept for the reader, none held up
            tg.start_soon(one_more)
            await anyio.sleep(0.05)
            assert not sent.is_set()  # past the bound: held up until the reader reads
            gate.set()
            await sent.wait()
            await mux.send(encode(result(mux_id)))
    written = [message for _, message in sse_messages(b"".join(call.chunks).decode())]
    progressed = [m["params"]["progress"] for m in written if m.get("method") == "notifications/progress"]
    assert progressed == list(range(HOLD_UP_EVENTS + 1))
    assert written[-1] == result("c1")


async def test_mux_own_request_gets_its_answer_and_no_client_gets_it() -> None:
    """A request of the proxy's own (the front's tools listing) is answered to it alone, and never
    counts as "the one request in flight" that unattributed server messages go to."""
    mux = MuxChannel()
    call, _ = mux.open(request(7, "tools/call", name="regional"))
    listing: list[Any] = []

    async def list_tools() -> None:
        listing.append(await mux.own_request("tools/list", {}, 5))

    async with anyio.create_task_group() as tg:
        tg.start_soon(list_tools)
        sent = json.loads(await mux.receive())
        assert sent["method"] == "tools/list"
        assert isinstance(sent["id"], int)
        await mux.send(encode(notification("notifications/message", data="whose?")))
        tools = [{"name": "regional", "inputSchema": {"type": "object"}}]
        await mux.send(encode(result(sent["id"], tools=tools)))
    assert listing == [{"tools": tools}]
    assert messages(call.stream) == [notification("notifications/message", data="whose?")]
    assert mux.tools.schema_of("regional") == {"type": "object"}
    assert mux.tools.complete


async def test_mux_own_request_that_gets_no_answer_is_cancelled() -> None:
    mux = MuxChannel()
    with anyio.fail_after(5):
        assert await mux.own_request("tools/list", {}, 0.05) is None
    sent, cancel = json.loads(await mux.receive()), json.loads(await mux.receive())
    assert cancel["method"] == "notifications/cancelled"
    assert cancel["params"]["requestId"] == sent["id"]
    assert mux.in_flight == 0
    mux.close("bye")
    assert await mux.own_request("tools/list", {}, 5) is None  # upstream gone: an error, at once


async def test_mux_learns_tool_schemas_from_client_listings_and_forgets_them_on_list_changed() -> None:
    mux = MuxChannel()
    page, raw = mux.open(request(1, "tools/list"))
    tools = [{"name": "a", "inputSchema": {"type": "object", "properties": {}}}]
    await mux.send(encode(result(json.loads(raw)["id"], tools=tools, nextCursor="2")))
    assert messages(page.stream) == [result(1, tools=tools, nextCursor="2")]
    assert mux.tools.knows("a")
    assert not mux.tools.complete  # one page of several
    await mux.send(encode(notification("notifications/tools/list_changed")))
    assert not mux.tools.knows("a")


async def test_the_fronts_own_tools_listing_holds_a_call_for_its_time_in_all_not_per_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each page of the listing had the whole time: an upstream answering every page just in time
    (or none) held the `tools/call` waiting for it 20 times over."""
    from mcp_backfill.sidecar import stateless

    monkeypatch.setattr(stateless, "OWN_LIST_SECONDS", 0.2)
    mux = MuxChannel()
    sent: list[Any] = []

    async def upstream() -> None:  # answers each page with a next one, just before its time is up
        while True:
            page = json.loads(await mux.receive())
            if page.get("method") != "tools/list":
                continue
            sent.append(page)
            await anyio.sleep(0.15)
            await mux.send(encode(result(page["id"], tools=[], nextCursor=f"p{len(sent)}")))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream)
            await stateless._list_tools(mux, "regional", {"_meta": {}})
            tg.cancel_scope.cancel()
    assert len(sent) <= 2  # 0.15 s each: the second page ends past the 0.2 s the listing may take


async def test_mux_takes_no_boolean_or_float_for_one_of_its_ids() -> None:
    """The mux numbers its requests 1, 2, ...; `true` and `1.0` equal 1 in Python, so an upstream
    answering under `"id": true` (or a notification naming `progressToken: true`) reached the client
    of mux request 1 as its answer."""
    mux = MuxChannel()
    first, raw = mux.open(request("mine", "tools/call"))
    assert json.loads(raw)["id"] == 1
    await mux.send(encode({"jsonrpc": "2.0", "id": True, "result": {"forged": True}}))
    await mux.send(encode({"jsonrpc": "2.0", "id": 1.0, "result": {"forged": True}}))
    _ = mux.open(request("other", "tools/call"))  # two in flight: no "the one request" guess
    await mux.send(encode(notification("notifications/progress", progressToken=True, progress=1)))
    await mux.send(encode(notification("notifications/message", data="x")), related=True)
    assert messages(first.stream) == []
    assert not first.stream.finished


async def test_a_stream_its_client_left_outlasts_finished_streams_still_being_written() -> None:
    """A session keeps its last 8 finished POST streams, those its clients read whole going first.
    A stream whose response is still being written is not read whole yet; when every other one
    was such a stream, the oldest went, though its client had left before reading it and was to
    resume it, rather than one whose whole answer was being written to its client."""
    router = SessionRouter(16)
    left = router.open_post([request(1)])
    router.route(encode(result(1)))  # answered after its client left: nothing of it handed out
    with contextlib.ExitStack() as responses:
        for n in range(2, 2 + FINISHED_STREAMS_KEPT):
            stream = router.open_post([request(n)])
            responses.enter_context(stream.expecting_reader())  # its response still being written
            router.route(encode(result(n)))
            stream.handed_out(stream.last_seq)
        assert router.stream(left.key) is left


async def test_a_session_holds_a_bounded_number_of_post_streams_waiting_for_answers() -> None:
    """Each POST whose requests are in flight keeps a stream (with its replay buffer) after its client
    has gone: a client could leave a session any number of them."""
    router = SessionRouter(16)
    streams = [router.open_post([request(n)]) for n in range(MAX_OPEN_POSTS)]
    with pytest.raises(TooManyPosts):
        router.open_post([request("one more")])
    assert router.in_flight == MAX_OPEN_POSTS  # the refused one is not kept
    router.route(encode(result(0, n=0)))
    assert streams[0].finished
    assert not router.open_post([request("one more")]).finished  # an answer made room


async def test_a_sessions_replay_memory_is_bounded_over_all_its_streams_oldest_first() -> None:
    """Replay memory was bounded per stream only (`REPLAY_BYTES`, 1,024 events): a session's GET
    stream and its 256 open POSTs could each hold the maximum, 2 GiB for one session. Now the
    session's streams together keep at most its byte limit, the oldest events of any stream going
    first, and the newest event is still always kept."""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    posts = [router.open_post([request(n)]) for n in range(8)]
    chunk = "x" * 900

    def note(n: int) -> bytes:
        return encode(notification("notifications/message", data=f"{n:04d}{chunk}"))

    for n in range(40):  # round-robin over the POSTs and the GET stream, ~1 KB each
        related = n % 9 if n % 9 < 8 else None
        router.route(note(n), related=related)
        assert router.buffered_bytes <= limit
    assert router.buffered_bytes == sum(s.buffered_bytes for s in [*posts, router.get_stream])
    kept = sorted(
        int(json.loads(data)["params"]["data"][:4])
        for stream in [*posts, router.get_stream]
        for _, data in stream.after(0)
    )
    assert kept == list(range(40 - len(kept), 40))  # the newest, whichever stream they are on
    assert len(kept) == limit // len(note(0))
    huge = encode(notification("notifications/message", data="y" * 3 * limit))
    router.route(huge, related=0)
    assert messages(posts[0])[-1]["params"]["data"] == "y" * 3 * limit  # kept, however large
    assert router.buffered_bytes == len(huge)  # and everything older went
    router.route(encode(result(0)))
    router.forget(posts[0])  # a finished stream the session lets go of gives its bytes back
    assert router.buffered_bytes == sum(s.buffered_bytes for s in [*posts[1:], router.get_stream])


async def test_a_writer_whose_stream_lost_its_answer_to_the_sessions_memory_ends() -> None:
    """A finished POST stream whose last events (its answer) its session's replay memory let go was
    never done: a response writing it (a resumption) waited for them for ever, with pings, and held
    its session busy. Nothing more will come: it ends. (The memory lets go of them only while no
    live reader has them to write.)"""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    post = router.open_post([request(1)])
    router.route(encode(result(1, ok=True)))
    huge = encode(notification("notifications/message", data="y" * 2 * limit))
    router.route(huge)  # the GET stream's, and the answer above, which nobody was reading, goes for it
    assert post.finished
    assert not post.after(0)
    with anyio.fail_after(10):
        await pump_sse(cast(HttpCall, SlowCall()), post, 0, with_ids=True, keepalive=5)
    assert post.complete_after(0)


async def test_a_live_writer_keeps_what_it_has_yet_to_write_and_the_sender_waits_for_it() -> None:
    """The session's replay memory let go of the oldest events whichever stream they were on, those a
    live (slow) reader had yet to write too, its answer among them. They are kept now; the sender
    waits (`relieve`) until the reader has written them, and the memory is back within its limit."""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    post = router.open_post([request(1)])
    gate = anyio.Event()

    class HeldCall(SlowCall):
        async def body(self, data: bytes, more: bool = False) -> None:
            await gate.wait()
            await super().body(data, more)

    call = HeldCall()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(pump_sse, cast(HttpCall, call), post, 0, with_ids=True, keepalive=5))
            await anyio.sleep(0.01)  # the writer waits for the stream's first event
            router.route(encode(result(1, ok=True)))
            router.route(encode(notification("notifications/message", data="y" * 2 * limit)))
            assert [seq for seq, _ in post.after(0)] == [1]  # kept for its live reader
            relieved = anyio.Event()

            async def relieve() -> None:
                await router.relieve()
                relieved.set()

            tg.start_soon(relieve)
            await anyio.sleep(0.05)
            assert not relieved.is_set()  # the sender waits for the reader
            gate.set()
            await relieved.wait()
    assert b'"ok": true' in b"".join(call.chunks)
    assert router.buffered_bytes <= 2 * limit + 200  # the answer went once written; the newest stays


async def test_mux_routes_each_message_of_an_upstream_batch() -> None:
    """A batch from the upstream (a JSON array) was dropped whole by the 2026-07-28 mux: the
    requests it answered waited for ever (their POSTs open, their client's hub never idle, never
    stopped to make room nor for idleness). Each of its messages now goes where it would alone."""
    mux = MuxChannel()
    a, raw_a = mux.open(request("a", _meta={"progressToken": "pa"}))
    b, raw_b = mux.open(request("b"))
    id_a, id_b = json.loads(raw_a)["id"], json.loads(raw_b)["id"]
    progress = notification("notifications/progress", progressToken=id_a, progress=1)
    await mux.send(encode([progress, result(id_a, ok=1), result(id_b, ok=2)]))
    assert messages(a.stream) == [
        notification("notifications/progress", progressToken="pa", progress=1),
        result("a", ok=1),
    ]
    assert messages(b.stream) == [result("b", ok=2)]
    assert a.stream.finished
    assert b.stream.finished
    assert mux.in_flight == 0


async def test_a_2026_stream_keeps_nothing_it_has_written() -> None:
    """A 2026-07-28 POST's stream is never resumed (its events have no ids), yet it kept its last
    1,024 events, up to 8 MiB, while it lasted: every open `subscriptions/listen` held that much of
    notifications its client had long read, as many as there are connections. Now what has been
    written is let go."""
    mux = MuxChannel()
    listen, raw = mux.open(request("L1", "subscriptions/listen"))
    meta = {"io.modelcontextprotocol/subscriptionId": json.loads(raw)["id"]}
    call = SlowCall()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(pump_sse, cast(HttpCall, call), listen.stream, 0, with_ids=False, keepalive=5)
            )
            for n in range(50):
                note = notification("notifications/resources/updated", uri=f"x://{n}", _meta=meta)
                await mux.send(encode(note))
            while listen.stream.delivered < 50:
                await anyio.sleep(0.01)
            assert listen.stream.buffered_bytes == 0
            assert listen.stream.after(0) == []
            tg.cancel_scope.cancel()
    written = [message for _, message in sse_messages(b"".join(call.chunks).decode())]
    assert [m["params"]["uri"] for m in written] == [f"x://{n}" for n in range(50)]


async def test_what_a_hubs_streams_hold_is_counted_as_it_changes() -> None:
    """The bytes a client's 2026-07-28 streams hold for their readers are kept as a running total
    (summing every stream at each request cost a look at all of them: a thousand users sharing one
    identity): written events give theirs back, a released stream gives back what it still holds,
    and what reaches it after is not counted."""
    mux = MuxChannel()
    first, raw_first = mux.open(request("A", "tools/call"))
    second, raw_second = mux.open(request("B", "tools/call"))
    answer = {"jsonrpc": "2.0", "id": json.loads(raw_first)["id"], "result": {"x": "a" * 1000}}
    await mux.send(encode(answer))
    progress = {"progressToken": json.loads(raw_second)["id"], "progress": 1, "message": "b" * 500}
    await mux.send(encode(notification("notifications/progress", **progress)))
    held_first, held_second = first.stream.buffered_bytes, second.stream.buffered_bytes
    assert held_first > 1000
    assert held_second > 500
    assert mux.buffered_bytes == held_first + held_second
    first.stream.handed_out(1)  # its answer written: nothing left to hold
    assert mux.buffered_bytes == held_second
    mux.release(second)  # its reader gone before reading
    assert mux.buffered_bytes == 0
    await mux.send(encode(notification("notifications/progress", **progress)))
    assert second.stream.buffered_bytes > 0  # kept for nobody: counted no more
    assert mux.buffered_bytes == 0
    mux.release(first)
    assert mux.buffered_bytes == 0


async def test_a_resumed_writer_does_not_hold_up_the_session_for_events_its_client_has() -> None:
    """Events a dropped response wrote but never saw through count as unread; a resumption from
    after them (the client has them) left them so while it waited for more, and a session over its
    replay memory held its upstream up for them until the reader was taken to have stopped (10 s)."""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    post = router.open_post([request(1)])
    for n in range(3):
        router.route(encode(notification("notifications/message", data=f"{n}" * 1000)), related=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(pump_sse, cast(HttpCall, SlowCall()), post, 3, with_ids=True, keepalive=5))
            await anyio.sleep(0.01)  # the resumption from event 3 waits for more
            router.open_post([request(2)])  # two in flight: what names neither goes to the GET stream
            router.route(encode(notification("notifications/message", data="y" * 2 * limit)))
            await router.relieve()  # nothing a live reader has yet to write: no wait
            tg.cancel_scope.cancel()


async def test_a_writer_resumed_from_an_earlier_event_keeps_what_it_has_yet_to_write() -> None:
    """A client resuming from an earlier event than the last one written to its stream (the rest
    went into a connection it lost) has yet to get the rest; the stream still counted it as
    delivered, and the session's replay memory let it go while the resumption was writing it: if
    that one broke off too, the next resumption had lost those events."""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    post = router.open_post([request(1)])
    for n in range(3):
        router.route(encode(notification("notifications/message", data=f"{n}" * 1000)), related=1)
    post.handed_out(3)  # written to a response whose connection was then lost
    gate = anyio.Event()

    class HeldCall(SlowCall):
        async def body(self, data: bytes, more: bool = False) -> None:
            await gate.wait()
            await super().body(data, more)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            resumed = partial(pump_sse, cast(HttpCall, HeldCall()), post, 1, with_ids=True, keepalive=5)
            tg.start_soon(resumed)
            await anyio.sleep(0.01)  # the resumption from event 1 is writing event 2
            router.open_post([request(2)])  # two in flight: what names neither goes to the GET stream
            router.route(encode(notification("notifications/message", data="y" * 2 * limit)))
            assert [seq for seq, _ in post.after(1)] == [2, 3]  # kept for its live reader
            tg.cancel_scope.cancel()


async def test_the_newest_event_left_is_kept_when_the_stream_of_the_newest_is_let_go() -> None:
    """The session's replay memory never lets go of its newest event. It remembered which stream had
    it, and went on doing so once that stream was let go (a POST answered as JSON): no stream's
    newest event was kept then, and a GET stream whose reader had just dropped lost an event it had
    yet to write (not one over the limit) to the next sender held up for the memory, though it was
    the newest the session had left. (The stream let go was held in memory meanwhile, too.)"""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    post = router.open_post([request(1)])
    router.open_post([request(2)])  # two in flight: what names neither goes to the GET stream
    gate = anyio.Event()

    class HeldCall(SlowCall):
        async def body(self, data: bytes, more: bool = False) -> None:
            await gate.wait()
            await super().body(data, more)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(pump_sse, cast(HttpCall, HeldCall()), post, 0, with_ids=True, keepalive=5))
            get_reader = anyio.CancelScope()

            async def read_get_stream() -> None:
                with get_reader:
                    get_call = cast(HttpCall, HeldCall())
                    await pump_sse(get_call, router.get_stream, 0, with_ids=True, keepalive=5)

            tg.start_soon(read_get_stream)
            await anyio.sleep(0.01)  # both readers wait for their streams' first events
            router.route(encode(notification("notifications/message", data="p" * 6000)), related=1)
            router.route(encode(notification("notifications/message", data="g" * 6000)))
            answered = router.stream("s2")
            assert answered is not None
            router.route(encode(result(2, ok=True)))  # the newest event, on another stream
            router.forget(answered)  # answered as JSON: let go of
            del answered
            assert router.buffered_bytes > limit  # what the two live readers have yet to write
            get_reader.cancel()  # the GET stream's client drops its connection, to resume it
            await anyio.sleep(0.01)
            assert not router.get_stream.live
            tg.start_soon(router.relieve)  # the next sender: held up for the POST stream's reader
            await anyio.sleep(0.01)
            gate.set()  # which writes its event
            while router.buffered_bytes > limit:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert [seq for seq, _ in router.get_stream.after(0)] == [1]  # kept for the GET stream's resumption


async def test_a_stream_the_session_let_go_is_not_held_by_its_replay_memory() -> None:
    """The session's replay memory remembered the stream of its newest event after the session let
    go of it: an answer given as JSON (up to the largest message allowed) stayed in memory, counted
    nowhere, until another event came over the limit."""
    limit = 10_000
    router = SessionRouter(1024, replay_bytes=limit)
    answered = router.open_post([request(1)])
    router.route(encode(result(1, pad="x" * 2 * limit)))  # over the limit: the memory is trimmed
    router.forget(answered)  # answered as JSON
    gone = weakref.ref(answered)
    del answered
    gc.collect()
    assert gone() is None
    assert router.buffered_bytes == 0
