"""One budget shared by several stdio wrapper processes through a SQLite state store.

A user who wraps several servers in a desktop client runs several stdio wrapper processes; with
`--state-store sqlite:///path` they share one budget:

    4 x (mcp SDK client -> `python -m mcp_backfill --state-store sqlite:///.../ledger.db`
                                -> tests/servers/sampling_server.py)
                              \\-> fake Claude (loopback HTTP, ANTHROPIC_BASE_URL)

The SQLite file itself is read at the end: what was charged there is the shared budget's account.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_backfill.sampling.estimate import reservation_for
from tests.fake_claude import FakeClaude
from tests.harness import proxy_argv, proxy_env, python_server, stdio_params, tool_json

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
SLOW = 60.0
PROCESSES = 4
# About 300 input tokens; the fake's default reply echoes it, so about 300 output tokens too.
PROMPT = " ".join(f"word{n:04d}" for n in range(130))
MAX_TOKENS = 400  # above what the fake's echo reports, so a call never costs more than it reserved
BUDGET = 6_000  # roughly ten calls' worth, shared by all the processes
EXHAUSTED = "token budget shared through the state store is exhausted"


@dataclass
class Wrapper:
    """What one wrapper process's client saw."""

    answers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def sampling_params(process: int, call: int) -> dict[str, Any]:
    text = f"process {process}, call {call}: {PROMPT}"
    return {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": MAX_TOKENS,
    }


def ledger(path: Path) -> tuple[int, int]:
    """(tokens charged to the process budget, leases left) as the SQLite file holds them."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute(
            "SELECT tokens FROM used WHERE key = 'process' AND window = '' AND number = 0"
        ).fetchone()
        (leases,) = db.execute("SELECT COUNT(*) FROM leases").fetchone()
    return (int(row[0]) if row else 0), int(leases)


async def test_wrapper_processes_share_one_budget_through_a_sqlite_file(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    database = tmp_path / "ledger.db"
    argv = proxy_argv(
        "--state-store", f"sqlite://{database}", "--budget-tokens", str(BUDGET), upstream=SAMPLING_SERVER
    )
    wrappers = [Wrapper() for _ in range(PROCESSES)]
    connected = 0
    all_connected = anyio.Event()

    async def run(process: int) -> None:
        nonlocal connected
        wrapper = wrappers[process]
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
            connected += 1
            if connected == PROCESSES:
                all_connected.set()
            await all_connected.wait()  # every process is up before any of them samples
            call = 0
            while not wrapper.errors:
                params = json.dumps(sampling_params(process, call))
                outcome = tool_json(await client.call_tool("sample_raw", {"params_json": params}))
                (wrapper.errors if "error" in outcome else wrapper.answers).append(outcome)
                call += 1
        # Leaving the client closed the wrapper's stdin and waited for it to exit.

    with anyio.fail_after(SLOW):
        async with anyio.create_task_group() as tg:
            for process in range(PROCESSES):
                tg.start_soon(run, process)

    charged, leases = ledger(database)
    requests = fake_claude.message_requests
    reservations = [reservation_for(request.body).total for request in requests]
    served = [each.total for each in fake_claude.served]
    answered = sum(len(wrapper.answers) for wrapper in wrappers)

    # Every process ended on the shared budget's refusal, and more than one of them sampled.
    for wrapper in wrappers:
        [refusal] = wrapper.errors
        assert refusal["error"]["code"] == -32603, refusal
        assert EXHAUSTED in refusal["error"]["message"], refusal
        assert "--budget-tokens" in refusal["error"]["message"]
        assert refusal["error"]["data"]["max"] == BUDGET
    assert sum(1 for wrapper in wrappers if wrapper.answers) >= 2
    # Each answer is one Claude call (refusals cost none), each served and charged in the file.
    assert answered == len(requests) == len(served)
    for wrapper in wrappers:
        for answer in wrapper.answers:
            assert answer["result"]["content"]["text"].startswith("fake-claude says"), answer
    # The bound below needs every call to cost at most what it reserved (the fake's echo fits).
    assert max(served) <= min(reservations)
    # The budget is shared: all processes together spent it once, overrun by at most one call...
    assert charged >= BUDGET
    assert charged <= BUDGET + max(reservations)
    # ...so together they answered far fewer calls than each alone could have.
    alone = -(-BUDGET // max(served))  # a process alone is admitted while under the budget
    assert answered < PROCESSES * alone
    # Nothing the fake served went uncharged, and nothing is left reserved.
    assert 0 < fake_claude.served_tokens() <= charged
    assert leases == 0
