"""Backends that turn a Claude Messages API request into a Claude message."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcp_backfill.logs import get_logger
from mcp_backfill.providers.lazy import LazyProvider
from mcp_backfill.providers.retry import RetryingProvider, RetryPolicy
from mcp_backfill.sampling.provider import AttemptObserver, Provider

if TYPE_CHECKING:
    from mcp_backfill.providers.anthropic import AnthropicProvider

log = get_logger("provider")


@dataclass(frozen=True)
class ProviderSettings:
    """What building a provider takes (`assembly` fills it in from `Config`)."""

    name: str
    """anthropic, bedrock, vertex or mock."""
    retry: RetryPolicy
    secrets: tuple[str, ...] = field(repr=False)
    """Every secret value, kept out of the provider's error messages."""
    api_key: str | None = field(repr=False)
    """The Claude API key (anthropic)."""
    base_url: str | None
    """A gateway in front of the Claude API (anthropic); None: the SDK's default."""
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    """Extra HTTP headers on every API call."""
    vertex_access_token: str | None = field(repr=False)
    """A ready OAuth token (vertex); None: Application Default Credentials."""
    bedrock_api_key: str | None = field(default=None, repr=False)
    """A Bedrock API key (`AWS_BEARER_TOKEN_BEDROCK` or its `_FILE`); None: SigV4."""


def make_provider(settings: ProviderSettings, attempts: AttemptObserver | None = None) -> Provider:
    """The provider `settings.name` names, retrying by `settings.retry`; `attempts` hears how each
    attempt at a Claude call ended.

    Raises `ConfigError` when the provider cannot be set up (a missing extra, no region...).
    """
    if settings.name == "mock":
        from mcp_backfill.providers.mock import MockProvider

        return MockProvider()

    built: list[AnthropicProvider] = []  # the one inside the retrying wrapper, once built
    connect_ahead: list[Callable[[], Awaitable[int]]] = []  # its client's, once built

    def build() -> Provider:
        from mcp_backfill.providers.anthropic import AnthropicProvider, prime_sdk, settle_client
        from mcp_backfill.providers.platforms import (
            api_http_client,
            bedrock_model_id,
            make_client,
            open_api_connection,
            vertex_model_id,
        )

        if settings.name == "anthropic":
            try:
                prime_sdk()  # in the lazy build's worker thread, so never on the event loop
            except Exception as exc:  # an optimisation only: the first request then pays for it
                log.debug("priming the anthropic SDK failed", extra={"error": repr(exc)})

        model_ids = {"bedrock": bedrock_model_id, "vertex": vertex_model_id}
        http = api_http_client()
        client = make_client(settings, http_client=http)
        settle_client(client)
        connect_ahead.append(functools.partial(open_api_connection, http, str(client.base_url)))
        provider = AnthropicProvider(
            client,
            name=settings.name,
            model_id=model_ids.get(settings.name, str),
            secrets=settings.secrets,
        )
        built.append(provider)
        return RetryingProvider(provider, settings.retry, observer=attempts)

    async def prime() -> None:
        await built[0].prime()

    async def connect() -> int:
        return await connect_ahead[0]()

    # Bedrock and Vertex are built at once: their clients check regions and credentials, and a
    # mistake there must stop the proxy at startup. The Claude API client fails to build only on
    # proxy variables httpx2 cannot use (every sampling request is then told which); it is built on
    # the first sampling request, outside that request's --sampling-timeout (the
    # deadline bounds calls to Claude, not the proxy's one-time import of the SDK). All three
    # connect to their API in the warm-up.
    if settings.name == "anthropic":
        return LazyProvider(settings.name, build, prime, connect)
    return LazyProvider.built(build(), connect)
