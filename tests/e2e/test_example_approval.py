"""The approval example (`examples/approval_client.py`): scripted answers through the real proxy."""

from __future__ import annotations

import subprocess

from tests.harness import run_example


def run_approval(answers: str, *proxy_options: str) -> subprocess.CompletedProcess[str]:
    return run_example("approval_client.py", "--answers", answers, proxy_options=proxy_options)


def test_scripted_answers_allow_deny_and_allow_for_the_session() -> None:
    done = run_approval("allow_once,deny,decline,allow_session,deny", "--approve", "elicit")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert out.count("asked:") == 4  # nothing is asked after "allow for this session"
    assert 'The MCP server "weather-example" asks Claude' in out
    outcomes = [line.split(":")[1].strip() for line in out.splitlines() if line.startswith("summarize #")]
    assert outcomes == ["answered", "refused", "refused", "answered", "answered"]


def test_without_approval_nothing_is_asked_and_the_example_notices() -> None:
    done = run_approval("deny")  # the proxy runs with --approve never: the call is answered
    assert done.returncode == 1
    assert "asked:" not in done.stdout
    assert "summarize #1: answered" in done.stdout
