"""One sampling request, end to end: limits -> validate and convert -> budgets, rate limit and a
concurrency slot -> provider -> charge the budgets -> response limits -> convert back.

The sampler knows Claude's request shape and the provider interface, not MCP transports, so the
relay for either protocol era (and any transport) can call it the same way. Every exchange is
logged and, with `--audit-log`, audited, whatever its outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from mcp_backfill.errors import SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.protocol import INTERNAL_ERROR
from mcp_backfill.sampling.audit import AuditLog, AuditRecord
from mcp_backfill.sampling.convert import ConversionOptions, to_claude_request, to_mcp_result
from mcp_backfill.sampling.limits import RequestLimits, check_request, check_response
from mcp_backfill.sampling.model_choice import select_model
from mcp_backfill.sampling.provider import ProgressCallback, Provider
from mcp_backfill.sampling.spend import SamplingSession, Spend, normalize_usage

log = get_logger("sampler")

# Claude pauses long server-tool turns with `pause_turn`; the turn is handed back to continue it.
MAX_PAUSE_CONTINUATIONS = 3


@dataclass(frozen=True)
class SamplerSettings:
    """The operator's sampling policy (built from `Config` by `assembly`)."""

    conversion: ConversionOptions
    default_model: str
    allowed_models: Sequence[str]
    limits: RequestLimits


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
    """Answers `sampling/createMessage` params with a `CreateMessageResult` (wire JSON).

    Every exchange, answered or refused, is logged (with the remaining budgets) and written to the
    audit log when there is one.
    """

    def __init__(
        self,
        provider: Provider,
        settings: SamplerSettings,
        *,
        spend: Spend,
        audit: AuditLog | None = None,
        observer: SamplingObserver | None = None,
    ) -> None:
        self.provider = provider
        self.settings = settings
        self.spend = spend
        self.audit = audit
        self.observer = observer

    async def sample(
        self,
        params: dict[str, Any],
        *,
        request_id: Any = None,
        session: SamplingSession | None = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """`progress`, when given, hears how far Claude's answer has got while it streams."""
        exchange = AuditRecord(request_id=request_id, session=session.label if session else None)
        result: dict[str, Any] | None = None
        try:
            result = await self._answer(params, exchange, session, progress)
            return result
        except SamplingError as exc:
            exchange.fail(exc.code, exc.message, exc.data)
            self.spend.note_refusal(exc)
            raise
        except anyio.get_cancelled_exc_class():
            exchange.cancelled = True
            raise
        except Exception:
            exchange.fail(INTERNAL_ERROR, "Internal error in mcp-backfill while sampling")
            raise
        finally:
            self._report(exchange, session, params, result)

    async def _answer(
        self,
        params: dict[str, Any],
        exchange: AuditRecord,
        session: SamplingSession | None,
        progress: ProgressCallback | None,
    ) -> dict[str, Any]:
        """Limits -> conversion -> budgets, rate and a slot -> Claude -> charge -> limits -> MCP."""
        check_request(params, self.settings.limits)
        claude_request = to_claude_request(params, self.settings.conversion)
        model = select_model(
            params.get("modelPreferences"),
            allowed=self.settings.allowed_models,
            default=self.settings.default_model,
        )
        exchange.model = model
        exchange.tools = len(claude_request.kwargs.get("tools", ()))
        async with self.spend.admit(session):
            message = await self._create(dict(claude_request.kwargs, model=model), progress)
        self._charge(message, exchange, session)
        check_response(message, self.settings.limits)
        return to_mcp_result(message, claude_request)

    def _charge(
        self, message: dict[str, Any], exchange: AuditRecord, session: SamplingSession | None
    ) -> None:
        """Charge the budgets with what Claude reports; the result `_meta` gets all four counters."""
        usage = normalize_usage(message.get("usage"))
        message["usage"] = {**(message.get("usage") or {}), **usage}
        self.spend.charge(usage, session)
        exchange.usage = usage
        exchange.model = message.get("model") or exchange.model
        exchange.stop_reason = message.get("stop_reason")
        exchange.claude_request_id = message.get("request_id")

    def _report(
        self,
        exchange: AuditRecord,
        session: SamplingSession | None,
        params: dict[str, Any],
        result: dict[str, Any] | None,
    ) -> None:
        extra: dict[str, Any] = {
            "request_id": exchange.request_id,
            "session": exchange.session,
            "model": exchange.model,
            "tools": exchange.tools,
            "stop_reason": exchange.stop_reason,
            **(exchange.usage or {}),
            "latency_ms": exchange.latency_ms,
        }
        if self.spend.budget.limit is not None:
            extra["budget_remaining"] = self.spend.budget.remaining
        if session is not None and session.budget.limit is not None:
            extra["session_budget_remaining"] = session.budget.remaining
        if exchange.error is not None:
            log.warning(
                "sampling request refused",
                extra={**extra, "code": exchange.error["code"], "error": exchange.error["message"]},
            )
        elif exchange.cancelled:
            log.info("sampling request cancelled", extra=extra)
        else:
            log.info("sampling request answered", extra=extra)
        if self.audit is not None:
            self.audit.record(exchange, params, result)
        if self.observer is not None:
            usage = exchange.usage or {}
            self.observer.sampling_done(
                outcome=exchange.outcome,
                model=exchange.model or "?",
                latency=exchange.latency_ms / 1000,
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
            )

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
