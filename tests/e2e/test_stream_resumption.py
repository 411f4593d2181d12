"""Resuming the SSE streams of `mcp-backfill serve`: what a session keeps for its clients to resume,
and what a live reader gets."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_sidecar import wait_until
from tests.harness import proxy_env
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    Sidecar,
    open_session,
    response_to,
    run_sidecar,
    sse_messages,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# A stdio upstream that answers `hold` requests only when `release` names them (`loud`: a log
# message first); `held` answers how many it holds.
HOLDING_SERVER = r"""
import json, sys
held = {}
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    method, params = m["method"], m.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": params["protocolVersion"],
              "capabilities": {}, "serverInfo": {"name": "holding", "version": "0"}}})
    elif method == "hold":
        if params.get("loud"):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": "held"}})
        held[json.dumps(m["id"])] = m["id"]
    elif method == "held":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"held": len(held)}})
    elif method == "release":
        for request_id in params["ids"]:
            send({"jsonrpc": "2.0", "id": held.pop(json.dumps(request_id)), "result": {"released": True}})
        send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
"""


async def _post(http: httpx2.AsyncClient, url: str, body: Any, headers: dict[str, str]) -> None:
    await http.post(url, json=body, headers=headers)


def _closed_at_least(sidecar: Sidecar, count: int) -> bool:
    return sidecar.stderr().count("client closed a POST") >= count


def _rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


async def test_posts_left_during_the_json_window_do_not_crowd_out_a_stream_to_resume() -> None:
    """A session keeps its last 8 finished POST streams for their clients to resume. A POST whose
    client left while its answer was awaited as JSON (no event of it, no id, was ever sent) cannot
    be resumed, yet it counted among them: eight such answers coming after the answer of a dropped
    SSE stream pushed that one out, and its resumption got 400."""
    options = ("--provider", "mock", "--log-level", "debug")
    upstream = [sys.executable, "-c", HOLDING_SERVER]
    async with (
        run_sidecar(*options, upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}

        async def held() -> int:
            answer = await http.post(sidecar.url, json=_rpc("count", "held"), headers=headers)
            return int(response_to(answer, "count")["result"]["held"])

        loud = _rpc(1, "hold", {"loud": True})
        async with http.stream("POST", sidecar.url, json=loud, headers=headers) as sse:
            seen = ""
            async for chunk in sse.aiter_text():  # until its log message has come, with an id
                seen += chunk
                if "held" in seen and seen.endswith("\n\n"):
                    break
        [(last_id, _)] = sse_messages(seen)
        assert last_id is not None
        for n in range(2, 10):  # eight POSTs whose clients leave before their answers
            async with anyio.create_task_group() as tg:
                tg.start_soon(_post, http, sidecar.url, _rpc(n, "hold"), headers)
                while await held() < n:
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()  # the client leaves
            await wait_until(partial(_closed_at_least, sidecar, n))  # request 1's stream, and these
        await http.post(sidecar.url, json=_rpc("r1", "release", {"ids": [1]}), headers=headers)
        rest = _rpc("r2", "release", {"ids": list(range(2, 10))})
        await http.post(sidecar.url, json=rest, headers=headers)
        resumed = await http.get(sidecar.url, headers={**headers, "last-event-id": last_id})
    assert resumed.status_code == 200, resumed.text
    assert [m.get("id") for _, m in sse_messages(resumed.text)] == [1]
