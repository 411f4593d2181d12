"""6. Adversarial load: one well-behaved client beside hostile clients and a hostile upstream.

The attack runs in a process of its own, so that its CPU and GIL are not the measuring client's.
One `mcp-backfill serve` (two named clients, `good` and `hostile`; an audit log) in front of the
sampling test server, the Claude API being the tests' fake (`tests/fake_claude.py`), which records
the tokens it served. The well-behaved client makes sequential sampling calls (`sample_raw`, a
small prompt that the fake answers at once) and its latency is measured alone (direct column) and
under attack (proxied column), in alternating batches (ABBA). The attack, all at once, a batch
under attack starting once each part of it has gone round at least once:

* a cancel storm by a hostile upstream: `slow_sample` calls whose server gives up on the sampling
  request 0.2 s after sending it, while the fake is still streaming (each call is charged);
* oversized bodies: POSTs above `--max-message-bytes` (413);
* slow connections: sockets that send half a request's headers and then nothing;
* session churn: `initialize` then `DELETE`, in a loop (held to `--client-session-rate`: the
  refused attempts are counted too).

Then: tokens the fake served against tokens the audit log says were charged, and the sidecar's open
file descriptors and RSS once the attack stopped, against the same figures after warm-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from statistics import median
from typing import Any

import anyio
import httpx2
from anyio.streams.buffered import BufferedByteReceiveStream
from tests.fake_claude import FakeClaude, RecordedRequest, Reply, hang_reply, text_reply

from benchmarks.measure import percentile
from benchmarks.procs import rss
from benchmarks.report import Row, Target
from benchmarks.scenarios import RunContext
from benchmarks.settings import MB

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "sampling_server.py")]
GOOD = "good-client-token-0123456789"
HOSTILE = "hostile-client-token-0123456789"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
ATTACKS = ("cancelled", "oversized", "slow", "churn", "churn_refused")
# The attacker says this once every attack is under way (at most READY_TIMEOUT seconds after it starts).
READY = "attacking"
READY_TIMEOUT = 30.0


def _reply(request: RecordedRequest) -> Reply:
    return hang_reply("An endless essay") if "hostile" in json.dumps(request.body) else text_reply("ok")


def _tool_call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


async def _session(http: httpx2.AsyncClient, url: str, token: str) -> str:
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    auth = {**HEADERS, "authorization": f"Bearer {token}"}
    response = await http.post(url, json=initialize, headers=auth)
    response.raise_for_status()
    session = response.headers["mcp-session-id"]
    ack = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=ack, headers={**auth, "mcp-session-id": session})
    return session


class _Sidecar:
    def __init__(self, fake: FakeClaude, audit: Path, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "MCP_BACKFILL_"))}
        env.update(
            ANTHROPIC_BASE_URL=fake.url,
            ANTHROPIC_API_KEY="sk-ant-bench",
            MCP_BACKFILL_CLIENT_TOKENS=f"good={GOOD},hostile={HOSTILE}",
            PYTHONPATH=str(ROOT / "src"),
        )
        argv = [
            sys.executable, "-m", "mcp_backfill", "serve", "--port", "0", "--max-sessions", "400",
            "--max-message-bytes", str(1024 * 1024), "--header-timeout", "2", "--body-timeout", "2",
            "--budget-tokens", "1000000000", "--audit-log", str(audit), "--", *SERVER,
        ]  # fmt: skip
        self.log = log
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stderr=log.open("wb"), cwd=ROOT
        )
        deadline = time.monotonic() + 60
        while "serving streamable HTTP" not in log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sidecar did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        line = next(x for x in log.read_text().splitlines() if "serving streamable HTTP" in x)
        self.port = int(line.split("port=")[1].split()[0])
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _good_batch(
    http: httpx2.AsyncClient, url: str, session: str, calls: int, first_id: int
) -> list[float]:
    headers = {**HEADERS, "authorization": f"Bearer {GOOD}", "mcp-session-id": session}
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}], "maxTokens": 20}
    latencies = []
    for n in range(calls):
        body = _tool_call(first_id + n, "sample_raw", {"params_json": json.dumps(params)})
        started = time.perf_counter()
        response = await http.post(url, json=body, headers=headers)
        latencies.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200 or '"result"' not in response.text:
            raise RuntimeError(
                f"the well-behaved client was refused: {response.status_code} {response.text[:300]}"
            )
    return latencies


async def _attack(url: str, port: int, stop: anyio.Event, counts: dict[str, int]) -> None:
    """Every attack at once until `stop`; says `READY` on stdout once each has gone round."""
    hostile = {**HEADERS, "authorization": f"Bearer {HOSTILE}"}
    under_way = anyio.Event()

    def went_round(attack: str) -> None:
        counts[attack] += 1
        if _at_full_strength(counts):
            under_way.set()

    async def cancel_storm(worker: int) -> None:
        async with httpx2.AsyncClient(timeout=60) as http:
            session = await _session(http, url, HOSTILE)
            in_session = {**hostile, "mcp-session-id": session}
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    arguments = {
                        "cancel_after": 0.2,
                        "prompt": f"hostile essay {worker}-{n}",
                        "max_tokens": 200,
                    }
                    await http.post(url, json=_tool_call(n, "slow_sample", arguments), headers=in_session)
                    went_round("cancelled")
            finally:
                with anyio.CancelScope(shield=True):  # the session ends with the attack
                    await http.delete(url, headers=in_session)

    async def oversized() -> None:
        blob = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"x" * (2 * 1024 * 1024) + b'"}}'
        async with httpx2.AsyncClient(timeout=60) as http:
            while not stop.is_set():
                with contextlib.suppress(httpx2.HTTPError):  # refused (413); a cut-off connection raises
                    await http.post(url, content=blob, headers=hostile)
                went_round("oversized")

    async def slow_connections() -> None:
        held = []
        try:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                    await stream.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1")
                    held.append(stream)
                    went_round("slow")
                held = held[-100:]
                await anyio.sleep(0.02)
        finally:
            for stream in held:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    async def churn() -> None:
        async with httpx2.AsyncClient(timeout=60) as http:
            while not stop.is_set():
                try:
                    session = await _session(http, url, HOSTILE)
                except httpx2.HTTPStatusError:  # 429: over its --client-session-rate; it keeps trying
                    went_round("churn_refused")
                    continue
                await http.delete(url, headers={**hostile, "mcp-session-id": session})
                went_round("churn")

    async with anyio.create_task_group() as tg:
        for worker in range(3):
            tg.start_soon(cancel_storm, worker)
        tg.start_soon(oversized)
        tg.start_soon(slow_connections)
        tg.start_soon(churn)
        with anyio.move_on_after(READY_TIMEOUT):
            await under_way.wait()
        print(READY, flush=True)
        await stop.wait()
        tg.cancel_scope.cancel()


def _at_full_strength(counts: dict[str, int]) -> bool:
    """Has every attack gone round at least once (each cancel-storm worker too, with the session it
    opened first)?"""
    churned = counts["churn"] + counts["churn_refused"]
    return counts["cancelled"] >= 3 and counts["oversized"] > 0 and counts["slow"] > 0 and churned > 0


async def _measure(ctx: RunContext, sidecar: _Sidecar, fake: FakeClaude) -> dict[str, Any]:
    s = ctx.settings
    # 150 calls a batch and four rounds (ABBA twice): a p99 over 600 calls per arm. At 60 calls and
    # three rounds it moved between 1.6x and 3.3x from run to run; at this it held within 4.8x-5.3x.
    calls = 10 if s.quick else 150
    rounds = 1 if s.quick else 4
    counts = dict.fromkeys(ATTACKS, 0)
    async with httpx2.AsyncClient(timeout=120) as http:
        session = await _session(http, sidecar.url, GOOD)
        await _good_batch(http, sidecar.url, session, 5, 1)  # warm up: the Claude client, the upstream
        await anyio.sleep(1)
        idle_fds, idle_rss = sidecar.fds(), rss(sidecar.process.pid)
        solo: list[float] = []
        attacked: list[float] = []
        next_id = 100
        for round_index in range(rounds):
            for arm in ("solo", "attacked") if round_index % 2 == 0 else ("attacked", "solo"):
                if arm == "solo":
                    solo += await _good_batch(http, sidecar.url, session, calls, next_id)
                else:
                    async with _attacker(sidecar, counts):
                        attacked += await _good_batch(http, sidecar.url, session, calls, next_id)
                next_id += calls
        ctx.progress(f"attack done: {counts}; waiting for the sidecar to settle")
        await anyio.sleep(8)  # header (2 s) and keep-alive (5 s) timeouts close what the attack left
        end_fds, end_rss = sidecar.fds(), rss(sidecar.process.pid)
    return {
        "solo": solo,
        "attacked": attacked,
        "counts": counts,
        "served": fake.served_tokens(),
        "idle_fds": idle_fds,
        "end_fds": end_fds,
        "idle_rss": idle_rss,
        "end_rss": end_rss,
    }


@contextlib.asynccontextmanager
async def _attacker(sidecar: _Sidecar, counts: dict[str, int]) -> AsyncIterator[None]:
    """The attack in a process of its own (its CPU and GIL are not the measuring client's), entered
    once every attack has gone round at least once, so that a batch meets all of them at full
    strength; it stops when its stdin closes and reports what it did."""
    argv = [sys.executable, "-m", "benchmarks.scenarios.adversarial", sidecar.url, str(sidecar.port)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}
    async with await anyio.open_process(argv, env=env, cwd=ROOT, stderr=None) as attacker:
        assert attacker.stdin is not None
        assert attacker.stdout is not None
        said = BufferedByteReceiveStream(attacker.stdout)
        with anyio.fail_after(READY_TIMEOUT + 30):
            line = await said.receive_until(b"\n", 1024)
        if line.strip() != READY.encode():
            raise RuntimeError(f"the attacker said {line[:300]!r} instead of {READY!r}")
        yield
        await attacker.stdin.aclose()
        with anyio.fail_after(60):
            report = await said.receive_until(b"\n", 64 * 1024)
            await attacker.wait()
    for key, value in json.loads(report).items():
        counts[key] += value


async def _attack_until_stdin_closes(url: str, port: int) -> dict[str, int]:
    counts = dict.fromkeys(ATTACKS, 0)
    stop = anyio.Event()

    async def watch_stdin() -> None:
        await anyio.to_thread.run_sync(sys.stdin.buffer.read)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_stdin)
        await _attack(url, port, stop, counts)
    return counts


def run(ctx: RunContext) -> list[Row]:
    log_dir = ctx.logs.path
    audit = log_dir / "6-audit.jsonl"
    with FakeClaude(api_key="sk-ant-bench") as fake:
        fake.fallback = _reply
        sidecar = _Sidecar(fake, audit, log_dir / "6-sidecar.log")
        try:
            result: dict[str, Any] = anyio.run(_measure, ctx, sidecar, fake)
            time.sleep(1)  # the last audit lines of cancelled calls
            result["charged"] = sum(
                sum((json.loads(line).get("charged") or {}).values())
                for line in audit.read_text().splitlines()
            )
        finally:
            sidecar.stop()
    solo, attacked = result["solo"], result["attacked"]
    detail = {"counts": result["counts"], "calls": len(solo)}
    return [
        Row("6", "well-behaved client: sampling call p50 (direct: alone; proxied: under attack)", "ms",
            median(solo), median(attacked), detail=detail),
        Row("6", "well-behaved client: sampling call p99 (direct: alone; proxied: under attack)", "ms",
            percentile(solo, 99), percentile(attacked, 99), target=Target("ratio_max", 2.0, "≤ 2x alone"),
            detail=detail),
        Row("6", "tokens charged (direct: tokens the fake Claude served)", "tokens",
            float(result["served"]), float(result["charged"]),
            target=Target("ratio_min", 1.0, "charged ≥ served")),
        Row("6", "sidecar RSS after the attack (direct: after warm-up)", "MB",
            result["idle_rss"] / MB, result["end_rss"] / MB, target=Target("ratio_max", 1.1, "≤ 1.1x idle")),
        Row("6", "sidecar open file descriptors after the attack (direct: after warm-up)", "fds",
            float(result["idle_fds"]), float(result["end_fds"])),
    ]  # fmt: skip


if __name__ == "__main__":  # the attacker process (see `_attacker`)
    print(json.dumps(anyio.run(_attack_until_stdin_closes, sys.argv[1], int(sys.argv[2]))))
