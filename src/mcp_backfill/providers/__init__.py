"""Backends that turn a Claude Messages API request into a Claude message."""

from __future__ import annotations

from mcp_backfill.config import Config
from mcp_backfill.providers.lazy import LazyProvider
from mcp_backfill.providers.retry import RetryingProvider, RetryPolicy
from mcp_backfill.sampling.provider import Provider


def retry_policy(config: Config) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=config.retry_max_attempts,
        base_delay=config.retry_base_delay,
        max_delay=config.retry_max_delay,
        deadline=config.sampling_timeout or None,
    )


def make_provider(config: Config) -> Provider:
    """The provider `--provider` names, configured from `config`, retrying by `config`'s policy.

    Raises `ConfigError` when the provider cannot be set up (a missing extra, no region...).
    """
    if config.provider == "mock":
        from mcp_backfill.providers.mock import MockProvider

        return MockProvider()

    def build() -> Provider:
        from mcp_backfill.providers.anthropic import AnthropicProvider
        from mcp_backfill.providers.platforms import bedrock_model_id, make_client, vertex_model_id

        model_ids = {"bedrock": bedrock_model_id, "vertex": vertex_model_id}
        provider = AnthropicProvider(
            make_client(config),
            name=config.provider,
            model_id=model_ids.get(config.provider, str),
            secrets=config.secrets(),
        )
        return RetryingProvider(provider, retry_policy(config))

    # Bedrock and Vertex are built at once: their clients check regions and credentials, and a
    # mistake there must stop the proxy at startup. The Claude API client cannot fail to build; it
    # is built on the first sampling request, outside that request's --sampling-timeout (the
    # deadline bounds calls to Claude, not the proxy's one-time import of the SDK).
    return LazyProvider(config.provider, build) if config.provider == "anthropic" else build()
