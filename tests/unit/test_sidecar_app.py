"""The sidecar's ASGI application as a whole: what it counts in `/metrics`."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_backfill.sidecar.app import SidecarApp
from mcp_backfill.sidecar.handshake import HandshakeFront
from mcp_backfill.sidecar.http_io import FrontSettings
from mcp_backfill.sidecar.metrics import Metrics
from mcp_backfill.sidecar.security import AccessPolicy
from mcp_backfill.sidecar.sessions import SessionSettings, SessionTable
from mcp_backfill.sidecar.stateless import StatelessFront, StatelessHubs

pytestmark = pytest.mark.anyio


def _unused(*args: Any) -> Any:
    raise AssertionError("no upstream is opened here")


def sidecar_app(readiness: Any) -> tuple[SidecarApp, Metrics]:
    settings = FrontSettings(1024)
    sessions = SessionTable(1, SessionSettings(0, 1), _unused, _unused, lambda direction: None)
    hubs = StatelessHubs(_unused, max_upstreams=1, idle_timeout=0)
    metrics = Metrics()
    policy = AccessPolicy(allowed_hosts=("127.0.0.1:8080",), allowed_origins=())
    app = SidecarApp(
        policy, HandshakeFront(sessions, settings), StatelessFront(hubs, settings), metrics, readiness
    )
    return app, metrics


async def test_a_request_that_fails_inside_the_sidecar_counts_as_a_500_not_as_a_client_gone() -> None:
    """An exception out of a handler (uvicorn answers it with a 500) was counted as status 499, "the
    client went away", so the 5xx alert of deploy/observability never saw the sidecar's own failures."""

    async def broken() -> tuple[bool, dict[str, Any]]:
        raise RuntimeError("the store's client broke")

    app, metrics = sidecar_app(broken)
    scope = {"type": "http", "method": "GET", "path": "/readyz", "headers": [(b"host", b"127.0.0.1:8080")]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        raise AssertionError(f"nothing is sent before the failure: {message}")

    with pytest.raises(RuntimeError):
        await app(scope, receive, send)
    assert 'mcp_backfill_http_requests_total{method="GET",status="500"} 1' in metrics.render()
