"""The official MCP conformance suite (server scenarios), run directly (no proxy) against npm's
server-everything in streamableHttp mode and against tests/servers/conformance_server.py, which
implements the suite's test_* features so that tools-call-sampling and friends mean something.
These are the baselines the sidecar comparison (test_conformance_sidecar.py) is measured against.
Results are written to results/conformance/ (git-ignored)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.conformance import (
    ConformanceUnavailable,
    conformance_server_http,
    everything_http,
    expected_failures_file,
    list_server_scenarios,
    node_executable,
    record,
    run_suite,
)

pytestmark = [pytest.mark.anyio, pytest.mark.npm]


@pytest.fixture
def suite_available() -> None:
    try:
        node_executable()
    except ConformanceUnavailable as exc:
        if os.environ.get("MCP_BACKFILL_TEST_REQUIRE_NPM"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def expected_failures(name: str) -> set[str]:
    listed = yaml.safe_load(expected_failures_file(name).read_text())["server"]
    return set(listed)


@pytest.mark.usefixtures("suite_available")
async def test_suite_lists_the_server_scenarios_it_runs() -> None:
    scenarios = await list_server_scenarios()
    assert len(scenarios) == len(set(scenarios)) == 32  # conformance 0.1.16, --suite all
    for name in ("server-initialize", "tools-call-sampling", "dns-rebinding-protection"):
        assert name in scenarios


@pytest.mark.usefixtures("suite_available")
async def test_server_everything_direct_baseline(tmp_path: Path) -> None:
    baseline = expected_failures_file("server-everything")
    async with everything_http() as upstream:
        run = await run_suite(upstream.url, tmp_path, expected_failures=baseline)
    record("server-everything-direct", run)
    print(run.report())
    assert run.failed == expected_failures("server-everything"), run.report()
    assert len(run.passed) == 11
    # The suite agrees with our reading of its files: with the baseline it exits 0 only when the
    # failures are exactly the listed ones (a listed scenario that passes is an error too).
    assert run.exit_code == 0, run.output[-3000:]


@pytest.mark.usefixtures("suite_available")
async def test_conformance_server_direct_baseline(tmp_path: Path) -> None:
    baseline = expected_failures_file("conformance-server")
    async with conformance_server_http() as upstream:
        run = await run_suite(upstream.url, tmp_path, expected_failures=baseline)
    record("conformance-server-direct", run)
    print(run.report())
    assert run.failed == expected_failures("conformance-server"), run.report()
    # The scenarios the sidecar comparison leans on really pass here.
    assert {"tools-call-sampling", "tools-call-elicitation", "dns-rebinding-protection"} <= run.passed
    assert run.exit_code == 0, run.output[-3000:]
