"""The fake Claude API is faithful: the real `anthropic` SDK talks to it as to the real API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import anyio
import httpx2
import pytest

from tests.fake_claude import (
    FakeClaude,
    HangReply,
    MessageReply,
    RecordedRequest,
    error_reply,
    hang_reply,
    message_reply,
    stream_error_reply,
    text_reply,
    tool_use_reply,
    validate_request,
)

MODEL = "claude-sonnet-5"
HELLO: list[Any] = [{"role": "user", "content": "Hello there"}]
WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "note": {"type": "string"}},
                "required": ["lat"],
            },
            "tags": {"type": "array", "items": {"type": "string"}},
            "optional": {"type": "string"},
        },
        "required": ["city", "days", "metric", "unit", "where", "tags"],
    },
}
TIME_TOOL: Any = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def shared_fake() -> Iterator[FakeClaude]:
    with FakeClaude() as server:
        yield server


@pytest.fixture
def fake(shared_fake: FakeClaude) -> FakeClaude:
    shared_fake.reset()
    return shared_fake


def client(fake: FakeClaude, **kwargs: Any) -> anthropic.AsyncAnthropic:
    options: dict[str, Any] = {"api_key": "test-key", "base_url": fake.url, "max_retries": 0, "timeout": 10.0}
    options.update(kwargs)
    return anthropic.AsyncAnthropic(**options)


def raw_post(
    fake: FakeClaude, path: str, body: object, headers: dict[str, str] | None = None
) -> httpx2.Response:
    all_headers = {"authorization": "Bearer test-key", "anthropic-version": "2026-10-21"}
    all_headers.update(headers or {})
    return httpx2.post(fake.url + path, json=body, headers=all_headers, timeout=10.0)


async def ask(
    c: anthropic.AsyncAnthropic, *, streaming: bool = False, received: list[str] | None = None
) -> anthropic.types.Message:
    """One plain request, or one streamed request whose text deltas are appended to `received`."""
    if not streaming:
        return await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO)
    async with c.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as stream:
        async for piece in stream.text_stream:
            if received is not None:
                received.append(piece)
        return await stream.get_final_message()


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


# ---- success, non-streaming ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_create_returns_a_full_message_and_records_the_request(fake: FakeClaude) -> None:
    fake.enqueue(text_reply("Hi!", usage={"input_tokens": 7, "output_tokens": 3}))
    async with client(fake) as c:
        message = await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO, system="Be brief")

    assert message.id.startswith("msg_")
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "Hi!")]
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert message.usage.input_tokens == 7
    assert message.usage.output_tokens == 3
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0
    assert message._request_id is not None
    assert message._request_id.startswith("req_")

    [request] = fake.requests
    assert isinstance(request, RecordedRequest)
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.headers["authorization"] == "Bearer test-key"
    assert request.headers["anthropic-version"]
    assert "x-api-key" not in request.headers
    assert request.body == {"model": MODEL, "max_tokens": 50, "messages": HELLO, "system": "Be brief"}
    assert not request.stream
    assert fake.pending == 0


@pytest.mark.anyio
async def test_scripted_stop_sequence_model_and_headers_are_returned(fake: FakeClaude) -> None:
    fake.enqueue(
        text_reply(
            "one two",
            stop_reason="stop_sequence",
            stop_sequence="three",
            model="claude-other",
            headers={"x-extra": "1"},
        )
    )
    async with client(fake) as c:
        raw = await c.messages.with_raw_response.create(
            model=MODEL, max_tokens=50, messages=HELLO, stop_sequences=["three"]
        )
    message = await raw.parse()
    assert raw.headers["x-extra"] == "1"
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "three"
    assert message.model == "claude-other"


# ---- streaming ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_text_is_reassembled_from_several_deltas(fake: FakeClaude) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    fake.enqueue(text_reply(text))
    async with client(fake) as c, c.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
        request_id = stream.request_id

    assert len(pieces) >= 2
    assert "".join(pieces) == text
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].type == "text"
    assert final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.model == MODEL
    assert final.usage.output_tokens > 1
    assert request_id is not None
    assert request_id.startswith("req_")
    assert fake.requests[0].stream


@pytest.mark.anyio
async def test_stream_tool_use_input_is_rebuilt_from_json_fragments(fake: FakeClaude) -> None:
    tool_input = {"city": "Paris", "days": 3, "nested": {"list": [1, 2, {"x": "y"}]}}
    fake.enqueue(tool_use_reply("get_weather", tool_input, id="toolu_abc", text="Checking."))
    async with (
        client(fake) as c,
        c.messages.stream(model=MODEL, max_tokens=50, messages=HELLO, tools=[WEATHER_TOOL]) as stream,
    ):
        fragments = [event.partial_json async for event in stream if event.type == "input_json"]
        final = await stream.get_final_message()

    assert len([f for f in fragments if f]) >= 2
    assert "".join(fragments) == json.dumps(tool_input)
    assert [b.type for b in final.content] == ["text", "tool_use"]
    block = final.content[1]
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("toolu_abc", "get_weather", tool_input)
    assert final.stop_reason == "tool_use"


@pytest.mark.anyio
async def test_stream_thinking_block_with_signature(fake: FakeClaude) -> None:
    fake.enqueue(
        message_reply(
            [
                {"type": "thinking", "thinking": "Let me think about it", "signature": "sig=="},
                {"type": "text", "text": "Done"},
            ]
        )
    )
    async with client(fake) as c, c.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as stream:
        final = await stream.get_final_message()
    thinking = final.content[0]
    assert thinking.type == "thinking"
    assert (thinking.thinking, thinking.signature) == ("Let me think about it", "sig==")
    assert final.content[1].type == "text"


def test_raw_event_stream_has_the_real_order(fake: FakeClaude) -> None:
    fake.enqueue(tool_use_reply("get_time", {"zone": "UTC"}, id="toolu_1", text="Sure thing"))
    body = {"model": MODEL, "max_tokens": 50, "messages": HELLO, "tools": [TIME_TOOL], "stream": True}
    response = raw_post(fake, "/v1/messages", body)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["request-id"].startswith("req_")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == []
    assert start["stop_reason"] is None
    assert start["model"] == MODEL
    assert set(start["usage"]) >= {"input_tokens", "output_tokens"}
    block_events = [(n, d) for n, d in events if n.startswith("content_block")]
    first_block = [n for n, d in block_events if d["index"] == 0]
    assert first_block[0] == "content_block_start"
    assert first_block[-1] == "content_block_stop"
    assert first_block.count("content_block_delta") >= 2
    tool_start = next(d for n, d in block_events if n == "content_block_start" and d["index"] == 1)
    assert tool_start["content_block"] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "get_time",
        "input": {},
    }
    deltas = [d["delta"] for n, d in block_events if n == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta", "input_json_delta"}
    message_delta = events[-2][1]
    assert message_delta["delta"]["stop_reason"] == "tool_use"
    assert message_delta["usage"]["output_tokens"] >= 1


# ---- errors ---------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error_type", "exception"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (529, "overloaded_error", anthropic.OverloadedError),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
async def test_error_replies_raise_the_sdk_exception(
    fake: FakeClaude, status: int, error_type: str, exception: type[anthropic.APIStatusError], streaming: bool
) -> None:
    fake.enqueue(error_reply(status, error_type, f"scripted {status}"))
    async with client(fake) as c:
        with pytest.raises(exception) as caught:
            await ask(c, streaming=streaming)
    error = caught.value
    assert error.status_code == status
    assert error.type == error_type
    assert error.api_message == f"scripted {status}"
    assert error.request_id is not None
    assert error.request_id.startswith("req_")
    assert error.body == {
        "type": "error",
        "error": {"type": error_type, "message": f"scripted {status}"},
        "request_id": error.request_id,
    }


@pytest.mark.anyio
async def test_retry_after_is_honoured_and_retries_succeed(fake: FakeClaude) -> None:
    fake.enqueue(
        error_reply(529, "overloaded_error", "Overloaded", retry_after=0.01),
        error_reply(429, "rate_limit_error", "Slow down", retry_after=0.01),
        text_reply("finally"),
    )
    started = time.monotonic()
    async with client(fake, max_retries=2) as c:
        message = await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO)
    assert time.monotonic() - started < 2.0  # the 0.01 s retry-after was used, not the ~0.5 s backoff
    assert message.content[0].type == "text"
    assert message.content[0].text == "finally"
    assert [r.headers["x-stainless-retry-count"] for r in fake.requests] == ["0", "1", "2"]


@pytest.mark.anyio
async def test_x_should_retry_false_stops_retries(fake: FakeClaude) -> None:
    fake.enqueue(error_reply(500, "api_error", "boom", should_retry=False), text_reply("unused"))
    async with client(fake, max_retries=2) as c:
        with pytest.raises(anthropic.InternalServerError):
            await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO)
    assert len(fake.requests) == 1
    assert fake.pending == 1


@pytest.mark.anyio
async def test_error_details_become_the_error_code(fake: FakeClaude) -> None:
    fake.enqueue(error_reply(400, "invalid_request_error", "too big", details={"error_code": "some_code"}))
    async with client(fake) as c:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO)
    assert caught.value.error_code == "some_code"


@pytest.mark.anyio
async def test_mid_stream_error_raises_api_status_error(fake: FakeClaude) -> None:
    fake.enqueue(stream_error_reply("overloaded_error", "Overloaded", partial_text="Partial answer"))
    received: list[str] = []
    async with client(fake) as c:
        with pytest.raises(anthropic.APIStatusError) as caught:
            await ask(c, streaming=True, received=received)
    error = caught.value
    assert error.status_code == 200
    assert error.type == "overloaded_error"
    assert error.api_message == "Overloaded"
    assert "".join(received) == "Partial answer"
    assert fake.disconnects == 0


@pytest.mark.anyio
async def test_stream_error_reply_on_a_plain_request_is_an_http_error(fake: FakeClaude) -> None:
    fake.enqueue(stream_error_reply())
    async with client(fake) as c:
        with pytest.raises(anthropic.OverloadedError):
            await c.messages.create(model=MODEL, max_tokens=50, messages=HELLO)


# ---- authentication -------------------------------------------------------------------------------


def test_missing_bearer_token_is_401(fake: FakeClaude) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": HELLO}
    for headers in ({"authorization": ""}, {"authorization": "Basic abc"}, {"authorization": "Bearer"}):
        response = raw_post(fake, "/v1/messages", body, headers)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    response = httpx2.post(fake.url + "/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=10.0)
    assert response.status_code == 401
    assert fake.pending == 0
    assert len(fake.requests) == 4


@pytest.mark.anyio
async def test_a_configured_key_must_match() -> None:
    with FakeClaude(api_key="right-key") as fake:
        async with client(fake, api_key="wrong-key") as c:
            with pytest.raises(anthropic.AuthenticationError):
                await c.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
        async with client(fake, api_key="right-key") as c:
            message = await c.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
        assert message.stop_reason == "end_turn"


@pytest.mark.anyio
async def test_the_default_answer_stops_at_max_tokens() -> None:
    """As Claude does: a long answer ends at `max_tokens`, and says so."""
    long_prompt: list[Any] = [{"role": "user", "content": "word " * 400}]
    with FakeClaude() as fake:
        async with client(fake) as c:
            cut = await c.messages.create(model=MODEL, max_tokens=20, messages=long_prompt)
            whole = await c.messages.create(model=MODEL, max_tokens=2000, messages=long_prompt)
    assert (cut.stop_reason, whole.stop_reason) == ("max_tokens", "end_turn")
    assert cut.usage.output_tokens <= 20 < whole.usage.output_tokens
    [cut_block], [whole_block] = cut.content, whole.content
    assert cut_block.type == whole_block.type == "text"
    assert whole_block.text.startswith(cut_block.text)


# ---- cancellation, hangs, delays ------------------------------------------------------------------


@pytest.mark.anyio
async def test_cancelling_a_hanging_stream_is_seen_as_a_disconnect(fake: FakeClaude) -> None:
    fake.enqueue(hang_reply("thinking..."))
    got_text = anyio.Event()

    async def consume(c: anthropic.AsyncAnthropic) -> None:
        async with c.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as stream:
            async for _ in stream.text_stream:
                got_text.set()
        pytest.fail("a hanging stream must not end")

    async with client(fake) as c:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume, c)
                await got_text.wait()
                assert fake.disconnects == 0
                tg.cancel_scope.cancel()
        assert await fake.await_disconnects(1, timeout=5)
    assert fake.disconnects == 1


@pytest.mark.anyio
async def test_cancelling_a_hanging_plain_request_is_seen_as_a_disconnect(fake: FakeClaude) -> None:
    fake.enqueue(hang_reply())
    async with client(fake) as c:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, c)
                assert await fake.await_requests(1, timeout=5)
                tg.cancel_scope.cancel()
        assert await fake.await_disconnects(1, timeout=5)


@pytest.mark.anyio
async def test_completed_responses_are_not_disconnects(fake: FakeClaude) -> None:
    fake.enqueue(text_reply("a"), text_reply("b"))
    async with client(fake) as c:
        await c.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
        async with c.messages.stream(model=MODEL, max_tokens=5, messages=HELLO) as stream:
            await stream.get_final_message()
    assert not await fake.await_disconnects(1, timeout=0.3)


@pytest.mark.anyio
async def test_client_timeout_on_a_delayed_reply_is_a_disconnect(fake: FakeClaude) -> None:
    fake.enqueue(MessageReply(content=[{"type": "text", "text": "late"}], delay=30))
    async with client(fake, timeout=0.3) as c:
        with pytest.raises(anthropic.APITimeoutError):
            await c.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    assert await fake.await_disconnects(1, timeout=5)


@pytest.mark.anyio
async def test_event_delay_spaces_out_the_stream(fake: FakeClaude) -> None:
    fake.enqueue(MessageReply(content=[{"type": "text", "text": "abcdef"}], event_delay=0.05))
    started = time.monotonic()
    async with client(fake) as c, c.messages.stream(model=MODEL, max_tokens=5, messages=HELLO) as stream:
        final = await stream.get_final_message()
    # message_start, ping, block start, 3 deltas, block stop, message_delta, message_stop: 8 gaps
    assert time.monotonic() - started >= 8 * 0.05 * 0.9
    assert final.content[0].type == "text"
    assert final.content[0].text == "abcdef"


def test_closing_the_fake_ends_a_hanging_request_promptly() -> None:
    fake = FakeClaude().start()
    fake.enqueue(HangReply())
    body = {"model": MODEL, "max_tokens": 5, "messages": HELLO}
    errors: list[BaseException] = []

    def call() -> None:
        try:
            raw_post(fake, "/v1/messages", body)
        except BaseException as exc:  # the server closing is acceptable
            errors.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert fake.wait_for_requests(1, timeout=5)
    started = time.monotonic()
    fake.close()
    assert time.monotonic() - started < 3.0
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError):
        _ = fake.url


# ---- default replies --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_default_reply_calls_the_first_tool_with_example_arguments(fake: FakeClaude) -> None:
    async with client(fake) as c:
        message = await c.messages.create(
            model=MODEL, max_tokens=50, messages=HELLO, tools=[WEATHER_TOOL, TIME_TOOL]
        )
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use"
    assert block.name == "get_weather"
    assert block.id.startswith("toolu_")
    assert block.input == {
        "city": "sample-city",
        "days": 1,
        "metric": True,
        "unit": "celsius",
        "where": {"lat": 1},
        "tags": [],
    }


@pytest.mark.anyio
async def test_default_reply_honours_a_named_tool_choice_when_streaming(fake: FakeClaude) -> None:
    async with (
        client(fake) as c,
        c.messages.stream(
            model=MODEL,
            max_tokens=50,
            messages=HELLO,
            tools=[WEATHER_TOOL, TIME_TOOL],
            tool_choice={"type": "tool", "name": "get_time"},
        ) as stream,
    ):
        message = await stream.get_final_message()
    [block] = message.content
    assert block.type == "tool_use"
    assert (block.name, block.input) == ("get_time", {})


@pytest.mark.anyio
async def test_default_reply_is_text_with_tool_choice_none(fake: FakeClaude) -> None:
    async with client(fake) as c:
        message = await c.messages.create(
            model=MODEL, max_tokens=50, messages=HELLO, tools=[WEATHER_TOOL], tool_choice={"type": "none"}
        )
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    assert message.content[0].text == "fake-claude says: 1 messages; last: Hello there"


@pytest.mark.anyio
async def test_default_reply_after_tool_results_summarises_them(fake: FakeClaude) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "Sunny, 21C"}],
                }
            ],
        },
    ]
    async with client(fake) as c:
        message = await c.messages.create(model=MODEL, max_tokens=50, messages=messages, tools=[WEATHER_TOOL])
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    text = message.content[0].text
    assert text.startswith("fake-claude says: 3 messages")
    assert "Sunny, 21C" in text


@pytest.mark.anyio
async def test_queued_factories_see_the_request(fake: FakeClaude) -> None:
    fake.enqueue(lambda request: text_reply(f"max_tokens={request.body['max_tokens']}"))
    async with client(fake) as c:
        message = await c.messages.create(model=MODEL, max_tokens=42, messages=HELLO)
    assert message.content[0].type == "text"
    assert message.content[0].text == "max_tokens=42"


# ---- validation -------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"extra_body": {"temperature": 0.5}}, "temperature"),
        ({"messages": [{"role": "user", "content": "  "}]}, "non-empty content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "non-whitespace"),
        ({"tools": [{"name": "bad.name", "input_schema": {"type": "object"}}]}, "tools.0"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
                    },
                    {"role": "user", "content": "no result"},
                ],
                "tools": [{"name": "x", "input_schema": {"type": "object"}}],
            },
            "without `tool_result`",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
                    },
                ]
            },
            "must define tools",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "so "}]},
            "whitespace",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ],
)
async def test_invalid_requests_are_rejected_like_the_real_api(
    fake: FakeClaude, kwargs: dict[str, Any], fragment: str
) -> None:
    fake.enqueue(text_reply("scripted"))
    params: dict[str, Any] = {"model": MODEL, "max_tokens": 50, "messages": HELLO}
    params.update(kwargs)
    async with client(fake) as c:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await c.messages.create(**params)
    assert caught.value.type == "invalid_request_error"
    assert fragment in str(caught.value.api_message)
    assert fake.pending == 1  # a rejected request does not use up the scripted reply


def test_validation_can_be_switched_off() -> None:
    with FakeClaude(validate=False) as fake:
        response = raw_post(
            fake, "/v1/messages", {"model": MODEL, "max_tokens": 100, "messages": [], "top_k": 3}
        )
        assert response.status_code == 200
        assert response.json()["content"][0]["text"].startswith("fake-claude says: 0 messages")


# ---- other endpoints --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_count_tokens(fake: FakeClaude) -> None:
    fake.enqueue(text_reply("untouched"))
    async with client(fake) as c:
        counted = await c.messages.count_tokens(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL])
    assert counted.input_tokens > 1
    assert fake.requests[0].path == "/v1/messages/count_tokens"
    assert fake.message_requests == []
    assert fake.pending == 1


def test_unknown_paths_are_404_in_the_api_error_shape(fake: FakeClaude) -> None:
    response = raw_post(fake, "/v1/complete", {})
    assert response.status_code == 404
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert body["request_id"] == response.headers["request-id"]
    get = httpx2.get(fake.url + "/v1/messages", headers={"authorization": "Bearer k"}, timeout=10.0)
    assert get.status_code == 405
    assert get.json()["error"]["type"] == "invalid_request_error"


def test_reset_forgets_requests_and_replies(fake: FakeClaude) -> None:
    fake.enqueue(text_reply("x"))
    raw_post(fake, "/v1/nothing", {})
    fake.reset()
    assert (fake.requests, fake.pending, fake.disconnects) == ([], 0, 0)


@pytest.mark.anyio
async def test_the_fake_records_the_tokens_it_served(fake: FakeClaude) -> None:
    usage = {"input_tokens": 12, "output_tokens": 34, "cache_read_input_tokens": 5}
    fake.enqueue(
        text_reply("complete", usage=usage),
        hang_reply("Once upon a time there was"),
        error_reply(529, "overloaded_error", "Overloaded", should_retry=False),
    )
    body: dict[str, Any] = {
        "model": "claude-sonnet-5",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with client(fake) as sdk:  # closed here: a client left to the GC closes in a later test's loop
        async with sdk.messages.stream(**body) as stream:
            await stream.get_final_message()
        with anyio.move_on_after(1):  # the stream hangs after its first delta; the client gives up
            async with sdk.messages.stream(**body) as stream:
                async for _ in stream:
                    pass
        with pytest.raises(anthropic.APIStatusError):
            await sdk.messages.create(**body)
    with anyio.fail_after(10):
        while fake.disconnects < 1:
            await anyio.sleep(0.01)
    complete, cut = fake.served  # the 529 served nothing
    assert complete.usage == {**dict.fromkeys(complete.usage, 0), **usage}
    assert cut.usage["input_tokens"] > 0  # message_start was written
    assert cut.usage["output_tokens"] >= 1  # and a delta: its estimate, as no message_delta came
    assert fake.served_tokens() == complete.total + cut.total


PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def image(media_type: str = "image/png", data: str = PNG_1PX) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ([image("image/bmp")], "media_type"),
        ([image(data="A" * (7 * 1024 * 1024))], "exceeds 5 MB"),
        ([image()] * 101, "too many images"),
        (
            [{"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}}],
            "pdf",
        ),
        (
            [{"type": "document", "source": {"type": "text", "media_type": "text/html", "data": "<p>"}}],
            "text/plain",
        ),
    ],
)
def test_media_the_real_api_rejects_is_a_400(content: list[Any], problem: str) -> None:
    message = validate_request(asking(content), VERSION_HEADER)
    assert message is not None
    assert problem.lower() in message.lower()


def test_media_the_real_api_accepts_passes() -> None:
    content = [image(), image("image/webp"), {"type": "text", "text": "what is this?"}]
    assert validate_request(asking(content), VERSION_HEADER) is None


VERSION_HEADER = {"anthropic-version": "2023-06-01"}


def asking(content: list[Any]) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
