"""One sampling request, end to end: validate -> convert -> provider -> convert back.

The sampler knows Claude's request shape and the provider interface, not MCP transports, so the
relay for either protocol era (and any transport) can call it the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcp_backfill.logs import get_logger
from mcp_backfill.providers.base import ProgressCallback, Provider
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


class Sampler:
    """Answers `sampling/createMessage` params with a `CreateMessageResult` (wire JSON)."""

    def __init__(self, provider: Provider, settings: SamplerSettings) -> None:
        self.provider = provider
        self.settings = settings

    async def sample(
        self, params: dict[str, Any], *, request_id: Any = None, progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """`progress`, when given, hears how far Claude's answer has got while it streams."""
        started = time.monotonic()
        model = "?"
        try:
            claude_request = to_claude_request(params, self.settings.conversion)
            model = select_model(
                params.get("modelPreferences"),
                allowed=self.settings.allowed_models,
                default=self.settings.default_model,
            )
            message = await self._create(dict(claude_request.kwargs, model=model), progress)
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
        return result

    async def _create(self, request: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
        message = await self.provider.create_message(request, on_progress=progress)
        for _ in range(MAX_PAUSE_CONTINUATIONS):
            if message.get("stop_reason") != "pause_turn":
                break
            history = [*request["messages"], {"role": "assistant", "content": message.get("content", [])}]
            follow_up = await self.provider.create_message(
                {**request, "messages": history}, on_progress=progress
            )
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
