"""The domain settings as the proxy builds them from a `Config` with every option at its default.

Tests that need other values derive them with `dataclasses.replace`, so no default is restated here.
"""

from __future__ import annotations

from mcp_backfill import assembly
from mcp_backfill.config import Config

CONFIG = Config(upstream_command=("server",), provider="mock")
CONVERSION = assembly.conversion_options(CONFIG)
LIMITS = assembly.request_limits(CONFIG)
SPEND = assembly.spend_settings(CONFIG)
RETRY = assembly.retry_policy(CONFIG)
