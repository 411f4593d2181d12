"""Backends that turn a Claude Messages API request into a Claude message."""

from __future__ import annotations

from mcp_backfill.config import Config
from mcp_backfill.providers.base import Provider


def make_provider(config: Config) -> Provider:
    """The provider `--provider` names, configured from `config`."""
    if config.provider == "mock":
        from mcp_backfill.providers.mock import MockProvider

        return MockProvider()
    from mcp_backfill.providers.anthropic import AnthropicProvider

    if config.api_key is None:  # Config refuses this already; kept for the type checker
        raise ValueError("ANTHROPIC_API_KEY is required by the anthropic provider")
    return AnthropicProvider(config.api_key.value, base_url=config.api_base_url)
