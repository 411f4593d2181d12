"""The provider interface: Claude-shaped request in, Claude-shaped message out.

Keeping both sides in the Messages API's own JSON shape means conversion from and to MCP happens
in exactly one place (`sampling.convert`), whatever the backend.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class StreamProgress:
    """How far the current attempt at a message has got, reported while Claude streams.

    `characters` counts generated text, tool-input JSON and thinking characters of this attempt
    (it starts again at 0 when a failed attempt is retried). `done` marks the complete message;
    `output_tokens` is known only then.
    """

    characters: int
    attempt: int = 1
    done: bool = False
    output_tokens: int | None = None
    call: int = 1
    """Which Claude call of the request (a continued `pause_turn` is another); the sampler sets it."""


ProgressCallback = Callable[[StreamProgress], Awaitable[None]]
"""Called by a provider while a message streams; must be cheap (the stream waits for it)."""


class UsageMeter(Protocol):
    """Told what each attempt at a message may cost, as the provider learns it (see `spend.Charge`).

    A provider calls `begin_attempt()` before it sends each request to Claude (a retry, or a
    continued `pause_turn`, is another attempt), then `report()` with the attempt's usage so far,
    cumulative, whenever the API reports it (Claude's `message_start` and `message_delta` events),
    with `final=True` once the message is complete. `not_billed()` says the attempt certainly cost
    nothing: the API answered it with an HTTP error status or a redirect. `not_sent()` says more:
    the request never left this machine (the connection could not be made, the client refused it
    first), so Claude was not called at all; a call none of whose attempts was sent is no call in
    the reports (the audit log's `calls`). An attempt about which nothing was said may have been
    billed in full. `may_retry()` is asked before a retry: False when the budgets have no room for
    another attempt (the retry is then not made).
    """

    def begin_attempt(self) -> None: ...

    async def may_retry(self) -> bool: ...

    def report(self, usage: Mapping[str, int], *, final: bool = False) -> None: ...

    def not_billed(self) -> None: ...

    def not_sent(self) -> None: ...


class AttemptObserver(Protocol):
    """Told how each attempt at a Claude call ended (for metrics): `outcome` is ok, retried (it
    failed and another attempt follows), failed (the call gives up) or cancelled (the request was
    cancelled while it ran); `error_type` is the API's error type (e.g. overloaded_error,
    rate_limit_error, timeout) when it failed."""

    def attempt_done(self, *, provider: str, outcome: str, error_type: str | None) -> None: ...


class Provider(Protocol):
    """A backend able to answer one Messages API request.

    `request` holds the keyword arguments of `messages.create` (`model`, `max_tokens`, `messages`,
    and optionally `system`, `tools`, `tool_choice`, `stop_sequences`, `metadata`). The return
    value is the final message as JSON (`id`, `type`, `role`, `model`, `content`, `stop_reason`,
    `stop_sequence`, `usage`, optionally `stop_details` and `request_id`). Failures raise
    `SamplingError` (`ProviderError` for API failures). `on_progress`, when given, is awaited as
    the message streams; `meter`, when given, hears what every attempt may cost. Cancelling the
    calling task must abort the underlying call promptly.
    """

    name: str

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class WarmsUp(Protocol):
    """A provider that builds itself on first use, and can be told to do so ahead of it."""

    async def warm_up(self) -> None: ...


@dataclass
class SharedDeadline:
    """The deadline (`--sampling-timeout`) of one sampling request, however many Claude calls it
    makes: set by its first call (its provider's clock), kept by the calls after it (a paused
    turn's continuations), which get what is left of it."""

    at: float | None = None


_shared_deadline: ContextVar[SharedDeadline | None] = ContextVar("mcp_backfill_deadline", default=None)


@contextmanager
def one_deadline() -> Iterator[None]:
    """The Claude calls made inside (in this task) share one deadline (`SharedDeadline`)."""
    token = _shared_deadline.set(SharedDeadline())
    try:
        yield
    finally:
        _shared_deadline.reset(token)


def shared_deadline() -> SharedDeadline | None:
    """The deadline the current sampling request's calls share, if one is open (`one_deadline`)."""
    return _shared_deadline.get()
