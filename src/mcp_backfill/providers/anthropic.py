"""The Claude Messages API through the official `anthropic` SDK, always streaming.

Streaming avoids the SDK's non-streaming guard for large `max_tokens`, keeps long generations
from idling out, and lets cancellation close the HTTP stream (the relay cancels the task).
"""

from __future__ import annotations

from typing import Any

import anthropic

from mcp_backfill.sampling.errors import INTERNAL_ERROR, INVALID_PARAMS, SamplingError

# Statuses that mean "this request is wrong", so the server, not the operator, must act.
REQUEST_FAULT_STATUSES = frozenset({400, 413, 422})


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self, api_key: str, *, base_url: str | None = None, max_retries: int = 2, timeout: float = 600.0
    ) -> None:
        self._api_key = api_key
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )

    async def create_message(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self._client.messages.stream(**request) as stream:
                message = await stream.get_final_message()
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc) from None
        except anthropic.APITimeoutError:
            raise SamplingError(
                INTERNAL_ERROR, "Claude API request timed out", {"provider": self.name, "type": "timeout"}
            ) from None
        except anthropic.APIConnectionError as exc:
            raise SamplingError(
                INTERNAL_ERROR,
                f"Claude API unreachable: {self._redact(str(exc.__cause__ or exc))}",
                {"provider": self.name, "type": "connection_error"},
            ) from None
        result = message.model_dump(mode="json", exclude_none=True)
        if stream.request_id:
            result["request_id"] = stream.request_id
        return result

    def _status_error(self, exc: anthropic.APIStatusError) -> SamplingError:
        status = exc.status_code
        # A mid-stream `event: error` arrives on a 200 response; its type says what happened.
        code = INVALID_PARAMS if status in REQUEST_FAULT_STATUSES else INTERNAL_ERROR
        data: dict[str, Any] = {"provider": self.name, "status": status, "type": exc.type}
        if exc.error_code:
            data["error_code"] = exc.error_code
        if exc.request_id:
            data["request_id"] = exc.request_id
        detail = self._redact(exc.api_message or exc.message)
        return SamplingError(code, f"Claude API error ({status} {exc.type or 'error'}): {detail}", data)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def aclose(self) -> None:
        await self._client.close()
