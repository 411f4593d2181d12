"""A bounded soak: 2 000 sampling requests through one proxy process while the fake Claude API
injects random (seeded) faults. Every request gets exactly one answer, and memory stays flat."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.e2e.faults_support import PLAIN_PARAMS, echo_session, rss_kib
from tests.fake_claude import FakeClaude, random_faults

pytestmark = pytest.mark.anyio

BATCHES = 10
PER_BATCH = 200
WEIGHTS = {
    "ok": 70.0,
    "529": 8.0,
    "500": 3.0,
    "429": 3.0,
    "overloaded": 5.0,
    "garbage": 3.0,
    "truncated": 3.0,
    "dropped": 3.0,
    "400": 2.0,
}


async def test_soak_with_random_faults(fake_claude: FakeClaude) -> None:
    fake_claude.fallback = random_faults(seed=5, weights=WEIGHTS)
    options = (
        "--log-level",
        "warning",
        "--retry-max-attempts",
        "3",
        "--retry-base-delay",
        "0.001",
        "--retry-max-delay",
        "0.005",
        # The spending guards would (rightly) refuse a burst of 2 000 requests; this test is about faults.
        "--rate-limit",
        "0",
        "--session-budget-tokens",
        "0",
    )
    outcomes: Counter[str] = Counter()
    rss: list[int] = []
    async with echo_session(fake_claude, *options) as session:
        for batch in range(BATCHES):
            params = {"count": PER_BATCH, "window": 8, "params": PLAIN_PARAMS}
            request = {
                "jsonrpc": "2.0",
                "id": f"batch-{batch}",
                "method": "test/sample_many",
                "params": params,
            }
            await session.send(request)
            response, seen = await session.recv_until(
                lambda m, b=batch: m.get("id") == f"batch-{b}", timeout=120
            )
            # Anything else the server said would be a duplicate or stray answer (announced by the echo).
            stray: list[Any] = [m for m in seen if "unsolicited_response" in str(m)]
            assert stray == []
            summary = response["result"]
            assert summary["results"] + sum(summary["errors"].values()) == PER_BATCH
            outcomes["result"] += summary["results"]
            outcomes.update({f"error {code}": n for code, n in summary["errors"].items()})
            rss.append(rss_kib(session.process.pid))
        ping = await session.request("after", "ping")
    assert "result" in ping
    assert sum(outcomes.values()) == BATCHES * PER_BATCH
    assert set(outcomes) <= {"result", "error -32603", "error -32602"}
    # Most requests succeed thanks to retries; some fail for good (400s, or three faults in a row).
    assert outcomes["result"] > 0.85 * BATCHES * PER_BATCH
    assert outcomes["error -32602"] > 0
    attempts = len(fake_claude.message_requests)
    assert attempts > BATCHES * PER_BATCH  # faults were retried
    warm, end = rss[1], rss[-1]
    assert end - warm < 20 * 1024, rss  # KiB: flat after warm-up, with a generous bound
