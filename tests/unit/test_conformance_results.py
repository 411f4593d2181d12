"""Reading the conformance suite's checks.json files into per-scenario pass/fail (tests/conformance.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conformance import read_results


def write_checks(out: Path, scenario: str, checks: list[dict[str, Any]]) -> None:
    directory = out / f"server-{scenario}-2026-11-22T17-13-46-297Z"
    directory.mkdir()
    (directory / "checks.json").write_text(json.dumps(checks))


def check(status: str, message: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"c-{status.lower()}", "name": "C", "status": status}
    if message is not None:
        item["errorMessage"] = message
    return item


def test_a_scenario_fails_only_on_a_failure_check(tmp_path: Path) -> None:
    write_checks(tmp_path, "ping", [check("SUCCESS"), check("INFO"), check("WARNING")])
    write_checks(tmp_path, "tools-call-sampling", [check("SUCCESS"), check("FAILURE", "no sampling")])
    results = read_results(tmp_path, ["ping", "tools-call-sampling"])
    assert results["ping"].passed
    assert not results["tools-call-sampling"].passed
    assert results["tools-call-sampling"].reason() == "c-failure: no sampling"


def test_missing_or_empty_results_count_as_failures(tmp_path: Path) -> None:
    write_checks(tmp_path, "server-sse-polling", [])
    (tmp_path / "unrelated").mkdir()
    results = read_results(tmp_path, ["dns-rebinding-protection", "server-sse-polling"])
    assert list(results) == ["dns-rebinding-protection", "server-sse-polling"]
    assert not results["dns-rebinding-protection"].passed
    assert "no checks.json" in results["dns-rebinding-protection"].reason()
    assert not results["server-sse-polling"].passed


def test_scenarios_the_list_did_not_name_are_kept(tmp_path: Path) -> None:
    write_checks(tmp_path, "server-initialize", [check("SUCCESS")])
    write_checks(tmp_path, "some-new-scenario", [check("SUCCESS")])
    results = read_results(tmp_path, ["server-initialize"])
    assert set(results) == {"server-initialize", "some-new-scenario"}
