"""The Claude Messages API through the official `anthropic` SDK, always streaming.

One class serves every backend the SDK has a client for (the Claude API, Bedrock, Vertex): they
share the Messages surface and differ only in URL, auth and model ids (see `platforms`).
Streaming avoids the SDK's non-streaming guard for large `max_tokens`, keeps long generations
from idling out, reports progress as it goes, and lets cancellation close the HTTP stream. The
SDK's own retries are off: `RetryingProvider` owns retrying, against a deadline.
"""

from __future__ import annotations

import email.utils
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anthropic
import httpx2

from mcp_backfill.errors import ProviderError
from mcp_backfill.logs import Redactor
from mcp_backfill.protocol import INTERNAL_ERROR, INVALID_PARAMS, SSE_TYPE
from mcp_backfill.sampling.provider import ProgressCallback, StreamProgress, UsageMeter

# Statuses that mean "this request is wrong", so the server, not the operator, must act.
REQUEST_FAULT_STATUSES = frozenset({400, 413, 422})
# Worth another try (the SDK's own list): timeouts, conflicts, rate limits, every 5xx incl. 529.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# A mid-stream `event: error` arrives on a 200 response; these types are transient (Claude API
# error types, and the exception frames Bedrock sends inside its event stream).
RETRYABLE_STREAM_ERRORS = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "timeout_error",
        "modelStreamErrorException",
        "throttlingException",
        "internalServerException",
        "serviceUnavailableException",
        "modelTimeoutException",
    }
)

# Failures that mean the request never reached the API (no connection was made): not billed.
NEVER_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout)

AnyClient = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


# Where each backend's credentials come from, for the message that says they were refused.
CREDENTIALS = {
    "anthropic": "ANTHROPIC_API_KEY",
    "bedrock": "the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)",
    "vertex": "the Google credentials (MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials)",
}


def _name_not_resolved(exc: BaseException) -> bool:
    """Did a connection fail because the host name does not resolve?"""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain: SDK error -> httpx2 error -> OSError
        if seen is None:
            return False
        if isinstance(seen, socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class AnthropicProvider:
    """A `Provider` over an anthropic SDK async client (Claude API, Bedrock or Vertex)."""

    def __init__(
        self,
        client: AnyClient,
        *,
        name: str = "anthropic",
        model_id: Callable[[str], str] = str,
        secrets: Iterable[str] = (),
    ) -> None:
        self.name = name
        self._client = client
        self._model_id = model_id
        self._redact = Redactor(secrets).redact

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        request = {**request, "model": self._model_id(str(request.get("model", "")))}
        meter = meter or _UNMETERED
        request_id: str | None = None
        streaming = False  # a response has started: what goes wrong now is the stream's fault
        meter.begin_attempt()
        try:
            async with self._client.messages.stream(**request) as stream:
                streaming = True
                request_id = stream.request_id
                characters, completed = 0, False
                async for event in stream:
                    if event.type == "content_block_delta":
                        characters += _delta_length(event.delta)
                        if on_progress is not None:
                            await on_progress(StreamProgress(characters))
                    elif event.type in ("message_start", "message_delta"):
                        # The usage so far (the SDK has folded this event into its snapshot).
                        meter.report(stream.current_message_snapshot.usage.model_dump(exclude_none=True))
                    elif event.type == "message_stop":
                        completed = True
                if not completed:
                    raise self._error(
                        "Claude API stream ended before the message was complete",
                        "incomplete_stream",
                        request_id,
                        retryable=True,
                    )
                message = await stream.get_final_message()
        except ProviderError:
            raise
        except anthropic.APIStatusError as exc:
            if exc.response.status_code >= 400:  # refused before any message: nothing is billed
                meter.not_billed()
            raise self._status_error(exc) from None
        except anthropic.APITimeoutError as exc:
            if isinstance(exc.__cause__, NEVER_SENT):
                meter.not_billed()
            raise self._error("Claude API request timed out", "timeout", request_id, retryable=True) from None
        except anthropic.APIConnectionError as exc:
            if isinstance(exc.__cause__, NEVER_SENT):
                meter.not_billed()
            if _name_not_resolved(exc):  # retrying will not make the name resolve: say so at once
                raise self._error(
                    f"Claude API host name does not resolve ({self._redact(str(exc.__cause__ or exc))}); "
                    "check ANTHROPIC_BASE_URL (or the platform's region) and this machine's DNS",
                    "name_resolution",
                    request_id,
                    retryable=False,
                ) from None
            raise self._error(
                f"Claude API unreachable: {self._redact(str(exc.__cause__ or exc))}",
                "connection_error",
                request_id,
                retryable=True,
            ) from None
        except httpx2.HTTPError as exc:  # the connection broke while the stream was being read
            raise self._error(
                f"Claude API stream broke off: {self._redact(str(exc) or type(exc).__name__)}",
                "connection_error",
                request_id,
                retryable=True,
            ) from None
        except ValueError as exc:
            if streaming:  # an event that is not valid JSON or not a known event shape
                raise self._error(
                    f"Claude API sent a malformed stream: {self._redact(str(exc))[:200]}",
                    "malformed_response",
                    request_id,
                    retryable=True,
                ) from None
            meter.not_billed()  # the client refused the request before sending it
            raise self._client_error(exc) from None
        except Exception as exc:  # e.g. no credentials found by boto3 / google-auth
            if not streaming:  # the client refused before anything was sent
                meter.not_billed()
            raise self._client_error(exc) from None
        result = message.model_dump(mode="json", exclude_none=True)
        meter.report(result.get("usage") or {}, final=True)
        if request_id:
            result["request_id"] = request_id
        if on_progress is not None:
            await on_progress(
                StreamProgress(characters, done=True, output_tokens=message.usage.output_tokens)
            )
        return result

    def _error(
        self, message: str, error_type: str, request_id: str | None, *, retryable: bool
    ) -> ProviderError:
        data: dict[str, Any] = {"provider": self.name, "type": error_type}
        if request_id:
            data["request_id"] = request_id
        return ProviderError(message, data, retryable=retryable)

    def _client_error(self, exc: Exception) -> ProviderError:
        """The SDK client refused before anything was sent (credentials, an unusable request...)."""
        detail = self._redact(f"{type(exc).__name__}: {exc}")[:300]
        return ProviderError(
            f"The {self.name} client could not make the call: {detail}",
            {"provider": self.name, "type": "client_error"},
        )

    def _status_error(self, exc: anthropic.APIStatusError) -> ProviderError:
        status = exc.status_code
        headers = exc.response.headers
        data: dict[str, Any] = {"provider": self.name, "status": status, "type": exc.type}
        if exc.error_code:
            data["error_code"] = exc.error_code
        if exc.request_id:
            data["request_id"] = exc.request_id
        detail = self._redact(exc.api_message or exc.message)
        if status in (401, 403):
            detail += f"; check {CREDENTIALS.get(self.name, 'ANTHROPIC_API_KEY')}"
        return ProviderError(
            f"Claude API error ({status} {exc.type or 'error'}): {detail}",
            data,
            code=INVALID_PARAMS if status in REQUEST_FAULT_STATUSES else INTERNAL_ERROR,
            retryable=_is_retryable(status, exc.type, headers),
            retry_after=retry_after_seconds(headers),
        )

    async def aclose(self) -> None:
        await self._client.close()


class _Unmetered:
    """The meter of a caller that does not count (a `UsageMeter` that ignores everything)."""

    def begin_attempt(self) -> None:
        pass

    def report(self, usage: Mapping[str, int], *, final: bool = False) -> None:
        pass

    def not_billed(self) -> None:
        pass


_UNMETERED = _Unmetered()


def _delta_length(delta: Any) -> int:
    for field in ("text", "partial_json", "thinking"):
        value = getattr(delta, field, None)
        if isinstance(value, str):
            return len(value)
    return 0


def _is_retryable(status: int, error_type: str | None, headers: Mapping[str, str]) -> bool:
    should_retry = headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        return should_retry == "true"
    if status == 200:
        return error_type in RETRYABLE_STREAM_ERRORS
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """`retry-after-ms`, else `retry-after` (seconds or an HTTP date), as seconds; None if absent."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            when = email.utils.parsedate_to_datetime(raw).timestamp()
        except (TypeError, ValueError):
            return None
        return max(0.0, when - (time.time() if now is None else now))
    return None


# One streamed answer with a text block and a tool call, as the Messages API sends it: `prime_sdk`
# plays it to the SDK so that its deferred work is done before the first real request.
_PRIMING_EVENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "message_start",
        {
            "message": {
                "id": "msg_priming",
                "type": "message",
                "role": "assistant",
                "model": "priming",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        },
    ),
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
    ("content_block_stop", {"index": 0}),
    (
        "content_block_start",
        {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_priming", "name": "t", "input": {}}},
    ),
    ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
    ("content_block_stop", {"index": 1}),
    (
        "message_delta",
        {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 2}},
    ),
    ("message_stop", {}),
)


def prime_sdk() -> None:
    """Stream one canned answer through a throwaway SDK client, in memory (no network, no key used).

    The SDK defers work to its first request: pydantic builds the schemas of the stream's event and
    message models on first use, and a few modules are imported then. That took about 30 ms of the
    first sampling request here; done during the warm-up, the first answer costs what later ones do.
    Runs its own event loop: call it from a worker thread (as the provider build is).
    """
    import asyncio
    import json

    body = "".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in _PRIMING_EVENTS
    ).encode()

    def answer(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": SSE_TYPE}, content=body)

    async def play() -> None:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
        client = anthropic.AsyncAnthropic(
            api_key="priming", base_url="http://priming.invalid", http_client=http
        )
        async with (
            client,
            client.messages.stream(
                model="priming",
                max_tokens=1,
                messages=[{"role": "user", "content": "priming"}],
                tools=[{"name": "t", "input_schema": {"type": "object"}}],
            ) as stream,
        ):
            async for _ in stream:
                pass
            await stream.get_final_message()

    asyncio.run(play())
