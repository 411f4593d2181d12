"""Progress notifications built from a provider's stream reports: throttled, always increasing."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import anyio
import pytest

from mcp_backfill import assembly, protocol
from mcp_backfill.errors import ProviderError, SamplingError
from mcp_backfill.options import Allowance
from mcp_backfill.relay.progress import ProgressNotifier, RoundProgress, progress_notifier
from mcp_backfill.sampling.provider import ProgressCallback, StreamProgress, UsageMeter
from mcp_backfill.sampling.sampler import Sampler
from mcp_backfill.sampling.spend import Spend
from tests.defaults import CONFIG, SPEND
from tests.unit.test_sampler_ledger import RacedStore

pytestmark = pytest.mark.anyio


class Wire:
    def __init__(self) -> None:
        self.now = 0.0
        self.sent: list[dict[str, Any]] = []

    async def send(self, raw: bytes) -> None:
        self.sent.append(json.loads(raw))

    def clock(self) -> float:
        return self.now

    def params(self) -> list[dict[str, Any]]:
        assert all(m["method"] == "notifications/progress" and "id" not in m for m in self.sent)
        return [m["params"] for m in self.sent]


def notifier(wire: Wire, token: str | int = "tok-1") -> ProgressNotifier:
    return ProgressNotifier(token, wire.send, interval=0.25, clock=wire.clock)


def test_token_is_read_from_meta() -> None:
    assert protocol.progress_token({"_meta": {"progressToken": "abc"}}) == "abc"
    assert protocol.progress_token({"_meta": {"progressToken": 0}}) == 0
    assert protocol.progress_token({"_meta": {"progressToken": True}}) is None
    assert protocol.progress_token({"_meta": {"progressToken": 1.5}}) is None
    assert protocol.progress_token({"_meta": "x"}) is None
    assert protocol.progress_token({"progressToken": "t"}) is None  # a request names it in _meta only
    assert protocol.progress_token(None) is None
    assert protocol.progress_token({}) is None


async def test_no_token_no_notifier() -> None:
    wire = Wire()
    assert progress_notifier({"messages": []}, wire.send) is None
    made = progress_notifier({"_meta": {"progressToken": 7}}, wire.send)
    assert made is not None
    assert made.token == 7


async def test_throttled_while_streaming_and_a_final_one_at_completion() -> None:
    wire = Wire()
    report = notifier(wire)
    for step in range(1, 11):  # ten deltas 0.1 s apart
        await report(StreamProgress(characters=step * 5))
        wire.now += 0.1
    await report(StreamProgress(characters=50, done=True, output_tokens=12))
    params = wire.params()
    assert [p["progress"] for p in params] == [5, 20, 35, 50, 51]  # t = 0, 0.3, 0.6, 0.9, final
    assert all(p["progressToken"] == "tok-1" for p in params)
    assert "total" not in params[0]
    assert params[-1]["total"] == params[-1]["progress"] == 51
    assert params[-1]["message"] == "Claude finished (12 output tokens)"
    assert params[0]["message"] == "Claude is writing (5 characters)"


async def test_values_keep_growing_across_a_retried_attempt() -> None:
    wire = Wire()
    report = notifier(wire, token=3)
    await report(StreamProgress(characters=40, attempt=1))
    wire.now += 1
    await report(StreamProgress(characters=10, attempt=2))  # the retry starts from zero again
    wire.now += 1
    await report(StreamProgress(characters=30, attempt=2, done=True))
    values = [p["progress"] for p in wire.params()]
    assert values == [40, 50, 71]
    assert values == sorted(set(values))
    assert wire.params()[1]["message"] == "Claude is writing (50 characters, attempt 2)"


async def test_nothing_after_the_final_notification() -> None:
    wire = Wire()
    report = notifier(wire)
    await report(StreamProgress(characters=5, done=True))
    wire.now += 1
    await report(StreamProgress(characters=9))
    assert len(wire.sent) == 1


async def test_a_new_call_adds_up_even_when_it_starts_ahead() -> None:
    """A continued `pause_turn` is another call: its characters add to the first call's, even when
    its first report is already past where the first call ended."""
    wire = Wire()
    report = notifier(wire)
    await report(StreamProgress(characters=10))
    wire.now += 1
    await report(StreamProgress(characters=30, call=2))
    wire.now += 1
    await report(StreamProgress(characters=35, call=2, done=True))
    assert [p["progress"] for p in wire.params()] == [10, 40, 46]


class SlowWire(Wire):
    """A wire whose every send waits until the test lets it go (an upstream slow to acknowledge)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.started = 0

    async def send(self, raw: bytes) -> None:
        self.started += 1
        await self.gate.wait()
        self.gate = anyio.Event()
        await super().send(raw)


async def test_beside_the_stream_a_slow_send_holds_up_nothing_and_the_final_one_comes_last() -> None:
    wire = SlowWire()
    report = notifier(wire)
    async with report.beside():
        await report(StreamProgress(characters=5))  # goes out, and waits to be acknowledged
        await wait_until(lambda: wire.started == 1)
        for step in range(2, 6):  # none of these waits for it; each replaces the one waiting
            wire.now += 1
            with anyio.fail_after(1):
                await report(StreamProgress(characters=step * 5))
        wire.gate.set()  # the first is taken; the latest of those that waited follows
        await wait_until(lambda: wire.started == 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(report, StreamProgress(characters=25, done=True))  # waits for that one
            await anyio.sleep(0.05)
            assert wire.started == 2
            wire.gate.set()
            await wait_until(lambda: wire.started == 3)
            wire.gate.set()
    assert [p["progress"] for p in wire.params()] == [5, 25, 26]
    assert wire.params()[-1]["total"] == 26


async def test_beside_the_stream_what_waits_at_the_end_is_not_sent() -> None:
    wire = SlowWire()
    report = notifier(wire)
    async with report.beside():
        await report(StreamProgress(characters=5))
        await wait_until(lambda: wire.started == 1)
        wire.now += 1
        await report(StreamProgress(characters=10))  # the answer fails before this goes out
    assert wire.sent == []  # the one under way was cancelled with the answer
    assert wire.started == 1


async def test_beside_the_stream_a_send_that_fails_is_not_the_answers_failure() -> None:
    class Failing(Wire):
        async def send(self, raw: bytes) -> None:
            if json.loads(raw)["params"].get("total") is None:
                raise RuntimeError("lost")
            await super().send(raw)

    wire = Failing()
    report = notifier(wire)
    async with report.beside():
        await report(StreamProgress(characters=5))
        await anyio.sleep(0.01)
        wire.now += 1
        await report(StreamProgress(characters=9, done=True))
    assert [p["progress"] for p in wire.params()] == [10]


async def wait_until(condition: Any) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.sleep(0.001)


class Pausing:
    """Streams as the anthropic provider does (progress per delta, `done` once its message is
    complete); its first message pauses the turn, the continuation ends it."""

    name = "pausing"

    def __init__(self) -> None:
        self.replies = [self.message("a" * 40, "pause_turn"), self.message("b" * 400, "end_turn")]

    @staticmethod
    def message(text: str, stop_reason: str) -> dict[str, Any]:
        return {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        assert meter is not None
        meter.begin_attempt()
        reply = self.replies.pop(0)
        characters = len(reply["content"][0]["text"])
        if on_progress is not None:
            await on_progress(StreamProgress(characters // 2))
            await on_progress(StreamProgress(characters, done=True, output_tokens=5))
        meter.report(reply["usage"], final=True)
        return reply

    async def aclose(self) -> None:
        return None


async def test_the_final_notification_comes_after_a_paused_turn_is_continued() -> None:
    """ "Claude finished" (progress == total) only once the continuation call has answered too, with
    the characters and output tokens of both calls."""
    wire = Wire()
    sampler = Sampler(Pausing(), assembly.sampler_settings(CONFIG), spend=Spend(SPEND))
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "search"}}], "maxTokens": 100}
    result = await sampler.sample(params, progress=notifier(wire))
    assert result["stopReason"] == "endTurn"
    sent = wire.params()
    assert ["total" in p for p in sent] == [False] * (len(sent) - 1) + [True]
    assert sent[-1]["progress"] == sent[-1]["total"] == 441
    assert sent[-1]["message"] == "Claude finished (10 output tokens)"


async def test_a_paused_turn_whose_continuation_is_refused_still_says_claude_finished() -> None:
    """The continuation lost a budget race: the paused turn is the answer, and its call's final
    notification goes out (the continuation, never made, did not count as a new call)."""
    wire = Wire()
    spend = Spend(replace(SPEND, rate_limit=0, budget=(Allowance(1_000),)), RacedStore())
    sampler = Sampler(Pausing(), assembly.sampler_settings(CONFIG), spend=spend)
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "search"}}], "maxTokens": 100}
    result = await sampler.sample(params, progress=notifier(wire))
    assert result["stopReason"] == "pauseTurn"
    sent = wire.params()
    assert sent[-1]["progress"] == sent[-1]["total"] == 41
    assert sent[-1]["message"] == "Claude finished (5 output tokens)"


async def test_a_paused_turn_whose_continuation_fails_still_says_claude_finished() -> None:
    """The continuation was made and failed: the paused turn is the answer, and its call's final
    notification goes out, after what the failed call streamed."""

    class FailingContinuation(Pausing):
        async def create_message(
            self,
            request: dict[str, Any],
            *,
            on_progress: ProgressCallback | None = None,
            meter: UsageMeter | None = None,
        ) -> dict[str, Any]:
            if len(self.replies) == 2:
                return await super().create_message(request, on_progress=on_progress, meter=meter)
            assert meter is not None
            assert on_progress is not None
            meter.begin_attempt()
            await on_progress(StreamProgress(7))
            raise ProviderError("Claude API error (500 api_error): boom", {"provider": "p", "status": 500})

    wire = Wire()
    sampler = Sampler(FailingContinuation(), assembly.sampler_settings(CONFIG), spend=Spend(SPEND))
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "search"}}], "maxTokens": 100}
    result = await sampler.sample(params, progress=notifier(wire))
    assert result["stopReason"] == "pauseTurn"
    sent = wire.params()
    assert [p["progress"] for p in sent] == sorted({p["progress"] for p in sent})  # only ever grows
    assert sent[-1]["progress"] == sent[-1]["total"]
    assert sent[-1]["message"] == "Claude finished (5 output tokens)"


# -- RoundProgress: what a 2026-07-28 client hears for a request whose rounds the proxy drives ------


def server_progress(value: Any, total: Any = None, message: str = "m") -> dict[str, Any]:
    params: dict[str, Any] = {"progressToken": "t", "progress": value, "message": message}
    if total is not None:
        params["total"] = total
    return {"jsonrpc": "2.0", "method": protocol.PROGRESS, "params": params}


def shown(progress: RoundProgress, message: dict[str, Any], driven: bool = True) -> dict[str, Any]:
    relayed = progress.relayed(message, message["params"], driven)
    return relayed["params"]  # type: ignore[no-any-return]


def test_round_progress_passes_the_first_request_and_lifts_a_count_started_again() -> None:
    progress = RoundProgress("t")
    first = server_progress(5, 10)
    assert progress.relayed(first, first["params"], False) is first  # not driven yet: as it came
    again = server_progress(1, 10, "again")
    assert shown(progress, again) == {"progressToken": "t", "progress": 6, "total": 15, "message": "again"}
    assert shown(progress, server_progress(4, 10))["progress"] == 9  # the same lift for the rest
    progress.resent()
    ahead = server_progress(20, 30)
    assert progress.relayed(ahead, ahead["params"], True) is ahead  # above already: untouched


def test_round_progress_beats_stay_between_the_servers_values() -> None:
    progress = RoundProgress(7)
    assert progress.beat() == 1  # nothing heard yet
    assert progress.beat() == 2
    progress.resent()
    assert shown(progress, server_progress(0.5))["progress"] == 3
    notification = json.loads(progress.notification(12.3))
    assert notification["params"]["progressToken"] == 7
    assert notification["params"]["progress"] == 4
    assert "12 s" in notification["params"]["message"]


def test_round_progress_leaves_what_it_cannot_compare_alone() -> None:
    progress = RoundProgress("t")
    for value in (True, "3", None):
        odd = server_progress(value)
        assert progress.relayed(odd, odd["params"], True) is odd
    assert progress.heard is None
    huge = 2.0**60
    progress.passed(huge)
    assert progress.beat() > huge  # one more is lost in the float's precision: the next float up


async def test_beside_lets_the_answers_failure_out_as_it_is() -> None:
    """The sender's task group must not wrap the sampling's failure in an `ExceptionGroup`: the
    answerer takes a `SamplingError` for the server's error answer, and anything else crashed the
    relay (a failed sampling request that asked for progress ended the whole session)."""
    wire = Wire()
    progress = ProgressNotifier("t", wire.send, clock=wire.clock)

    async def failing_answer() -> None:
        async with progress.beside():
            await progress(StreamProgress(characters=5))
            raise SamplingError(protocol.INVALID_PARAMS, "prompt is too long")

    with pytest.raises(SamplingError, match="prompt is too long"):
        await failing_answer()
