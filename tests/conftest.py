"""Shared fixtures: the anyio backend and the fake Claude API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_claude import FakeClaude
from tests.harness import TEST_API_KEY


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake_claude() -> Iterator[FakeClaude]:
    """A fresh fake Messages API on a random loopback port that accepts only the test key."""
    with FakeClaude(api_key=TEST_API_KEY) as fake:
        yield fake
