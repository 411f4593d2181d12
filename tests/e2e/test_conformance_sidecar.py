"""The official MCP conformance suite through the sidecar (`mcp-backfill serve --upstream-url`) versus
directly against the same upstream: every scenario that passes directly must pass through the proxy.

The suite's client declares `sampling`, so in the default fallback mode the proxy forwards the
upstream's sampling requests to it: `tools-call-sampling` must pass through the sidecar (against
tests/servers/conformance_server.py, whose `test_sampling` tool really samples; server-everything has
no such tool and fails it directly too). `dns-rebinding-protection` judges the sidecar's own HTTP
front, so it must pass through the sidecar even where the upstream fails it (server-everything).
Both runs are written to results/conformance/ (git-ignored), with the comparison.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from tests.conformance import (
    RESULTS,
    ConformanceUnavailable,
    conformance_server_http,
    everything_http,
    node_executable,
    record,
    run_suite,
)
from tests.harness import HttpServer, proxy_env
from tests.sidecar_harness import run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.npm]

UPSTREAMS: dict[str, Callable[[], AbstractAsyncContextManager[HttpServer]]] = {
    "server-everything": everything_http,
    "conformance-server": conformance_server_http,
}


@pytest.fixture
def suite_available() -> None:
    try:
        node_executable()
    except ConformanceUnavailable as exc:
        if os.environ.get("MCP_BACKFILL_TEST_REQUIRE_NPM"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.mark.usefixtures("suite_available")
@pytest.mark.parametrize("upstream_name", list(UPSTREAMS))
async def test_every_scenario_that_passes_directly_passes_through_the_sidecar(
    upstream_name: str, tmp_path: Path
) -> None:
    async with UPSTREAMS[upstream_name]() as upstream:
        direct = await run_suite(upstream.url, tmp_path / "direct")
        # The suite sends no credentials, and the sidecar stays on loopback, where no token is needed.
        env = proxy_env(MCP_BACKFILL_PROVIDER="mock")
        async with run_sidecar("--upstream-url", upstream.url, env=env) as sidecar:
            proxied = await run_suite(sidecar.url, tmp_path / "sidecar")
            sidecar_log = sidecar.stderr()
    record(f"{upstream_name}-direct", direct)
    record(f"{upstream_name}-sidecar", proxied)
    regressions = {name: proxied.scenarios[name].reason() for name in sorted(direct.passed - proxied.passed)}
    improvements = sorted(proxied.passed - direct.passed)
    (RESULTS / f"{upstream_name}-comparison.json").write_text(
        json.dumps(
            {
                "direct": f"{len(direct.passed)}/{len(direct.scenarios)}",
                "sidecar": f"{len(proxied.passed)}/{len(proxied.scenarios)}",
                "regressions": regressions,
                "improvements": improvements,
            },
            indent=2,
        )
        + "\n"
    )
    print(direct.report())
    print(proxied.report())
    assert direct.passed, direct.output[-3000:]  # a baseline that passes nothing proves nothing
    assert not regressions, f"{regressions}\n--- sidecar log ---\n{sidecar_log[-5000:]}"
    assert "dns-rebinding-protection" in proxied.passed, proxied.scenarios[
        "dns-rebinding-protection"
    ].reason()
    if upstream_name == "conformance-server":
        assert "tools-call-sampling" in direct.passed
        assert "tools-call-sampling" in proxied.passed
