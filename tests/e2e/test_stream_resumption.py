"""Resuming the SSE streams of `mcp-backfill serve`: what a session keeps for its clients to resume,
and what a live reader gets."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
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
# message first; `release`'s `pad`: that many bytes more in each answer); `held` answers how many it
# holds; `burst` sends `count` progress notifications of `size` bytes (`progress` 0, 1...), then
# answers.
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
    elif method == "burst":
        token = params["_meta"]["progressToken"]
        for seq in range(params["count"]):
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": seq, "message": "x" * params["size"]}})
        send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
    elif method == "held":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"held": len(held)}})
    elif method == "release":
        for request_id in params["ids"]:
            result = {"released": True, **({"pad": "x" * params["pad"]} if params.get("pad") else {})}
            send({"jsonrpc": "2.0", "id": held.pop(json.dumps(request_id)), "result": result})
        send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
"""
HOLDING = [sys.executable, "-c", HOLDING_SERVER]


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


MIB = 1024 * 1024


def _burst(request_id: Any, count: int, size: int) -> dict[str, Any]:
    meta = {"progressToken": f"burst-{request_id}"}
    return _rpc(request_id, "burst", {"count": count, "size": size, "_meta": meta})


def _summary(text: str) -> list[Any]:
    """The `progress` of each notification and the id of each answer, in order."""
    return [m["params"]["progress"] if "method" in m else m["id"] for _, m in sse_messages(text)]


async def test_a_live_reader_that_stops_a_moment_gets_a_burst_larger_than_a_stream_keeps() -> None:
    """A stream keeps 8 MiB for replay: a burst of 12 MiB for a request whose client stopped reading
    for a second lost its first messages before the response could write them."""
    async with (
        run_sidecar("--provider", "mock", upstream=HOLDING, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        async with http.stream("POST", sidecar.url, json=_burst(1, 32, MIB), headers=headers) as slow:
            chunks = slow.aiter_bytes()
            read = [await chunks.__anext__()]
            await anyio.sleep(1)  # well within the 10 s a stopped reader is waited for
            read += [chunk async for chunk in chunks]
    assert _summary(b"".join(read).decode()) == [*range(32), 1]


async def test_a_slow_live_reader_keeps_its_answer_while_other_streams_fill_the_session() -> None:
    """A session keeps 32 MiB for replay, its oldest events going first: those a live but slow
    reader had yet to get went too, its answer with them, while other requests of the session moved
    35 MiB. The reader now gets every event (the other requests wait for it meanwhile)."""
    async with (
        run_sidecar(
            "--provider", "mock", upstream=[sys.executable, "-c", HOLDING_SERVER], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        others_done = anyio.Event()
        others: list[Any] = []

        async def other_requests() -> None:
            for n in range(2, 9):  # seven streams of 5 MiB, each read whole
                big = _burst(n, 1, 5 * MIB)
                others.append(response_to(await http.post(sidecar.url, json=big, headers=headers), n)["id"])
            others_done.set()

        async with http.stream("POST", sidecar.url, json=_burst(1, 12, MIB), headers=headers) as slow:
            chunks = slow.aiter_bytes()
            read = [await chunks.__anext__()]  # it reads a little, then stops for a while
            async with anyio.create_task_group() as tg:
                tg.start_soon(other_requests)
                with anyio.move_on_after(3):  # well within the 10 s a stopped reader is waited for
                    await others_done.wait()
                read += [chunk async for chunk in chunks]
    assert others == list(range(2, 9))
    assert _summary(b"".join(read).decode()) == [*range(12), 1]


# Put first on a sidecar's PYTHONPATH: `httptools` is not installed there, and uvicorn's h11
# protocol is the one under the sidecar (the stand-in says on stderr that it was asked for).
NO_HTTPTOOLS = 'import sys; sys.stderr.write("httptools: not installed\\n"); raise ImportError("httptools")\n'


def _parser_env(parser: str, tmp_path: Path) -> dict[str, str]:
    if parser == "httptools":
        return proxy_env()
    (tmp_path / "httptools.py").write_text(NO_HTTPTOOLS)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return proxy_env(PYTHONPATH=path)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_post_stream_cut_off_while_its_answer_was_written_stays_resumable(
    parser: str, tmp_path: Path
) -> None:
    """A POST's SSE stream whose client went away while its (large) answer was being written counted
    as delivered whole, as if the client had read it: it was the first finished stream a session
    let go, and once eight other requests had finished its client's resumption got 400, its answer
    lost. A response cut off before its end delivers nothing for sure: the stream stays resumable.
    So too over uvicorn's h11 protocol (where `httptools` is not installed), which did not say a
    response had been cut off: there the stream still counted as read whole."""
    options = ("--provider", "mock", "--log-level", "debug")
    async with (
        run_sidecar(*options, upstream=HOLDING, env=_parser_env(parser, tmp_path)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        loud = _rpc(1, "hold", {"loud": True})
        async with http.stream("POST", sidecar.url, json=loud, headers=headers) as sse:
            chunks = sse.aiter_text()
            seen = ""
            while not ("held" in seen and seen.endswith("\n\n")):  # its log message, with an id
                seen += await chunks.__anext__()
            release = _rpc("r1", "release", {"ids": [1], "pad": 24 * MIB})  # more than sockets hold
            await http.post(sidecar.url, json=release, headers=headers)
            head = await chunks.__anext__()  # the answer is being written...
            assert '"id":1' not in head or not head.endswith("\n\n")
        # ... and the client leaves before the end of it, which it never gets
        await wait_until(partial(_closed_at_least, sidecar, 1))
        [(last_id, _)] = sse_messages(seen)
        assert last_id is not None
        for n in range(2, 10):  # eight other requests, their streams read whole
            answer = await http.post(sidecar.url, json=_burst(n, 1, 10), headers=headers)
            assert response_to(answer, n)["result"] == {}
        resumed = await http.get(sidecar.url, headers={**headers, "last-event-id": last_id})
    assert ("httptools: not installed" in sidecar.stderr()) == (parser == "h11")
    assert resumed.status_code == 200, resumed.text[:500]
    [(_, answer)] = sse_messages(resumed.text)
    assert answer["id"] == 1
    assert len(answer["result"]["pad"]) == 24 * MIB


async def test_a_stream_resumed_from_an_earlier_event_is_kept_while_its_reader_gets_it() -> None:
    """A client may resume a stream from an earlier event than the last one written to it (it
    read the rest, or the rest went into a connection it then lost, unread). The stream still
    counted as read whole: while the resumption was being written, eight other requests finishing
    made the session let it go, and when the resumption too broke off the next one got 400."""
    async with (
        run_sidecar("--provider", "mock", upstream=HOLDING, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        loud = _rpc(1, "hold", {"loud": True})
        async with http.stream("POST", sidecar.url, json=loud, headers=headers) as sse:
            chunks = sse.aiter_text()
            seen = ""
            while not ("held" in seen and seen.endswith("\n\n")):  # its log message, with an id
                seen += await chunks.__anext__()
            release = _rpc("r1", "release", {"ids": [1], "pad": 24 * MIB})  # more than sockets hold
            await http.post(sidecar.url, json=release, headers=headers)
            seen += "".join([chunk async for chunk in chunks])  # read whole
        [(last_id, _), (_, answer)] = sse_messages(seen)
        assert last_id is not None
        assert answer["id"] == 1
        resume = {**headers, "last-event-id": last_id}
        async with http.stream("GET", sidecar.url, headers=resume) as again:
            assert again.status_code == 200
            reading = again.aiter_bytes()  # (kept: an iterator let go closes the connection)
            await reading.__anext__()  # the answer is being written again...
            for n in range(2, 10):  # ... while eight other requests finish
                reply = await http.post(sidecar.url, json=_burst(n, 1, 10), headers=headers)
                assert response_to(reply, n)["result"] == {}
        # ... and the client leaves before its end
        resumed = await http.get(sidecar.url, headers=resume)
    assert resumed.status_code == 200, resumed.text[:500]
    [(_, answer)] = sse_messages(resumed.text)
    assert answer["id"] == 1
    assert len(answer["result"]["pad"]) == 24 * MIB


async def test_a_2026_client_reading_slowly_does_not_hold_up_another_clients_answer() -> None:
    """Clients without a token of their own share one 2026-07-28 upstream and relay. A burst for a
    request whose client read slowly held that relay up, every other client's answer with it, until
    the slow one read or was taken to have stopped (10 s, after which it lost its oldest messages).
    A hub holds what a slow reader has yet to read, up to half of what it may hold in all, and
    the other clients are answered meanwhile."""
    from tests.e2e.test_sidecar_stateless import stateless_headers, stateless_request

    async with (
        run_sidecar("--provider", "mock", upstream=HOLDING, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        burst = stateless_request("a", "burst", {"count": 600, "size": 20_000})
        burst["params"]["_meta"]["progressToken"] = "a"
        async with http.stream("POST", sidecar.url, json=burst, headers=stateless_headers("burst")) as slow:
            chunks = slow.aiter_bytes()
            read = [await chunks.__anext__()]  # it reads a little, then stops until the other is answered
            with anyio.fail_after(HTTP_TIMEOUT):
                other = await http.post(
                    sidecar.url, json=stateless_request("b", "held"), headers=stateless_headers("held")
                )
            stalled = "no longer waited for" in sidecar.stderr()  # the slow reader given up on first
            read += [chunk async for chunk in chunks]
    assert response_to(other, "b")["result"] == {"held": 0}
    assert not stalled
    assert _summary(b"".join(read).decode()) == [*range(600), "a"]
