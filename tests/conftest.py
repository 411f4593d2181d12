"""Shared fixtures: the anyio backend, the fake Claude API and npm's server-everything."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fake_claude import FakeClaude
from tests.harness import ROOT, TEST_API_KEY


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake_claude() -> Iterator[FakeClaude]:
    """A fresh fake Messages API on a random loopback port that accepts only the test key."""
    with FakeClaude(api_key=TEST_API_KEY) as fake:
        yield fake


EVERYTHING = ROOT / "tests" / "npm" / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture
def everything() -> str:
    """The server-everything command (add its transport: `stdio` or `streamableHttp`). Skipped when
    scripts/setup --npm has not run, unless MCP_BACKFILL_TEST_REQUIRE_NPM makes that a failure."""
    if not EVERYTHING.exists():
        message = "npm peers not installed: run scripts/setup --npm"
        if os.environ.get("MCP_BACKFILL_TEST_REQUIRE_NPM"):
            pytest.fail(message)
        pytest.skip(message)
    return str(EVERYTHING)
