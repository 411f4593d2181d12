"""`python -m benchmarks [--quick] [--only KEY...] [--out DIR]`: run the scenarios, print and save the table.

Progress goes to stderr; the markdown table goes to stdout and, with the JSON, to
`<out>/latest.md` and `<out>/latest.json` (default `benchmarks/results/`).
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import mcp_backfill
from benchmarks.procs import ROOT, LogDir
from benchmarks.report import Row, table_lines, write_results
from benchmarks.scenarios import RunContext, all_scenarios
from benchmarks.settings import FULL, QUICK
from mcp_backfill import jsonrpc
from mcp_backfill.cli import event_loop_options

DEFAULT_OUT = ROOT / "benchmarks" / "results"


def build_parser() -> argparse.ArgumentParser:
    keys = [scenario.key for scenario in all_scenarios()]
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run: every row, few samples")
    parser.add_argument(
        "--only", nargs="+", choices=keys, metavar="KEY", help=f"run only these: {', '.join(keys)}"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where latest.md and latest.json go")
    return parser


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_revision() -> str:
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return revision + (" (src modified)" if dirty.stdout.strip() else "")


def _proxy_source() -> str:
    """Where the proxies' `mcp_backfill` comes from (PYTHONPATH can point the harness at another tree)."""
    package = Path(mcp_backfill.__file__).resolve().parent
    return "src/" if package == ROOT / "src" / "mcp_backfill" else str(package.parent)


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def machine_info() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "uvloop": "on" if event_loop_options() else "off",
        "json codec": getattr(jsonrpc, "CODEC", "json"),
        "mcp": metadata.version("mcp"),
        "anthropic": metadata.version("anthropic"),
        "revision": _git_revision(),
        "proxy source": _proxy_source(),
        "load average at start": _load(),
    }


def compile_proxy_source() -> str:
    """Compile the proxies' `mcp_backfill` to bytecode, as installing the package does.

    Run from a source tree (an editable install, or PYTHONPATH), each proxy process would otherwise
    compile every module of its own at startup where the environment sets PYTHONDONTWRITEBYTECODE
    (this project's container does, as do many CI images): about 85 ms of scenario 5's startup on
    a 2-core VM, which no installed copy pays (pip compiles a wheel's modules when it installs it).
    """
    package = Path(mcp_backfill.__file__).resolve().parent
    compiled = compileall.compile_dir(package, quiet=1, workers=1)
    return "compiled ahead (as installed)" if compiled else "compiling failed: modules compile at each start"


def main(argv: Sequence[str] | None = None) -> int:
    raw_args = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw_args)
    settings = QUICK if args.quick else FULL
    command = shlex.join(["scripts/bench", *raw_args])
    machine = machine_info()
    machine["proxy bytecode"] = compile_proxy_source()
    logs = LogDir()
    rows: list[Row] = []
    failed: list[str] = []
    started = time.perf_counter()
    for scenario in all_scenarios():
        if args.only and scenario.key not in args.only:
            continue

        def progress(text: str, number: str = scenario.number) -> None:
            print(f"[{time.perf_counter() - started:6.1f}s] {number}: {text}", file=sys.stderr, flush=True)

        progress(scenario.title)
        try:
            rows += scenario.run(RunContext(settings, logs, progress))
        except Exception:
            traceback.print_exc()
            failed.append(scenario.key)
            progress(f"FAILED; process logs are in {logs.path}")
    machine["load average at end"] = _load()
    machine["duration"] = f"{time.perf_counter() - started:.0f} s"
    md_path, json_path = write_results(args.out, rows, machine, command)
    print("\n".join(table_lines(rows)))
    print(f"\nwritten: {md_path} and {json_path}", file=sys.stderr)
    if failed:
        print(f"failed scenarios: {', '.join(failed)} (logs: {logs.path})", file=sys.stderr)
        return 1
    shutil.rmtree(logs.path, ignore_errors=True)
    return 0
