"""`mcp-backfill check` against real upstreams and the fake Claude API: a working setup and broken ones."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.e2e.test_platforms import GOOGLE_SHAPED_REFRESH_TOKEN, adc_env
from tests.fake_claude import FakeClaude, error_reply
from tests.harness import EXAMPLES, ROOT, TEST_API_KEY, free_port, proxy_env, python_server

WEATHER = [sys.executable, str(EXAMPLES / "weather_server.py")]


def check(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_backfill", "check", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_a_working_setup(fake_claude: FakeClaude) -> None:
    env = proxy_env(fake_claude.url, MCP_BACKFILL_BUDGET_TOKENS="5000")
    done = check("--max-tokens-cap", "2000", "--", *WEATHER, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "mcp-backfill 0." in out
    assert "Python 3." in out
    assert "--max-tokens-cap = 2000  (flag)" in out
    assert "--budget-tokens = 5000 tokens  (environment MCP_BACKFILL_BUDGET_TOKENS)" in out
    assert "--mode = fallback  (default)" in out
    assert "authenticated: claude-sonnet-5-5 counted" in out
    assert "handshake done: weather-example" in out
    assert "protocol 2025-11-25" in out
    assert "tools: weather_assistant, summarize, packing_advice" in out
    assert "answers every sampling request" in out
    assert "OK: every part works" in out
    assert TEST_API_KEY not in out + done.stderr
    assert f"ANTHROPIC_API_KEY = {TEST_API_KEY[:7]}…" in out
    [counted] = [r for r in fake_claude.requests if r.path == "/v1/messages/count_tokens"]
    assert fake_claude.message_requests == []  # nothing billable was sent
    assert counted.body["model"] == "claude-sonnet-5-5"


def test_the_mock_provider_and_a_client_that_samples_with_tools() -> None:
    done = check(
        "--provider", "mock", "--client-capabilities", "sampling-tools", "--", *WEATHER, env=proxy_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offline mock provider" in done.stdout
    assert (
        "for a client declaring 'sampling-tools': the proxy (--mode fallback) leaves sampling to the client"
        in done.stdout
    )


def test_a_refused_key(fake_claude: FakeClaude) -> None:
    env = proxy_env(fake_claude.url, ANTHROPIC_API_KEY="sk-ant-api03-" + "x" * 80)
    done = check("--", *WEATHER, env=env)
    assert done.returncode == 1
    assert "FAILED: AuthenticationError" in done.stdout
    assert "check ANTHROPIC_API_KEY" in done.stdout
    assert "1 problem(s) above" in done.stdout
    assert "x" * 80 not in done.stdout + done.stderr


def test_a_missing_key() -> None:
    done = check("--", *WEATHER, env=proxy_env())
    assert done.returncode == 1
    assert "configuration: FAILED: ANTHROPIC_API_KEY is not set" in done.stdout


def test_an_upstream_that_cannot_start_and_a_misspelled_variable(tmp_path: Path) -> None:
    env = proxy_env(MCP_BACKFILL_MODES="always", PATH="/usr/bin:/bin")
    done = check("--provider", "mock", "--", "no-such-server", env=env)
    assert done.returncode == 1
    assert (
        "MCP_BACKFILL_MODES is not a variable mcp-backfill reads; did you mean MCP_BACKFILL_MODE?"
        in done.stdout
    )
    assert "session through the proxy: no-such-server" in done.stdout
    assert "FAILED" in done.stdout.split("session through the proxy")[1]
    assert "cannot start upstream 'no-such-server'" in done.stderr  # the proxy's own message


def test_an_unreachable_url() -> None:
    done = check("--provider", "mock", "--upstream-url", "http://127.0.0.1:9/mcp", env=proxy_env())
    assert done.returncode == 1
    assert "session through the proxy: http://127.0.0.1:9/mcp" in done.stdout
    assert "FAILED" in done.stdout.split("session through the proxy")[1]


@pytest.mark.parametrize("args", [[], ["--client-capabilities", "everything", "--", "x"]])
def test_bad_usage(args: list[str]) -> None:
    done = check(*args, env=proxy_env())
    assert done.returncode == 2
    assert "usage: mcp-backfill check" in done.stderr


def test_a_malformed_credential_is_not_printed() -> None:
    secret = "sk-gateway-SECRET-0123456789"
    done = check(
        "--provider", "mock", "--api-header", f"Authorization Bearer {secret}", "--", "x", env=proxy_env()
    )
    assert done.returncode == 1
    assert "configuration: FAILED: --api-header / MCP_BACKFILL_API_HEADERS: invalid header 1" in done.stdout
    assert secret not in done.stdout + done.stderr


def test_the_upstream_url_is_shown_without_its_credentials() -> None:
    url = "http://user:TOPSECRETPASS@127.0.0.1:9/mcp?token=QUERYSECRET"
    done = check("--provider", "mock", "--upstream-url", url, env=proxy_env())
    assert done.returncode == 1
    assert "--upstream-url = http://127.0.0.1:9/mcp  (flag)" in done.stdout
    assert "session through the proxy: http://127.0.0.1:9/mcp\n" in done.stdout
    assert "TOPSECRETPASS" not in done.stdout + done.stderr
    assert "QUERYSECRET" not in done.stdout + done.stderr


def test_the_state_store_is_shown_without_its_credentials() -> None:
    """Which store the proxy uses matters to the report; its password does not belong there."""
    url = "redis://:TOPSECRETPASS@127.0.0.1:9/0?password=QUERYSECRET"
    done = check("--provider", "mock", "--state-store", url, "--", *WEATHER, env=proxy_env())
    assert "--state-store = redis://:***@127.0.0.1:9/0?password=***  (flag)" in done.stdout
    assert "TOPSECRETPASS" not in done.stdout + done.stderr
    assert "QUERYSECRET" not in done.stdout + done.stderr


def test_an_unreachable_state_store_is_reported_by_name() -> None:
    """The store is a part of its own: a Redis nobody answers at is named as the problem, without
    its password (it was reported only as the session's "Connection closed")."""
    port = free_port()  # nothing listens there
    url = f"redis://:TOPSECRETPASS@127.0.0.1:{port}/0"
    done = check("--provider", "mock", "--state-store", url, "--", *WEATHER, env=proxy_env())
    assert done.returncode == 1
    section = done.stdout.split(f"\nstate store: redis://:***@127.0.0.1:{port}/0\n")[1].split("\n\n")[0]
    assert "FAILED: " in section
    assert "--state-store / MCP_BACKFILL_STATE_STORE" in section
    assert "TOPSECRETPASS" not in done.stdout + done.stderr


def test_a_state_store_that_answers_is_reported(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    done = check("--provider", "mock", "--state-store", url, "--", *WEATHER, env=proxy_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"\nstate store: {url}\n  answers: the ledger is kept there\n" in done.stdout


def test_an_abbreviated_flag_is_refused() -> None:
    done = check("--prov", "mock", "--", *WEATHER, env=proxy_env())
    assert done.returncode == 2
    assert "unrecognized arguments: --prov" in done.stderr


def test_an_empty_variable_is_not_named_as_a_source() -> None:
    # An empty variable is not set, for the proxy as for the report.
    env = proxy_env(MCP_BACKFILL_MODE="", MCP_BACKFILL_MAX_TOKENS_CAP="")
    done = check("--provider", "mock", "--", *WEATHER, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--mode = fallback  (default)" in done.stdout
    assert "MCP_BACKFILL_MAX_TOKENS_CAP" not in done.stdout


def test_a_pass_through_setup_needs_no_key() -> None:
    done = check("--mode", "off", "--", *WEATHER, env=proxy_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not tried: --mode off answers no sampling request" in done.stdout
    assert "FAILED" not in done.stdout
    assert "OK: every part works" in done.stdout


def test_serve_is_refused_with_what_to_do_instead() -> None:
    # `check` speaks stdio to the proxy it starts: a `serve` one would never answer.
    done = check("serve", "--provider", "mock", "--port", "0", "--", *WEATHER, env=proxy_env())
    assert done.returncode == 2
    assert "usage: mcp-backfill check" in done.stderr
    assert "without `serve` and its own options" in done.stderr
    assert "/healthz" in done.stderr
    assert done.stdout == ""


def test_only_the_public_prefix_of_a_key_is_shown() -> None:
    # A gateway's token in ANTHROPIC_API_KEY: any 7 characters of it would be 7 characters of the secret.
    token = "Zq9v4Lx2Rt7mWp3kHs6dNb8c"
    done = check("--mode", "off", "--", *WEATHER, env=proxy_env(ANTHROPIC_API_KEY=token))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ANTHROPIC_API_KEY = ***({len(token)} characters)  (environment)" in done.stdout
    assert token[:4] not in done.stdout


def test_the_upstreams_credentials_on_its_command_line_are_not_printed() -> None:
    """`check` printed the upstream command with every argument as given, credentials included."""
    server = [*WEATHER, "--api-key", "sk-upstream-SECRET-1", "--db=postgres://app:pw-SECRET-2@db/app"]
    done = check("--provider", "mock", "--", *server, env=proxy_env())
    assert "session through the proxy:" in done.stdout
    assert "--api-key ***" in done.stdout
    assert "SECRET" not in done.stdout + done.stderr


def test_what_the_server_names_cannot_drive_the_terminal_or_add_lines() -> None:
    """`check` printed the server's name, version and tool names as they came: a server could
    retitle or clear the terminal, or write a line of its own into the report."""
    done = check("--provider", "mock", "--", *python_server("odd_names_server.py"), env=proxy_env())
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert not [ch for ch in out if (ord(ch) < 32 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F], out
    assert "\u202e" not in out
    assert out.splitlines().count("  OK: every part works") == 1  # the result's, not the server's
    name = "odd\\x1b]0;retitled\\x07\\x1b[2J\\n  OK: every part works\\u202e"
    assert f"handshake done: {name} 1\\r\\x1b[K, protocol" in out
    assert "tools: tool\\x1b[31mred\\x1b[0m\\x9b1m\n" in out


def test_parts_that_never_answer_are_named_as_such(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A provider and an upstream that never answer were reported as `TimeoutError: ; check
    ANTHROPIC_BASE_URL...` and `TimeoutError: the session ended`; they say how long `check` waited.
    (In the test's process, with `check`'s wait cut to 2 s.)"""
    from mcp_backfill import doctor
    from mcp_backfill.cli import parse_config

    monkeypatch.setattr(doctor, "TIMEOUT", 2.0)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        port = silent.getsockname()[1]
        env = proxy_env(f"http://127.0.0.1:{port}")
        for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
            monkeypatch.setenv(name, env[name])
        status = doctor.main(["--", *python_server("silent_server.py")], parse_config, env)
    out = capfd.readouterr().out
    assert status == 1
    provider = out.split("provider: anthropic\n")[1].split("\n")[0]
    assert (
        provider == "  FAILED: no answer from the Claude API in 2 s; check ANTHROPIC_BASE_URL and the network"
    )
    session = out.split("session through the proxy:")[1].split("\n")[1]
    assert session.startswith("  FAILED: no answer from the server in 2 s (handshake and tools/list)")


def test_a_key_file_of_more_than_one_line_is_named(tmp_path: Path) -> None:
    """A key file holding a second line (or any control character) failed as `APIConnectionError:
    Connection error.; check ANTHROPIC_BASE_URL and the network` (the header could not be sent), in
    `check` as in every sampling request; it is a configuration error naming the key's variables."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-ant-api03-FIRSTLINE-0123456789\nsk-ant-api03-SECONDLINE-0123456789\n")
    env = proxy_env("http://127.0.0.1:9", ANTHROPIC_API_KEY_FILE=str(key_file))
    del env["ANTHROPIC_API_KEY"]
    done = check("--", *WEATHER, env=env)
    assert done.returncode == 1
    assert (
        "configuration: FAILED: ANTHROPIC_API_KEY holds a line break or another control character"
        in done.stdout
    )
    assert "ANTHROPIC_API_KEY_FILE" in done.stdout
    assert "LINE" not in done.stdout + done.stderr
    proxy = subprocess.run(
        [sys.executable, "-m", "mcp_backfill", "--", *WEATHER],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proxy.returncode == 2
    assert "mcp-backfill: error: ANTHROPIC_API_KEY holds a line break" in proxy.stderr


def test_client_capabilities_with_an_equals_sign() -> None:
    """`--client-capabilities=VALUE`, as every other option may be written, was passed on to the
    proxy's parser, which refused it as unrecognized."""
    done = check(
        "--client-capabilities=sampling-tools", "--provider", "mock", "--", *WEATHER, env=proxy_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "for a client declaring 'sampling-tools'" in done.stdout
    bad = check("--client-capabilities=everything", "--", *WEATHER, env=proxy_env())
    assert bad.returncode == 2
    assert "usage: mcp-backfill check" in bad.stderr


@pytest.mark.parametrize("args", [["--version"], ["--provider", "mock", "--help"]])
def test_version_and_help_among_options_exit_0(args: list[str]) -> None:
    """argparse ends `--version` and `--help` with status 0, which `check` turned into 2 (bad usage)."""
    done = check(*args, env=proxy_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(("mcp-backfill 0.", "usage:"))


def test_bedrock_is_not_reported_broken_for_want_of_token_counting(fake_claude: FakeClaude) -> None:
    """The anthropic SDK's Bedrock client counts no tokens ("Token counting is not supported in
    Bedrock yet"): `check` reported every Bedrock setup as FAILED, with a hint about
    ANTHROPIC_BASE_URL and the network, and exited 1."""
    env = proxy_env(
        ANTHROPIC_BEDROCK_BASE_URL=fake_claude.url,
        AWS_REGION="us-east-1",
        AWS_BEARER_TOKEN_BEDROCK=TEST_API_KEY,
    )
    done = check("--provider", "bedrock", "--", *WEATHER, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    provider = done.stdout.split("provider: bedrock\n")[1].split("\n")[0]
    assert provider.startswith("  not tried: the Bedrock client cannot count tokens"), provider
    assert "OK: every part works" in done.stdout
    assert TEST_API_KEY not in done.stdout + done.stderr
    assert fake_claude.platform_requests == []  # nothing billable was sent


@pytest.mark.parametrize("where", ["none", "profile", "role"])
def test_bedrock_without_an_api_key_says_whether_boto3_finds_aws_credentials(
    fake_claude: FakeClaude, tmp_path: Path, where: str
) -> None:
    """Bedrock signed with SigV4: `check` said "not tried" and "OK: every part works" with no AWS
    credentials anywhere, where every sampling request then failed. It resolves them as the first
    request would (through the SDK's own boto3 session; no call to Claude) and says where they
    came from, without them, or fails naming the settings to check."""
    pytest.importorskip("boto3")
    credentials, config = tmp_path / "credentials", tmp_path / "config"
    secret, token = "wJalrXUtnFEMI/K7MDENG/check-secret-key", "IQoJb3JpZ2luX2VjEFAKE/check+session"
    credentials.write_text(
        f"[{'base' if where == 'role' else 'default'}]\naws_access_key_id = AKIAFAKEFAKEFAKE0003\n"
        f"aws_secret_access_key = {secret}\naws_session_token = {token}\n"
        if where != "none"
        else ""
    )
    role = "role_arn = arn:aws:iam::123456789012:role/mcp\nsource_profile = base\nmax_attempts = 1\n"
    config.write_text(f"[default]\n{role}" if where == "role" else "")
    env = proxy_env(
        ANTHROPIC_BEDROCK_BASE_URL=fake_claude.url,
        AWS_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=str(credentials),
        AWS_CONFIG_FILE=str(config),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL_STS=fake_claude.url,
    )
    done = check("--provider", "bedrock", "--", *WEATHER, env=env)
    provider = done.stdout.split("provider: bedrock\n")[1].split("\n\n")[0]
    shown = [secret, token, "AKIAFAKEFAKEFAKE0003"]
    if where == "none":
        assert done.returncode == 1, done.stdout + done.stderr
        assert "FAILED: NoCredentialsError: Unable to locate credentials" in provider, provider
        assert "check the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)" in provider, provider
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        method = "assume-role" if where == "role" else "shared-credentials-file"
        assert f"  AWS credentials found ({method})" in provider, provider
        assert "not tried: the Bedrock client cannot count tokens" in provider, provider
    if where == "role":  # fetched from STS now, as the first request would
        assert len(fake_claude.sts_requests) == 1
        shown.extend(fake_claude.sts_credentials)
    assert [each for each in shown if each in done.stdout + done.stderr] == []
    assert fake_claude.platform_requests == []


def test_a_refused_vertex_token_names_the_google_credentials(fake_claude: FakeClaude) -> None:
    """A 401 from Vertex AI was answered with "check ANTHROPIC_API_KEY", a variable Vertex never reads."""
    env = proxy_env(
        ANTHROPIC_VERTEX_BASE_URL=fake_claude.url,
        CLOUD_ML_REGION="us-east5",
        ANTHROPIC_VERTEX_PROJECT_ID="proj-42",
        MCP_BACKFILL_VERTEX_ACCESS_TOKEN="ya29.not-the-right-token-0123456789",
    )
    fake_claude.api_key = TEST_API_KEY
    done = check("--provider", "vertex", "--mode", "fallback", "--", *WEATHER, env=env)
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert provider.startswith("  FAILED: AuthenticationError"), provider
    assert "ANTHROPIC_API_KEY" not in provider
    assert provider.endswith(
        "; check the Google credentials (MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials)"
    ), provider


def test_ctrl_c_ends_check_without_a_traceback() -> None:
    """Ctrl-C while `check` waited for a server printed a traceback of some forty lines."""
    argv = [sys.executable, "-m", "mcp_backfill", "check", "--provider", "mock", "--"]
    process = subprocess.Popen(
        [*argv, *python_server("silent_server.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=proxy_env(),
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    for line in process.stdout:  # unbuffered (PYTHONUNBUFFERED): each line as it is written
        if line.startswith("session through the proxy"):
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err, err[-2000:]


def test_an_unreachable_vertex_endpoint_names_its_variable() -> None:
    """A Vertex endpoint that cannot be reached was answered with "check ANTHROPIC_BASE_URL", which
    Vertex does not read."""
    env = proxy_env(
        ANTHROPIC_VERTEX_BASE_URL="http://127.0.0.1:9",
        CLOUD_ML_REGION="us-east5",
        ANTHROPIC_VERTEX_PROJECT_ID="proj-42",
        MCP_BACKFILL_VERTEX_ACCESS_TOKEN="ya29.some-token-0123456789",
    )
    done = check("--provider", "vertex", "--mode", "fallback", "--", *WEATHER, env=env)
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert provider.startswith("  FAILED: APIConnectionError"), provider
    assert provider.endswith("; check ANTHROPIC_VERTEX_BASE_URL and the network"), provider


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--provider", "mock", "--help", "--", "server"]])
def test_help_describes_check(args: list[str]) -> None:
    """`check --help` printed only its usage line, to stderr; the proxy's and `clients`' help is a
    description with examples, on stdout. Among other options, `--help` printed the proxy's help."""
    done = check(*args, env=proxy_env())
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert out.startswith("usage: mcp-backfill check")
    for part in ("configuration", "provider", "state store", "session through the proxy"):
        assert part in out
    assert "--client-capabilities" in out
    assert "none|sampling|sampling-tools" in out
    assert "`mcp-backfill --help`" in out  # where the proxy's options are described
    assert "examples:" in out
    assert "exit status" in out.lower()


def test_vertex_tokens_are_counted_with_application_default_credentials(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`check` counts tokens at Vertex's own path with the token google-auth minted, and never shows it."""
    minted = fake_claude.api_key = fake_claude.oauth_token
    env = proxy_env(**adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42")))
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "authenticated: claude-sonnet-5-5 counted" in done.stdout
    [counted] = fake_claude.count_tokens_requests
    assert counted.path == (
        "/projects/proj-42/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
    )
    assert counted.headers["authorization"] == f"Bearer {minted}"
    assert counted.body["model"] == "claude-sonnet-5-5"
    assert fake_claude.platform_requests == []  # nothing billable was sent
    assert minted not in done.stdout + done.stderr


def test_a_vertex_error_quoting_the_minted_token_is_redacted(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """An endpoint (a gateway) whose error quotes the request's headers had `check` print the access
    token google-auth minted from Application Default Credentials: only configured secrets were
    redacted from the provider's error."""
    minted = fake_claude.api_key = fake_claude.oauth_token
    fake_claude.enqueue_count_tokens(error_reply(403, "permission_error", "not allowed", echo_headers=True))
    env = proxy_env(**adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42")))
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert provider.startswith("  FAILED: PermissionDeniedError"), provider
    assert "Bearer ***" in provider, provider
    assert [r.headers["authorization"] for r in fake_claude.count_tokens_requests] == [f"Bearer {minted}"]
    assert minted not in done.stdout + done.stderr


def test_a_first_refresh_quoting_the_user_credentials_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The first refresh of user credentials refused by a token endpoint that quotes the request:
    `check` printed the refresh token, as the SDK refreshes the credentials it loads before it keeps
    them, where the redaction could not find them."""
    info = fake_claude.workforce_user_info(refresh_token=GOOGLE_SHAPED_REFRESH_TOKEN)
    fake_claude.oauth_echo_errors = True
    env = proxy_env(**adc_env(fake_claude, tmp_path, info), ANTHROPIC_VERTEX_PROJECT_ID="proj-42")
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert "refresh_token=***" in provider, provider
    assert len(fake_claude.token_requests) == 1
    for secret in (GOOGLE_SHAPED_REFRESH_TOKEN, str(info["client_secret"])):
        for form in (secret, urllib.parse.quote_plus(secret)):
            assert form not in done.stdout + done.stderr, form


def test_a_token_endpoint_quoting_a_service_accounts_signed_assertion_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A service account's refresh refused by a token endpoint that quotes the signature of the
    signed assertion (which stands for the private key until it expires): `check` printed it."""
    fake_claude.oauth_quote_signature = True
    env = proxy_env(
        **adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42")),
        ANTHROPIC_VERTEX_PROJECT_ID="proj-42",
    )
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert "JWT signature *** does not verify" in provider, provider
    [token_request] = fake_claude.token_requests
    signature = dict(urllib.parse.parse_qsl(token_request.raw_body.decode()))["assertion"].rpartition(".")[2]
    assert signature[:40] not in done.stdout + done.stderr


def test_a_token_endpoint_whose_host_does_not_resolve_is_named(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A typo in the key file's `token_uri`: `check` said "check the Google credentials and the
    network to where they come from", where the proxy says the name does not resolve and which
    setting holds it."""
    info = {**fake_claude.service_account_info("proj-42"), "token_uri": "http://token-host.invalid:1/token"}
    env = proxy_env(**adc_env(fake_claude, tmp_path, info))
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert "does not resolve: check the token endpoint of the Google credentials" in provider, provider
    assert "GOOGLE_APPLICATION_CREDENTIALS" in provider, provider
    assert fake_claude.count_tokens_requests == []


def test_vertex_credentials_that_name_no_project_are_told_the_variable_alone(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """User credentials name no project and ANTHROPIC_VERTEX_PROJECT_ID is not set: `check` said to
    set it, then "check ANTHROPIC_VERTEX_BASE_URL and the network", which were not at fault (nothing
    was sent anywhere)."""
    env = proxy_env(**adc_env(fake_claude, tmp_path, fake_claude.workforce_user_info()))
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert "set ANTHROPIC_VERTEX_PROJECT_ID" in provider, provider
    assert "ANTHROPIC_VERTEX_BASE_URL" not in provider, provider
    assert "network" not in provider, provider
    assert (fake_claude.token_requests, fake_claude.count_tokens_requests) == ([], [])


@pytest.mark.parametrize("failure", ["refused", "unreachable"])
def test_vertex_credentials_that_cannot_be_had_are_named(
    fake_claude: FakeClaude, tmp_path: Path, failure: str
) -> None:
    """google-auth's refresh refused (`RefreshError`) or its token endpoint out of reach
    (`TransportError`) were answered "check ANTHROPIC_VERTEX_BASE_URL and the network": the endpoint
    of Claude, which was never called, not the credentials."""
    info = fake_claude.service_account_info("proj-42")
    if failure == "refused":
        info["private_key_id"] = "0" * 40  # a key the token endpoint does not know
    else:
        fake_claude.oauth_outages = 100
    env = proxy_env(**adc_env(fake_claude, tmp_path, info))
    done = check("--provider", "vertex", "--", *WEATHER, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    provider = done.stdout.split("provider: vertex\n")[1].split("\n")[0]
    assert "ANTHROPIC_VERTEX_BASE_URL" not in provider, provider
    credentials = (
        "check the Google credentials (MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials)"
    )
    assert credentials in provider, provider
    assert fake_claude.count_tokens_requests == []
