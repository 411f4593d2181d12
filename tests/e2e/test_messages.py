"""Messages that say what to do: what a user sees at each usual mistake, from the real command."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import (
    ROOT,
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
)

pytestmark = pytest.mark.anyio

ECHO = python_server("echo_server.py")
SAMPLING_SERVER = python_server("sampling_server.py")
HELLO = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "SECRET-PROMPT"}}],
    "maxTokens": 20,
}


def run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_backfill", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env if env is not None else proxy_env(),
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.anyio(False)
def test_a_server_command_without_double_dash_gets_a_hint() -> None:
    done = run("python", "server.py")
    assert done.returncode == 2
    assert "put `--` before the server command: mcp-backfill [OPTIONS] -- python server.py" in done.stderr


@pytest.mark.anyio(False)
def test_the_double_dash_hint_of_serve_keeps_serve() -> None:
    done = run("serve", "python", "server.py")
    assert done.returncode == 2
    assert (
        "put `--` before the server command: mcp-backfill serve [OPTIONS] -- python server.py" in done.stderr
    )


@pytest.mark.anyio(False)
@pytest.mark.parametrize(
    "args", [["--provider", "mock", "serve", "--", "x"], ["--provider", "mock", "serve", "--port", "0"]]
)
def test_serve_after_options_is_said_to_come_first(args: list[str]) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert "unrecognized arguments: serve" in done.stderr
    assert "`serve` comes first: mcp-backfill serve [OPTIONS]" in done.stderr
    assert "-- serve" not in done.stderr  # not a server command named serve


@pytest.mark.anyio(False)
def test_a_serve_option_without_serve_says_where_it_belongs() -> None:
    done = run("--port", "9000", "--", "true")
    assert done.returncode == 2
    assert "--port is an option of `mcp-backfill serve`" in done.stderr


@pytest.mark.anyio(False)
def test_environment_errors_list_the_valid_values() -> None:
    done = run("--", "true", env=proxy_env(MCP_BACKFILL_MODE="sometimes"))
    assert done.returncode == 2
    assert (
        "MCP_BACKFILL_MODE: invalid value 'sometimes' (expected one of fallback, always, off)" in done.stderr
    )


CREDENTIAL = "alicesupersecrettoken12345"


@pytest.mark.anyio(False)
@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (
            ["serve", "--provider", "mock", "--", "true"],
            {"MCP_BACKFILL_CLIENT_TOKENS": f"alice={CREDENTIAL},bob"},
            "--client-tokens / MCP_BACKFILL_CLIENT_TOKENS: invalid entry 2",
        ),
        (
            ["--provider", "mock", "--api-header", f"Authorization Bearer {CREDENTIAL}", "--", "true"],
            {},
            "--api-header / MCP_BACKFILL_API_HEADERS: invalid header 1",
        ),
        (
            ["--provider", "mock", "--upstream-url", "http://127.0.0.1:9/mcp"],
            {"MCP_BACKFILL_UPSTREAM_HEADERS": f"Authorization=Bearer {CREDENTIAL}"},
            "--upstream-header / MCP_BACKFILL_UPSTREAM_HEADERS: invalid line 1",
        ),
    ],
)
def test_a_malformed_credential_is_refused_without_being_printed(
    args: list[str], env: dict[str, str], names: str
) -> None:
    done = run(*args, env=proxy_env(**env))
    assert done.returncode == 2
    assert names in done.stderr
    assert CREDENTIAL not in done.stdout + done.stderr


@pytest.mark.anyio(False)
@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--task-ttl-max", "inf"], {}, "--task-ttl-max / MCP_BACKFILL_TASK_TTL_MAX"),
        (["serve", "--port", "0"], {"MCP_BACKFILL_DRAIN_TIMEOUT": "inf"}, "MCP_BACKFILL_DRAIN_TIMEOUT"),
    ],
)
def test_an_endless_duration_is_refused_at_startup(args: list[str], env: dict[str, str], names: str) -> None:
    done = run(*args, "--provider", "mock", "--", *ECHO, env=proxy_env(**env))
    assert done.returncode == 2
    assert f"{names}: invalid value 'inf' (expected a finite number)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.anyio(False)
@pytest.mark.parametrize(
    ("serve", "variable", "value", "problem"),
    [
        (["serve"], "MCP_BACKFILL_PORT", "70000", "must be between 0 and 65535"),
        ([], "MCP_BACKFILL_SAMPLING_TIMEOUT", "-1", "must not be negative"),
        ([], "MCP_BACKFILL_ALLOWED_MODELS", ",", "must name at least one model"),
    ],
)
def test_a_value_out_of_range_names_the_variable(
    serve: list[str], variable: str, value: str, problem: str
) -> None:
    done = run(*serve, "--provider", "mock", "--", "true", env=proxy_env(**{variable: value}))
    assert done.returncode == 2
    assert f" / {variable}: {problem}" in done.stderr


@pytest.mark.anyio(False)
def test_help_is_grouped_and_has_examples() -> None:
    done = run("--help")
    assert done.returncode == 0
    for group in ("upstream:", "Claude:", "rates, concurrency and budgets:", "audit and logs:", "examples:"):
        assert f"\n{group}\n" in done.stdout, group
    assert "mcp-backfill -- /usr/bin/python3 /abs/path/server.py" in done.stdout
    assert "HTTP front (serve):" not in done.stdout  # only `serve --help` has those
    assert "HTTP front (serve):" in run("serve", "--help").stdout


@pytest.mark.anyio(False)
def test_help_and_the_missing_key_error_name_the_key_file_variable() -> None:
    """The key is best read from a file (the configs the docs show use ANTHROPIC_API_KEY_FILE):
    `--help` and the error for a missing key both say so."""
    assert "ANTHROPIC_API_KEY_FILE" in run("--help").stdout
    done = run("--", *ECHO)
    assert done.returncode == 2
    assert "ANTHROPIC_API_KEY is not set" in done.stderr
    assert "ANTHROPIC_API_KEY_FILE" in done.stderr


@pytest.mark.anyio(False)
def test_an_unusable_audit_log_names_the_flag_and_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "missing-dir" / "audit.jsonl"
    done = run("--provider", "mock", "--audit-log", str(missing), "--", *ECHO)
    assert done.returncode == 2
    assert "--audit-log / MCP_BACKFILL_AUDIT_LOG: " in done.stderr
    assert "cannot open " in done.stderr


@pytest.mark.anyio(False)
def test_a_command_not_on_a_minimal_path_names_path_and_the_fix() -> None:
    env = proxy_env(PATH="/usr/bin:/bin")
    done = run("--provider", "mock", "--", "no-such-server-command", env=env)
    assert done.returncode == 127
    assert "cannot start upstream 'no-such-server-command'" in done.stderr
    assert "PATH=/usr/bin:/bin" in done.stderr
    assert "absolute path" in done.stderr


@pytest.mark.anyio(False)
def test_a_port_in_use_suggests_another() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("serve", "--provider", "mock", "--port", str(port), "--", *ECHO)
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "--port 0" in done.stderr
    assert "MCP_BACKFILL_PORT" in done.stderr


@pytest.mark.anyio(False)
def test_misspelled_variables_and_placeholder_keys_are_warned_about() -> None:
    env = proxy_env(MCP_BACKFILL_MAX_TOKEN_CAP="100", ANTHROPIC_API_KEY="sk-ant-your-key-here")
    done = run("--", *ECHO, env=env)
    warning = "MCP_BACKFILL_MAX_TOKEN_CAP is not a variable mcp-backfill reads"
    assert f"{warning}; did you mean MCP_BACKFILL_MAX_TOKENS_CAP?" in done.stderr
    assert "ANTHROPIC_API_KEY looks like a placeholder" in done.stderr
    assert "sk-ant-your-key-here" not in done.stderr


@pytest.mark.anyio(False)
@pytest.mark.parametrize(
    ("base_url", "warned"),
    [
        ("http://gateway.internal:8080", True),
        ("http://10.1.2.3", True),
        ("http://127.0.0.1:9999", False),
        ("http://localhost:9999", False),
        ("https://gateway.internal", False),
    ],
)
def test_a_plain_http_api_url_to_another_machine_is_warned_about(base_url: str, warned: bool) -> None:
    """The API key and every prompt cross the network unencrypted to a plain-`http://` gateway on
    another machine: accepted (a gateway on a private network may be meant), but said."""
    env = proxy_env(ANTHROPIC_API_KEY="sk-ant-" + "a" * 90, ANTHROPIC_BASE_URL=base_url)
    done = run("--", *ECHO, env=env)
    assert ("unencrypted" in done.stderr) is warned, done.stderr[-2000:]


@pytest.mark.anyio(False)
def test_variables_only_serve_reads_are_warned_about_by_the_stdio_wrapper() -> None:
    """A flag of `serve` given to the stdio wrapper gets a hint; its variable was ignored without a
    word (a shared `.env` setting the port, say, or a request-state key expected to be in force)."""
    env = proxy_env(
        MCP_BACKFILL_PORT="9000",
        MCP_BACKFILL_REQUEST_STATE_KEY="a secret the replicas share, 32+ characters long",
        MCP_BACKFILL_MAX_TOKENS_CAP="100",
    )
    done = run("--provider", "mock", "--", *ECHO, env=env)
    assert "MCP_BACKFILL_PORT is read by `mcp-backfill serve` only" in done.stderr
    assert "MCP_BACKFILL_REQUEST_STATE_KEY is read by `mcp-backfill serve` only" in done.stderr
    assert "MCP_BACKFILL_MAX_TOKENS_CAP is read" not in done.stderr
    assert "32+ characters" not in done.stderr


@pytest.mark.anyio(False)
def test_known_variables_are_not_warned_about() -> None:
    env = proxy_env(
        MCP_BACKFILL_MAX_TOKENS_CAP="100", MCP_BACKFILL_UNWRAP="{}", ANTHROPIC_API_KEY="sk-ant-" + "a" * 90
    )
    done = run("--", *ECHO, env=env)
    assert "is not a variable" not in done.stderr
    assert "placeholder" not in done.stderr


async def sample_once(argv: list[str], env: dict[str, str]) -> tuple[dict[str, Any], str]:
    async with raw_proxy(argv, env) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        arguments = {"name": "sample_raw", "arguments": {"params_json": json.dumps(HELLO)}}
        response = await session.request(
            1,
            "tools/call",
            arguments,
        )
        await session.close_stdin()
        await session.wait(30)
        return json.loads(response["result"]["content"][0]["text"]), session.stderr()


async def test_a_refused_key_is_an_error_that_names_the_variable(fake_claude: FakeClaude) -> None:
    env = proxy_env(fake_claude.url, ANTHROPIC_API_KEY="sk-ant-api03-" + "w" * 80)
    outcome, stderr = await sample_once(proxy_argv(upstream=SAMPLING_SERVER), env)
    assert "check ANTHROPIC_API_KEY" in outcome["error"]["message"]
    [line] = [line for line in stderr.splitlines() if "sampling request" in line and "401" in line]
    assert " ERROR " in line
    assert "check ANTHROPIC_API_KEY" in line


async def test_an_unresolvable_api_host_fails_at_once() -> None:
    env = proxy_env(
        ANTHROPIC_API_KEY="sk-ant-api03-" + "d" * 80, ANTHROPIC_BASE_URL="http://nonexistent.invalid:1"
    )
    outcome, _ = await sample_once(proxy_argv("--retry-max-attempts", "5", upstream=SAMPLING_SERVER), env)
    error = outcome["error"]
    assert "does not resolve" in error["message"]
    assert "ANTHROPIC_BASE_URL" in error["message"]
    assert error["data"]["attempts"] == 1  # not retried: resolving again will not help


async def test_the_exit_summary_is_short_and_only_there_when_something_was_sampled(
    fake_claude: FakeClaude,
) -> None:
    fake_claude.enqueue(text_reply("hi"))
    _, sampled = await sample_once(proxy_argv(upstream=SAMPLING_SERVER), proxy_env(fake_claude.url))
    [summary] = [line for line in sampled.splitlines() if "sampling summary" in line]
    assert "calls=1" in summary
    assert len(summary) < 200
    done = run("--provider", "mock", "--", *ECHO)
    assert "sampling summary" not in done.stderr


async def test_debug_traces_each_message_without_its_contents(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("hi"))
    argv = proxy_argv("--log-level", "debug", upstream=SAMPLING_SERVER)
    _, stderr = await sample_once(argv, proxy_env(fake_claude.url))
    traced = [line for line in stderr.splitlines() if " DEBUG message " in line]
    assert any('direction="from client"' in line and 'method="initialize"' in line for line in traced)
    assert any(
        'direction="from client"' in line and 'method="tools/call"' in line and "id=1" in line
        for line in traced
    )
    assert any(
        'direction="from upstream"' in line and 'kind="response"' in line and "id=1" in line
        for line in traced
    )
    assert all("bytes=" in line for line in traced)
    assert "SECRET-PROMPT" not in stderr


@pytest.mark.anyio(False)
@pytest.mark.parametrize("variable", ["ANTHROPIC_API_KEY_FILE", "MCP_BACKFILL_API_HEADERS_FILE"])
def test_a_secret_file_too_large_to_be_one_is_refused_unread(tmp_path: Path, variable: str) -> None:
    """A `*_FILE` naming the wrong file (a log, a disk image, /dev/zero) was read whole: 50 MB took
    1.5 GB and 15 s, and an endless one never finished; the proxy refuses it, naming the variable."""
    big = tmp_path / "big"
    with big.open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # sparse: nothing written
    done = run("--provider", "mock", "--", *ECHO, env=proxy_env(**{variable: str(big)}))
    assert done.returncode == 2, done.stderr
    assert f"mcp-backfill: error: {variable}: {big} is larger than 1 MiB" in done.stderr
    endless = run("--provider", "mock", "--", *ECHO, env=proxy_env(**{variable: "/dev/zero"}))
    assert endless.returncode == 2, endless.stderr
    assert f"{variable}: /dev/zero is larger than 1 MiB" in endless.stderr
