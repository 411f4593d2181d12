"""The benchmark harness runs end to end (`--quick`) and produces a well-formed result table.

Timings are not checked (they belong to the benchmark itself, not to the test suite): only that
every scenario ran against real processes and reported a complete row set, the same way on
stdout, in latest.md and in latest.json.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT

HEADER = "| scenario | direct | proxied | ratio / added | target | met? |"
SCENARIOS = {"1a", "1b", "2", "3a", "3b", "4", "5", "6", "7", "8"}
HTTP_SESSIONS = (1, 8, 64)
TARGETED_TITLES = {
    "raw echo: round trip p50",
    "raw echo: added p50, the proxy against the bare forwarder (direct: the forwarder's added µs)",
    "SDK: tools/call p50",
    "10 MB result: call time p50",
    "10 MB result: proxy peak RSS above idle",
    "sampling request p50, raw echo upstream (the proxy's own cost) (direct: the fake alone)",
    "idle RSS (direct: the SDK upstream; proxied: the proxy process, --no-warm-up)",
    "startup to initialize answered, raw echo upstream",
    "startup to initialize answered, raw echo upstream: warm-up on (direct: --no-warm-up)",
    "cold first sampling answer, 3 s after start (direct: warm, as long idle)",
    "cold first sampling answer, right after the handshake (direct: --no-warm-up)",
    "1 session, HTTP upstream: tools/call p50",
    "well-behaved client: sampling call p99 (direct: alone; proxied: under attack)",
    "tokens charged (direct: tokens the fake Claude served)",
    "sampling call p50, Redis store (direct: memory store)",
    "1,000 2026-07-28 clients: errors, every call and connection of both phases",
    "1,000 2026-07-28 clients: sidecar RSS, every client still connected (direct: before the first client)",
    "1,000 2026-07-28 clients: sidecar peak RSS, VmHWM (direct: before the first client)",
    *(
        f"{n} session{'s' if n > 1 else ''}, {upstream}: throughput{suffix}"
        for n in HTTP_SESSIONS
        for upstream, suffix in (("stdio upstream", " (direct: mcp-proxy)"), ("HTTP upstream", ""))
    ),
}
# The HTTP rows: requests per second and p50/p99 at each concurrency, against mcp-proxy (3a) and
# against the HTTP upstream directly (3b), and 3b's floors; the sidecar's RSS with idle HTTP sessions
# (5); and the longest wait for a message while the warm-up runs (5).
HTTP_TITLES = {
    (scenario, f"{n} session{'s' if n > 1 else ''}, {upstream}: {what}{suffix}")
    for scenario, upstream, suffix in (
        ("3a", "stdio upstream", " (direct: mcp-proxy)"),
        ("3b", "HTTP upstream", ""),
    )
    for n in HTTP_SESSIONS
    for what in ("throughput", "tools/call p50", "tools/call p99")
} | {
    ("5", "sidecar RSS, 100 idle HTTP sessions, stdio upstream (direct: no session yet)"),
    ("5", "upstream processes' total RSS, 100 sessions (raw echo children of the sidecar)"),
    ("5", "sidecar RSS, 100 idle HTTP sessions, HTTP upstream (direct: no session yet)"),
    ("3b", "1 session, HTTP upstream: throughput via a bare TCP forwarder (the floor)"),
    ("3b", "1 session, HTTP upstream: throughput via a forwarder that parses HTTP and decodes each message"),
    ("3b", "1 session, HTTP upstream: throughput via uvicorn and a bare ASGI forwarder"),
    ("3b", "1 session, HTTP upstream: throughput via a front that ends HTTP on both sides, below ASGI"),
    ("3b", "1 session, HTTP upstream: the upstream's CPU time per call"),
    ("3b", "1 session, HTTP upstream: the upstream's waits for work per call"),
    ("5", "longest ping round trip in the 1.5 s after the handshake: warm-up on (direct: --no-warm-up)"),
}
# The stdio floors: the same figure through a bare byte forwarder, next to the targeted rows.
FLOOR_TITLES = {
    ("1a", "raw echo: round trip p50 via a bare byte forwarder (the floor)"),
    ("1b", "SDK: tools/call p50 via a bare byte forwarder (the floor)"),
    ("1b", "SDK: throughput, 1 in flight via a bare byte forwarder (the floor)"),
    ("1b", "SDK: throughput, 16 in flight via a bare byte forwarder (the floor)"),
    ("2", "10 MB result: call time p50 via a bare byte forwarder (the floor)"),
}


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the one markdown table in `text` (header and separator excluded)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0] == HEADER
    assert lines[1] == "|---|---|---|---|---|---|"
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]
    for cells in rows:
        assert len(cells) == 6, cells
    return rows


def check_json_row(row: dict[str, Any]) -> None:
    assert row["scenario"] in SCENARIOS
    for key in ("direct", "proxied", "ratio", "added"):
        value = row[key]
        assert value is None or (isinstance(value, int | float) and math.isfinite(value)), (key, row)
    assert row["proxied"] is not None, row  # every row measured the proxy
    if row["direct"] is not None:
        assert row["ratio"] is not None
        assert row["added"] is not None
    if row["target"] is None:
        assert row["met"] is None
    else:
        assert isinstance(row["met"], bool), row


@pytest.mark.timeout(900)
def test_quick_benchmark_run_writes_a_complete_table(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    printed = table_rows(done.stdout)
    markdown = (out / "latest.md").read_text(encoding="utf-8")
    assert "Command: `scripts/bench --quick --out" in markdown
    assert table_rows(markdown) == printed

    document = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    machine = document["machine"]
    assert machine["cpus"] >= 1
    assert machine["python"].count(".") == 2
    assert machine["uvloop"] in ("on", "off")
    assert machine["json codec"] in ("json", "orjson")
    rows = document["rows"]
    for row in rows:
        check_json_row(row)
    assert {row["scenario"] for row in rows} == SCENARIOS
    titles = [row["title"] for row in rows]
    assert len(set(titles)) == len(titles)
    assert {row["title"] for row in rows if row["target"] is not None} >= TARGETED_TITLES
    assert {(row["scenario"], row["title"]) for row in rows} >= HTTP_TITLES | FLOOR_TITLES
    for row in rows:
        if row["scenario"] in ("3a", "3b"):
            # Both arms were measured at every concurrency, and every call was checked.
            assert row["direct"] is not None, row
            if row["unit"] == "waits":  # the upstream may not have waited at all in a short batch
                assert row["direct"] >= 0, row
                assert row["proxied"] >= 0, row
            else:
                assert row["direct"] > 0, row
                assert row["proxied"] > 0, row
            assert all(calls > 0 for calls in row["detail"]["calls"].values()), row
            # The CPU time of the process in the middle, for the sidecar and each floor.
            assert row["detail"]["middle_cpu_us_per_call"].keys() == row["detail"]["calls"].keys() - {
                "direct"
            }
        if row["scenario"] == "3b" and row["title"].startswith("1 session,"):
            # And, at one session, the upstream's CPU time and waits behind every arm.
            for figure in ("upstream_cpu_us_per_call", "upstream_waits_per_call"):
                assert row["detail"][figure].keys() == row["detail"]["calls"].keys(), row
            assert all(cpu > 0 for cpu in row["detail"]["upstream_cpu_us_per_call"].values()), row
        if row["scenario"] == "8" and row["unit"] == "calls/s":
            # The smoke run too has every client connected at once, each making its timed calls.
            assert row["detail"]["connected"] == 1000, row
            assert row["detail"]["timed_calls"] >= 1000, row

    # The printed table and the JSON describe the same rows, in the same order.
    assert [cells[0] for cells in printed] == [f"{row['scenario']} {row['title']}" for row in rows]
    for cells, row in zip(printed, rows, strict=True):
        assert cells[5] == {None: "—", True: "yes", False: "**no**"}[row["met"]]


@pytest.mark.timeout(300)
def test_two_trees_are_compared_batch_by_batch(tmp_path: Path) -> None:
    """`benchmarks.compare_trees`: both sidecars served calls, and every figure is there."""
    argv = [
        *(sys.executable, "-m", "benchmarks.compare_trees", "src"),
        *("--rounds", "3", "--pairs", "3", "--seconds", "0.3"),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    arms = re.findall(
        r"^(this tree|other tree) +(\d+) req/s +p50 ([\d.]+) ms +CPU per call: sidecar (\d+) µs, "
        r"upstream (\d+) µs$",
        done.stdout,
        re.MULTILINE,
    )
    assert [arm[0] for arm in arms] == ["this tree", "other tree"], done.stdout
    for _, *figures in arms:
        assert all(float(figure) > 0 for figure in figures), done.stdout
    assert re.search(r"^this tree / other tree, throughput: \d+\.\d{3}x$", done.stdout, re.MULTILINE)
    # Each pair of sidecars, started anew, is compared on its own too.
    assert re.search(r"^each pair: \d+\.\d{3}x, \d+\.\d{3}x, \d+\.\d{3}x$", done.stdout, re.MULTILINE)

    refused = subprocess.run([*argv[:3], str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert f"{tmp_path} holds no mcp_backfill package" in refused.stderr


@pytest.mark.timeout(300)
def test_the_sidecar_is_traced_point_by_point() -> None:
    """`benchmarks.critical_path`: a sidecar's probe points, timed in order along one session's calls."""
    argv = [sys.executable, "-m", "benchmarks.critical_path", "--seconds", "0.5"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = re.search(r"^\d+ req/s at one session; (\d+) of (\d+) calls passed", done.stdout, re.MULTILINE)
    assert counts is not None, done.stdout
    assert 0 < int(counts[1]) <= int(counts[2]), done.stdout
    rows = re.findall(r"^\| ([a-z ]+) \| ([a-z ]+) \| ([\d.]+) \| (-?[\d.]+) \|$", done.stdout, re.MULTILINE)
    points = [start for start, *_ in rows]
    # The call's way through the sidecar, in its order: in and upstream first, then the relay's books
    # (of the last call's answer, then of this request), and back (`relay/ahead.py`).
    path = ["request in", "upstream written", "relay routes it", "handed to the relay", "answer decoded"]
    assert [point for point in points if point in path] == path, done.stdout
    assert rows[-1][1] == "next request in", done.stdout
    assert all(float(wall) >= 0 for _, _, wall, _ in rows), done.stdout


@pytest.mark.timeout(300)
def test_cpu_spent_on_the_call_path_is_weighed_against_a_control() -> None:
    """`benchmarks.critical_path weigh`: 2 ms spent as each request comes in slow every call by as much."""
    argv = [sys.executable, "-m", "benchmarks.critical_path", "weigh", "--point", "request in"]
    done = subprocess.run(
        [*argv, "--us", "2000", "--rounds", "2", "--seconds", "0.3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    row = re.search(r"^\| request in \| (\d+\.\d{3})x \| (-?\d+\.\d\d) \|$", done.stdout, re.MULTILINE)
    assert row is not None, done.stdout
    # About 0.4x and a weight of 1 here (without the spin: 1x and 0, give or take a few hundredths).
    assert float(row[1]) < 0.85, done.stdout
    assert float(row[2]) > 0.5, done.stdout
