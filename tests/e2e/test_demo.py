"""The README demo end to end: example client -> real proxy (mock provider) -> weather example."""

from __future__ import annotations

from tests.harness import run_example


def test_demo_runs_both_eras_through_the_proxy() -> None:
    done = run_example("demo_client.py")
    assert done.returncode == 0, done.stderr[-3000:]
    without, _, out = done.stdout.partition("With mcp-backfill in between:")
    # First the server alone: a client that cannot sample cannot use its sampling tool...
    assert "Without mcp-backfill:" in without
    assert "summarize FAILED" in without
    assert "Sampling not supported" in without
    # ...then the same calls through the proxy work.
    assert "(protocol 2025-11-25)" in out
    assert "(protocol 2026-07-28)" in out
    for tool in ("weather_assistant", "summarize", "packing_advice"):
        assert f"{tool} -> client:" in out
        assert f"{tool} FAILED" not in out
    assert "tool results: get_weather" in out.split("packing_advice -> client:")[1]
