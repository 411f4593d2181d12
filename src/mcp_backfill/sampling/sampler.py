"""One sampling request, end to end: validate -> convert -> provider -> convert back.

The sampler knows Claude's request shape and the provider interface, not MCP transports, so the
relay for either protocol era (and any transport) can call it the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mcp_backfill.logs import get_logger
from mcp_backfill.providers.base import Provider
from mcp_backfill.sampling.convert import ConversionOptions, to_claude_request, to_mcp_result
from mcp_backfill.sampling.errors import SamplingError
from mcp_backfill.sampling.models import select_model

log = get_logger("sampler")

# Claude pauses long server-tool turns with `pause_turn`; the turn is handed back to continue it.
MAX_PAUSE_CONTINUATIONS = 3


@dataclass(frozen=True)
class SamplerSettings:
    conversion: ConversionOptions
    default_model: str
    allowed_models: Sequence[str]


class SamplingObserver(Protocol):
    """Told once per answered or refused sampling request (e.g. to keep metrics)."""

    def sampling_done(
        self,
        *,
        outcome: str,
        model: str,
        latency: float,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None: ...


class Sampler:
    """Answers `sampling/createMessage` params with a `CreateMessageResult` (wire JSON)."""

    def __init__(
        self, provider: Provider, settings: SamplerSettings, observer: SamplingObserver | None = None
    ) -> None:
        self.provider = provider
        self.settings = settings
        self.observer = observer

    async def sample(self, params: dict[str, Any], *, request_id: Any = None) -> dict[str, Any]:
        started = time.monotonic()
        model = "?"
        try:
            claude_request = to_claude_request(params, self.settings.conversion)
            model = select_model(
                params.get("modelPreferences"),
                allowed=self.settings.allowed_models,
                default=self.settings.default_model,
            )
            message = await self._create(dict(claude_request.kwargs, model=model))
            result = to_mcp_result(message, claude_request)
        except SamplingError as exc:
            log.warning(
                "sampling request refused",
                extra={
                    "request_id": request_id,
                    "model": model,
                    "code": exc.code,
                    "error": exc.message,
                    "latency_ms": _elapsed_ms(started),
                },
            )
            if self.observer is not None:
                self.observer.sampling_done(outcome="error", model=model, latency=time.monotonic() - started)
            raise
        usage = message.get("usage") or {}
        log.info(
            "sampling request answered",
            extra={
                "request_id": request_id,
                "model": message.get("model", model),
                "tools": len(claude_request.kwargs.get("tools", ())),
                "stop_reason": message.get("stop_reason"),
                "input_tokens": usage.get("input_tokens"),
                "output_tokens": usage.get("output_tokens"),
                "latency_ms": _elapsed_ms(started),
            },
        )
        if self.observer is not None:
            self.observer.sampling_done(
                outcome="ok",
                model=str(message.get("model", model)),
                latency=time.monotonic() - started,
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
            )
        return result

    async def _create(self, request: dict[str, Any]) -> dict[str, Any]:
        message = await self.provider.create_message(request)
        for _ in range(MAX_PAUSE_CONTINUATIONS):
            if message.get("stop_reason") != "pause_turn":
                break
            history = [*request["messages"], {"role": "assistant", "content": message.get("content", [])}]
            follow_up = await self.provider.create_message({**request, "messages": history})
            message = _continue(message, follow_up)
        return message


def _continue(first: dict[str, Any], follow_up: dict[str, Any]) -> dict[str, Any]:
    """Merge a continued turn into one message: content appended, usage added up."""
    usage = dict(first.get("usage") or {})
    for key, value in (follow_up.get("usage") or {}).items():
        if isinstance(value, int) and isinstance(usage.get(key), int):
            usage[key] += value
        else:
            usage.setdefault(key, value)
    return {
        **follow_up,
        "content": [*first.get("content", []), *follow_up.get("content", [])],
        "usage": usage,
    }


def _elapsed_ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
