"""One sampling request, end to end: limits -> validate and convert -> budgets, rate limits and
concurrency slots -> provider, each call charged to the ledger however it ends -> response limits
-> convert back.

The sampler knows Claude's request shape and the provider interface, not MCP transports, so the
relay for either protocol era (and any transport) can call it the same way. Every exchange is
logged and, with `--audit-log`, audited, whatever its outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import anyio

from mcp_backfill import telemetry
from mcp_backfill.errors import ProviderError, SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.protocol import INTERNAL_ERROR
from mcp_backfill.sampling.audit import AuditLog, AuditRecord
from mcp_backfill.sampling.convert import ConversionOptions, to_claude_request, to_mcp_result
from mcp_backfill.sampling.estimate import reservation_for
from mcp_backfill.sampling.limits import RequestLimits, check_request, check_response
from mcp_backfill.sampling.model_choice import select_model
from mcp_backfill.sampling.provider import (
    ProgressCallback,
    Provider,
    StreamProgress,
    WarmsUp,
    one_deadline,
)
from mcp_backfill.sampling.spend import Reservation, SamplingSession, Spend, Ticket, normalize_usage
from mcp_backfill.telemetry import ChatOutcome, ChatSpan

log = get_logger("sampler")

# Claude pauses long server-tool turns with `pause_turn`; the turn is handed back to continue it.
MAX_PAUSE_CONTINUATIONS = 3

# What the warm-up converts both ways once, nothing sent: the first run of the checks and the
# conversion costs about 0.25 ms more than later ones (caches filled, code specialised), which the
# first sampling answer would otherwise pay (benchmarks/README.md, the twenty-seventh round).
_WARM_UP_REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": {"type": "text", "text": "warm-up"}},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "w1", "name": "t", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "toolUseId": "w1", "content": []}]},
    ],
    "systemPrompt": "warm-up",
    "maxTokens": 1,
    "modelPreferences": {"hints": [{"name": "sonnet"}], "intelligencePriority": 0.5},
    "tools": [{"name": "t", "description": "warm-up", "inputSchema": {"type": "object"}}],
    "toolChoice": {"mode": "auto"},
}
_WARM_UP_ANSWER: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "warm-up"},
        {"type": "tool_use", "id": "w2", "name": "t", "input": {}},
    ],
    "stop_reason": "tool_use",
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


@dataclass(frozen=True)
class SamplerSettings:
    """The operator's sampling policy (built from `Config` by `assembly`)."""

    conversion: ConversionOptions
    default_model: str
    allowed_models: Sequence[str]
    limits: RequestLimits
    allow_model_upgrade: bool = False
    """May `modelPreferences` pick a pricier family than `default_model`?"""


@dataclass(frozen=True)
class SamplingPreview:
    """What a sampling request would ask of Claude, for a person deciding whether to allow it."""

    model: str
    max_tokens: int
    tools: tuple[str, ...]
    prompt: str  # the text of the last message
    system: str = ""  # the system prompt Claude gets
    earlier: int = 0  # messages before the last one (not shown)
    tool_text: str = ""  # the tools' descriptions, one line each ("name: description")


def _shown_text(content: Any) -> str:
    """The text of a Claude message's content for a person to read: its text blocks, the text of
    tool results (in a tool loop, the last message is one), and the kind of what is not text."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            parts.append(f"[tool result] {_shown_text(block.get('content', ''))}".rstrip())
        else:
            parts.append(f"[{kind}]")
    return " ".join(part for part in parts if part)


class SamplingObserver(Protocol):
    """Told once per sampling request, whatever its outcome (e.g. to keep metrics); `latency` is how
    long it took in seconds, None when no Claude call was made for it (refused before one, or
    cancelled first): it says nothing of Claude's latency; `tokens` are what was charged to the
    budgets for it, by usage counter; `client` is the client identity that pays (empty without a
    session)."""

    def sampling_done(
        self, *, outcome: str, model: str, latency: float | None, tokens: Mapping[str, int], client: str
    ) -> None: ...


class Sampler:
    """Answers `sampling/createMessage` params with a `CreateMessageResult` (wire JSON).

    Every exchange, whatever its outcome, is logged (with what it was charged and the remaining
    budgets) and written to the audit log when there is one.
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
        self._converted = False

    async def sample(
        self,
        params: dict[str, Any],
        *,
        request_id: Any = None,
        session: SamplingSession | None = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """`progress`, when given, hears how far Claude's answer has got while it streams."""
        with telemetry.current().chat(self.provider.name) as span:
            return await self._sample(params, request_id, session, progress, span)

    async def _sample(
        self,
        params: dict[str, Any],
        request_id: Any,
        session: SamplingSession | None,
        progress: ProgressCallback | None,
        span: ChatSpan,
    ) -> dict[str, Any]:
        exchange = _exchange(request_id, session)
        result: dict[str, Any] | None = None
        error_type: str | None = None
        try:
            result = await self._answer(params, exchange, session, progress, span)
            return result
        except ProviderError as exc:
            exchange.fail(exc.code, exc.message, exc.data, _provider_outcome(exc))
            data = exc.data or {}
            error_type = str(data.get("type") or data.get("status") or exc.code)
            raise
        except SamplingError as exc:
            exchange.fail(exc.code, exc.message, exc.data, "refused" if not exchange.calls else "failed")
            if exchange.outcome == "refused":  # a limit after a call (billed) failed the request
                self.spend.note_refusal(exc)
            raise
        except anyio.get_cancelled_exc_class():
            exchange.cancelled = True
            raise
        except Exception:
            exchange.fail(INTERNAL_ERROR, "Internal error in mcp-backfill while sampling", None, "failed")
            raise
        finally:
            self._report(exchange, session, params, result)
            span.end(_chat_outcome(exchange, error_type))

    def refused(
        self,
        params: dict[str, Any],
        error: SamplingError,
        *,
        request_id: Any = None,
        session: SamplingSession | None = None,
    ) -> None:
        """Report a sampling request refused before the sampler was asked (the user did not approve
        it, or the client cancelled the request it was made for): logged, audited and counted as
        any refusal, with nothing charged."""
        exchange = _exchange(request_id, session)
        exchange.fail(error.code, error.message, error.data, "refused")
        self._report(exchange, session, params, None)

    def abandoned(
        self, params: dict[str, Any], *, request_id: Any = None, session: SamplingSession | None = None
    ) -> None:
        """Report a sampling request cancelled before the sampler was asked (the server cancelled
        it, or the session ended, while the user's approval was awaited): logged, audited and
        counted as cancelled, with nothing charged."""
        exchange = _exchange(request_id, session)
        exchange.cancelled = True
        self._report(exchange, session, params, None)

    async def warm_up(self) -> None:
        """Run a canned request's checks and conversions both ways once (nothing is sent, charged
        or reported; first, so that it never runs while a request waits for the provider), then
        get the provider ready ahead of the first request (importing its SDK, if it waits for
        that); a failure here is left for the first request to meet."""
        if not self._converted:
            self._converted = True
            try:
                convert_canned(self.settings)
            except Exception as exc:  # an optimisation only (a limit may refuse the canned request)
                log.debug("warming up the conversion failed", extra={"error": repr(exc)})
        if isinstance(self.provider, WarmsUp):
            try:
                await self.provider.warm_up()
            except Exception:
                log.debug("provider warm-up failed; the first request builds it again", exc_info=True)

    def _model(self, params: dict[str, Any]) -> str:
        return _model_for(params, self.settings)

    def preview(self, params: dict[str, Any]) -> SamplingPreview:
        """The model, token cap, tools and prompt this request would use; raises `SamplingError`
        when the request is invalid (it would be refused anyway)."""
        check_request(params, self.settings.limits)
        kwargs = to_claude_request(params, self.settings.conversion).kwargs
        model = self._model(params)
        messages = kwargs.get("messages") or []
        last = messages[-1]["content"] if messages else ""
        tools = [tool for tool in kwargs.get("tools", ()) if isinstance(tool, dict)]
        described = [f"{tool.get('name')}: {tool['description']}" for tool in tools if "description" in tool]
        system = kwargs.get("system")
        if isinstance(system, list):
            system = " ".join(b.get("text", "") for b in system if isinstance(b, dict) and b.get("text"))
        return SamplingPreview(
            model=model,
            max_tokens=int(kwargs.get("max_tokens", 0)),
            tools=tuple(str(tool.get("name")) for tool in tools),
            prompt=_shown_text(last),
            system=system if isinstance(system, str) else "",
            earlier=max(len(messages) - 1, 0),
            tool_text="\n".join(described),
        )

    async def _answer(
        self,
        params: dict[str, Any],
        exchange: AuditRecord,
        session: SamplingSession | None,
        progress: ProgressCallback | None,
        span: ChatSpan,
    ) -> dict[str, Any]:
        """Limits -> conversion -> budgets, rates and slots -> Claude (charged) -> limits -> MCP."""
        check_request(params, self.settings.limits)
        claude_request = to_claude_request(params, self.settings.conversion)
        model = self._model(params)
        exchange.model = model
        exchange.tools = len(claude_request.kwargs.get("tools", ()))
        span.request(model, claude_request.kwargs.get("max_tokens"))
        request = dict(claude_request.kwargs, model=model)
        first = reservation_for(request)
        async with self.spend.admit(session, first) as ticket:
            exchange.ticket = ticket
            with one_deadline():  # `--sampling-timeout` bounds the request, its continuations included
                message = await self._create(ticket, request, first, progress)
        self._note_answer(message, exchange)
        span.response(message)
        check_response(message, self.settings.limits)
        return to_mcp_result(message, claude_request, model=exchange.model)

    def _note_answer(self, message: dict[str, Any], exchange: AuditRecord) -> None:
        """What Claude reported for its answer; the result `_meta` gets all four usage counters."""
        usage = normalize_usage(message.get("usage"))
        message["usage"] = {**(message.get("usage") or {}), **usage}
        exchange.usage = usage
        reported = message.get("model")  # a gateway's may be any JSON
        exchange.model = reported if isinstance(reported, str) and reported else exchange.model
        exchange.stop_reason = message.get("stop_reason")
        exchange.claude_request_id = message.get("request_id")

    def _report(
        self,
        exchange: AuditRecord,
        session: SamplingSession | None,
        params: dict[str, Any],
        result: dict[str, Any] | None,
    ) -> None:
        charged = exchange.charged
        extra: dict[str, Any] = {
            "request_id": exchange.request_id,
            "session": exchange.session,
            "client": session.client if session is not None else None,
            "model": exchange.model,
            "tools": exchange.tools,
            "stop_reason": exchange.stop_reason,
            **(exchange.usage or {}),
            "charged_tokens": sum(charged.values()),
            "latency_ms": exchange.latency_ms,
        }
        if self.spend.budget.allowances:
            extra["budget_remaining"] = self.spend.budget.remaining
        if session is not None:
            client_budget = self.spend.client(session.client).budget
            if client_budget.allowances:
                extra["client_budget_remaining"] = client_budget.remaining
            if session.budget.allowances:
                extra["session_budget_remaining"] = session.budget.remaining
        outcome = exchange.outcome
        if exchange.error is not None:
            refused_credentials = exchange.error.get("status") in (401, 403)
            log.log(
                logging.ERROR if refused_credentials else logging.WARNING,
                f"sampling request {outcome.replace('_', ' ')}",
                extra={**extra, "code": exchange.error["code"], "error": exchange.error["message"]},
            )
        else:
            log.info(f"sampling request {outcome}", extra=extra)
        if self.audit is not None:
            self.audit.record(exchange, params, result)
        if self.observer is not None:
            self.observer.sampling_done(
                outcome=outcome,
                model=exchange.model or "?",
                latency=exchange.latency_ms / 1000 if exchange.calls else None,
                tokens=charged,
                client=session.client if session is not None else "",
            )

    async def _create(
        self,
        ticket: Ticket,
        request: dict[str, Any],
        reservation: Reservation,
        progress: ProgressCallback | None,
    ) -> dict[str, Any]:
        """One call (reserving `reservation`), and up to `MAX_PAUSE_CONTINUATIONS` more while Claude
        pauses its turn and the budgets have room; each call is charged on its own."""
        turn = None if progress is None else _TurnProgress(progress)
        message = await self._call(ticket, request, reservation, turn)
        for _ in range(MAX_PAUSE_CONTINUATIONS):
            if message.get("stop_reason") != "pause_turn":
                break
            if not await ticket.has_room():
                log.info("paused turn returned as it is: a token budget has no room for continuing it")
                break
            turn_so_far = _handed_back(message.get("content", []))
            history = [*request["messages"], {"role": "assistant", "content": turn_so_far}]
            follow_up_request = {**request, "messages": history}
            try:
                follow_up = await self._call(
                    ticket, follow_up_request, reservation_for(follow_up_request), turn, continuing=True
                )
            except _NotMade as refused:
                # The budget had room when checked and none when reserved (another request took
                # it): the paused turn, paid for, is the answer, as when there was no room at all.
                log.info(
                    "paused turn returned as it is: its continuation was refused",
                    extra={"error": refused.error.message},
                )
                break
            except SamplingError as failed:
                # Made, and failed (an API error after the retries, the deadline): charged as any
                # call, and the paused turn, paid for, is still the answer; the server may continue it.
                log.warning(
                    "paused turn returned as it is: its continuation failed",
                    extra={"code": failed.code, "error": failed.message},
                )
                if turn is not None:
                    turn.abandon_call()
                break
            message = _continue(message, follow_up)
        if turn is not None:
            await turn.finish()
        return message

    async def _call(
        self,
        ticket: Ticket,
        request: dict[str, Any],
        reservation: Reservation,
        progress: _TurnProgress | None,
        *,
        continuing: bool = False,
    ) -> dict[str, Any]:
        """One call; `continuing` a paused turn, a refusal of its reservation raises `_NotMade`."""
        made = False
        try:
            async with ticket.call(reservation) as charge:
                made = True
                if continuing and progress is not None:
                    progress.next_call()
                return await self.provider.create_message(request, on_progress=progress, meter=charge)
        except SamplingError as exc:
            if continuing and not made:
                raise _NotMade(exc) from exc
            raise


def _model_for(params: dict[str, Any], settings: SamplerSettings) -> str:
    return select_model(
        params.get("modelPreferences"),
        allowed=settings.allowed_models,
        default=settings.default_model,
        allow_upgrade=settings.allow_model_upgrade,
    )


def convert_canned(settings: SamplerSettings) -> dict[str, Any]:
    """What a request's checks and conversions make of `_WARM_UP_REQUEST` and `_WARM_UP_ANSWER`
    (the `CreateMessageResult`): the warm-up's run of them. Raises `SamplingError` where the
    operator's limits refuse the canned request."""
    params = _WARM_UP_REQUEST
    check_request(params, settings.limits)
    claude_request = to_claude_request(params, settings.conversion)
    model = _model_for(params, settings)
    reservation_for(dict(claude_request.kwargs, model=model))
    answer = dict(_WARM_UP_ANSWER, usage=normalize_usage(_WARM_UP_ANSWER["usage"]))
    check_response(answer, settings.limits)
    return to_mcp_result(answer, claude_request, model=model)


class _NotMade(Exception):
    """A continuation's call was refused before it was made (nothing of it was sent or charged)."""

    def __init__(self, error: SamplingError) -> None:
        super().__init__(error.message)
        self.error = error


class _TurnProgress:
    """Progress over every call one request makes. A provider marks `done` when its message is
    complete, but a paused turn may still be continued: each call's `done` is held back (passed on
    as plain progress), and `finish` passes on the last one, with the output tokens of every call,
    once no call follows. Reports carry their call's number, so the values keep adding up."""

    def __init__(self, progress: ProgressCallback) -> None:
        self._progress = progress
        self.call = 1
        self._done: StreamProgress | None = None
        self._held: StreamProgress | None = None  # the previous call's, while a continuation runs
        self._output_tokens: int | None = 0  # None once a call did not say

    async def __call__(self, report: StreamProgress) -> None:
        if report.done:
            self._done, total, more = report, self._output_tokens, report.output_tokens
            self._output_tokens = None if total is None or more is None else total + more
        await self._progress(replace(report, call=self.call, done=False, output_tokens=None))

    def next_call(self) -> None:
        """A continuation call starts: the previous call's message was not the end."""
        self.call += 1
        self._held, self._done = self._done, None

    def abandon_call(self) -> None:
        """The continuation call failed: the previous call's message is the end after all."""
        self._done = self._held

    async def finish(self) -> None:
        """The last call's message completed the answer."""
        if self._done is not None:
            await self._progress(replace(self._done, call=self.call, output_tokens=self._output_tokens))


def _chat_outcome(exchange: AuditRecord, error_type: str | None) -> ChatOutcome:
    """How the exchange's span ends; `error_type` is the API's error type when Claude failed, else
    the JSON-RPC error code (a refusal, a limit) stands for it."""
    if exchange.cancelled:
        return ChatOutcome(exchange.outcome, exchange.calls, "cancelled")
    if exchange.error is None:
        return ChatOutcome(exchange.outcome, exchange.calls)
    code, message = exchange.error["code"], exchange.error["message"]
    return ChatOutcome(exchange.outcome, exchange.calls, error_type or str(code), message)


def _provider_outcome(error: ProviderError) -> str:
    data = error.data if isinstance(error.data, Mapping) else {}
    return "timed_out" if data.get("gave_up") == "deadline" or data.get("type") == "timeout" else "failed"


def _handed_back(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A paused turn's content as the final assistant content of its continuation: the API refuses
    one whose last text block ends in whitespace (400), so that text is stripped (a block of only
    whitespace is left out). The answer keeps the text as Claude wrote it."""
    if not content or content[-1].get("type") != "text":
        return content
    text = str(content[-1].get("text", "")).rstrip()
    return [*content[:-1], {**content[-1], "text": text}] if text else content[:-1]


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


def _exchange(request_id: Any, session: SamplingSession | None) -> AuditRecord:
    if session is None:
        return AuditRecord(request_id=request_id, session=None)
    return AuditRecord(request_id=request_id, session=session.label, client=session.client)
