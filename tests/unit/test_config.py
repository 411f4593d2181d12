"""Flags, environment variables and defaults -> one validated Config."""

from __future__ import annotations

import re

import pytest

from mcp_backfill.cli import parse_config
from mcp_backfill.config import Secret, upstream_environment
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import BY_FLAG, DEFAULTS, Allowance

KEY = {"ANTHROPIC_API_KEY": "sk-ant-unit-secret"}


def test_defaults() -> None:
    config = parse_config(["--", "server", "--flag"], KEY)
    assert config.upstream_command == ("server", "--flag")
    assert config.mode == "fallback"
    assert config.provider == "anthropic"
    assert config.model == DEFAULTS["model"]
    assert config.allowed_models == DEFAULTS["allowed_models"]
    assert config.max_tokens_cap == 16384
    assert config.audio == "reject"


def test_flags_beat_environment_which_beats_defaults() -> None:
    env = KEY | {"MCP_BACKFILL_MODE": "always", "MCP_BACKFILL_MAX_TOKENS_CAP": "100"}
    assert parse_config(["--", "s"], env).mode == "always"
    assert parse_config(["--mode", "off", "--", "s"], env).mode == "off"
    assert parse_config(["--", "s"], env).max_tokens_cap == 100
    assert parse_config(["--max-tokens-cap", "7", "--", "s"], env).max_tokens_cap == 7


def test_arguments_after_the_separator_belong_to_the_upstream() -> None:
    config = parse_config(["--mode", "always", "--", "server", "--mode", "x"], KEY)
    assert config.mode == "always"
    assert config.upstream_command == ("server", "--mode", "x")


def test_allowed_models_pin_and_default() -> None:
    pinned = parse_config(["--allowed-models", "claude-haiku-5-5", "--", "s"], KEY)
    assert pinned.allowed_models == ("claude-haiku-5-5",)
    assert pinned.model == "claude-haiku-5-5"
    with pytest.raises(ConfigError, match="not in --allowed-models"):
        parse_config(["--model", "claude-opus-5-5", "--allowed-models", "claude-haiku-5-5", "--", "s"], KEY)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--", "s"], {}, "ANTHROPIC_API_KEY"),
        ([], KEY, "no upstream server"),
        (["--max-tokens-cap", "zero", "--", "s"], KEY, "--max-tokens-cap"),
        (["--", "s"], KEY | {"MCP_BACKFILL_MODE": "sometimes"}, "MCP_BACKFILL_MODE"),
        (["--max-tokens-cap", "0", "--", "s"], KEY, "at least 1"),
        (["--shutdown-grace", "-1", "--", "s"], KEY, "negative"),
        (["--upstream-url", "http://h/mcp", "--", "s"], KEY, "not both"),
        (["--upstream-url", "h:8000/mcp"], KEY, "http:// or https://"),
        (["--upstream-header", "X-A: 1", "--", "s"], KEY, "needs --upstream-url"),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "no colon"], KEY, "Name: value"),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "Bad Name: v"], KEY, "invalid header name"),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "Mcp-Session-Id: s"], KEY, "itself"),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "Mcp-Param-X: s"], KEY, "itself"),
        (
            ["--upstream-url", "http://h/mcp", "--upstream-header", "X-Api-Key: sk-ant-unit-secret"],
            KEY,
            "Claude credentials",
        ),
    ],
)
def test_invalid_configurations_are_refused_with_a_useful_message(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, env)


def test_mock_provider_needs_no_key() -> None:
    assert parse_config(["--provider", "mock", "--", "s"], {}).api_key is None


def test_secrets_stay_out_of_repr_and_the_upstream_environment() -> None:
    config = parse_config(["--", "s"], KEY)
    assert "sk-ant-unit-secret" not in repr(config)
    assert config.api_key == Secret("sk-ant-unit-secret")
    assert config.secrets() == ("sk-ant-unit-secret",)
    env = upstream_environment({"PATH": "/bin", "ANTHROPIC_API_KEY": "k", "MCP_BACKFILL_AUTH_TOKEN": "t"})
    assert env == {"PATH": "/bin"}


def test_limits_budgets_and_audit_defaults() -> None:
    config = parse_config(["--", "s"], KEY)
    assert (config.max_messages, config.max_text_bytes, config.max_binary_bytes) == (
        1000,
        4 * 1024 * 1024,
        20 * 1024 * 1024,
    )
    assert (config.max_tools, config.max_tool_calls) == (128, 16)
    assert (config.rate_limit, config.max_concurrent_sampling) == (600, 4)
    assert (config.budget_tokens, config.session_budget_tokens) == ((), (Allowance(5_000_000),))
    assert (config.client_budget_tokens, config.client_rate_limit, config.client_max_concurrent_sampling) == (
        (),
        0,
        0,
    )
    assert config.allow_model_upgrade is False
    assert (config.audit_log, config.audit_content, config.prompt_cache) == (None, False, True)


@pytest.mark.parametrize(
    ("flag", "field", "value"),
    [
        ("--max-messages", "max_messages", 5),
        ("--max-text-bytes", "max_text_bytes", 100),
        ("--max-binary-bytes", "max_binary_bytes", 0),
        ("--max-tools", "max_tools", 3),
        ("--max-tool-calls", "max_tool_calls", 2),
        ("--rate-limit", "rate_limit", 0),
        ("--max-concurrent-sampling", "max_concurrent_sampling", 1),
    ],
)
def test_each_limit_has_a_flag_and_an_environment_variable(flag: str, field: str, value: int) -> None:
    from_flag = parse_config([flag, str(value), "--", "s"], KEY)
    assert getattr(from_flag, field) == value
    env = KEY | {"MCP_BACKFILL_" + flag[2:].replace("-", "_").upper(): str(value)}
    assert getattr(parse_config(["--", "s"], env), field) == value


@pytest.mark.parametrize(
    ("flag", "field", "serve"),
    [
        ("--budget-tokens", "budget_tokens", False),
        ("--session-budget-tokens", "session_budget_tokens", False),
        ("--client-budget-tokens", "client_budget_tokens", True),
    ],
)
def test_each_budget_has_a_flag_and_an_environment_variable(flag: str, field: str, serve: bool) -> None:
    command = ["serve"] if serve else []
    expected = (Allowance(2000), Allowance(100, "day"))
    assert getattr(parse_config([*command, flag, "2000,100/day", "--", "s"], KEY), field) == expected
    env = KEY | {"MCP_BACKFILL_" + flag[2:].replace("-", "_").upper(): "2000, 100/day"}
    assert getattr(parse_config([*command, "--", "s"], env), field) == expected
    assert getattr(parse_config([*command, flag, "0", "--", "s"], KEY), field) == ()


def test_boolean_switches_from_flags_and_environment() -> None:
    flags = parse_config(["--audit-log", "a.jsonl", "--audit-content", "--no-prompt-cache", "--", "s"], KEY)
    assert (flags.audit_log, flags.audit_content, flags.prompt_cache) == ("a.jsonl", True, False)
    env = KEY | {
        "MCP_BACKFILL_AUDIT_LOG": "b.jsonl",
        "MCP_BACKFILL_AUDIT_CONTENT": "yes",
        "MCP_BACKFILL_NO_PROMPT_CACHE": "1",
    }
    from_env = parse_config(["--", "s"], env)
    assert (from_env.audit_log, from_env.audit_content, from_env.prompt_cache) == ("b.jsonl", True, False)
    assert parse_config(["--", "s"], KEY | {"MCP_BACKFILL_NO_PROMPT_CACHE": "false"}).prompt_cache


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--max-messages", "0", "--", "s"],
            KEY,
            "--max-messages / MCP_BACKFILL_MAX_MESSAGES: must be at least 1",
        ),
        (["--max-tool-calls", "0", "--", "s"], KEY, "MCP_BACKFILL_MAX_TOOL_CALLS: must be at least 1"),
        (["--max-concurrent-sampling", "0", "--", "s"], KEY, "--max-concurrent-sampling"),
        (["--budget-tokens", "-5", "--", "s"], KEY, "--budget-tokens / MCP_BACKFILL_BUDGET_TOKENS: invalid"),
        (["serve", "--client-budget-tokens", "9/month", "--", "s"], KEY, "N/hour|per hour, day, week"),
        (["--rate-limit", "fast", "--", "s"], KEY, "--rate-limit"),
        (["--audit-content", "--", "s"], KEY, "needs --audit-log / MCP_BACKFILL_AUDIT_LOG"),
        (["--", "s"], KEY | {"MCP_BACKFILL_AUDIT_CONTENT": "maybe"}, "MCP_BACKFILL_AUDIT_CONTENT"),
    ],
)
def test_invalid_limits_are_refused(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, env)


def test_upstream_url_with_headers_from_flags_or_environment() -> None:
    env = KEY | {
        "MCP_BACKFILL_UPSTREAM_URL": "https://mcp.example.com/mcp",
        "MCP_BACKFILL_UPSTREAM_HEADERS": "Authorization: Bearer tok-123\n\nX-Team:  blue \n",
    }
    config = parse_config([], env)
    assert config.upstream_url == "https://mcp.example.com/mcp"
    assert config.upstream_command == ()
    assert config.upstream_headers == (("Authorization", "Bearer tok-123"), ("X-Team", "blue"))
    flagged = parse_config(["--upstream-header", "X-Only: this"], env)
    assert flagged.upstream_headers == (("X-Only", "this"),)  # flags replace the variable's list
    overridden = parse_config(["--upstream-url", "http://127.0.0.1:9/mcp"], env)
    assert overridden.upstream_url == "http://127.0.0.1:9/mcp"


def test_credential_headers_are_redacted_and_kept_out_of_repr() -> None:
    config = parse_config(
        [
            *("--upstream-url", "http://h/mcp"),
            *("--upstream-header", "Authorization: Bearer tok-123"),
            *("--upstream-header", "X-Region: eu-west"),
        ],
        KEY,
    )
    assert "tok-123" not in repr(config)
    assert set(config.secrets()) == {"sk-ant-unit-secret", "Bearer tok-123", "tok-123"}


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@redis:6379/0",
        "redis://redis:6379/0?password=hunter2",
        "redis://alice:hunter%32@redis:6379/0",
        "rediss://redis:6379/0?ssl_password=hunter%32&db=1",
    ],
)
def test_the_state_stores_password_is_redacted_wherever_the_url_gives_it(url: str) -> None:
    config = parse_config(["--state-store", url, "--", "s"], KEY)
    assert "hunter2" in config.secrets()  # as redis-py sends it (percent-decoded)
    assert "hunter2" not in repr(config)


@pytest.mark.parametrize("flag", ["--api-header", "--upstream-header"])
def test_an_invalid_header_name_is_not_quoted(flag: str) -> None:
    # A mistyped separator puts the credential before the first colon: `X-Api-Key=tok:en`.
    argv = ["--upstream-url", "http://h/mcp", flag, "X-Api-Key=secret-tok:en"]
    with pytest.raises(ConfigError, match="invalid header name") as caught:
        parse_config(argv, KEY)
    assert "secret-tok" not in str(caught.value)


def test_a_refused_upstream_url_is_not_quoted() -> None:
    with pytest.raises(ConfigError, match="--upstream-url") as caught:
        parse_config(["--upstream-url", "ftp://user:TOPSECRETPASS@h.example/mcp"], KEY)
    assert "TOPSECRETPASS" not in str(caught.value)


def test_the_credentials_of_the_upstream_url_are_redacted() -> None:
    url = "https://user:TOPSECRETPASS@h.example/mcp?api_key=QUERYSECRET&region=eu-west"
    secrets = parse_config(["--upstream-url", url], KEY).secrets()
    assert {"TOPSECRETPASS", "QUERYSECRET"} <= set(secrets)
    assert "eu-west" not in secrets  # a parameter whose name is no credential's


TOKEN = "a-long-enough-token-123"


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--upstream-url", "http://h/mcp", "--", "s"], KEY),
        (["--upstream-header", "X-A: 1", "--", "s"], KEY),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "Bad Name: v"], KEY),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "Mcp-Session-Id: s"], KEY),
        (["--upstream-url", "http://h/mcp", "--upstream-header", "X-Api-Key: sk-ant-unit-secret"], KEY),
        (["--api-header", "X-A: a\nb", "--", "s"], KEY),
        (["--model", "claude-opus-5-5", "--allowed-models", "claude-haiku-5-5", "--", "s"], KEY),
        (["--", "s"], KEY | {"MCP_BACKFILL_AUDIT_CONTENT": "1"}),
        (["serve", "--forward-authorization", "--", "s"], KEY),
        (["serve", "--forward-authorization", "--auth-token", TOKEN, "--upstream-url", "http://h/mcp"], KEY),
        (["serve", "--client-tokens", f"a={TOKEN},a={TOKEN}x", "--", "s"], KEY),
        (["serve", "--client-tokens", f"a={TOKEN},b={TOKEN}", "--", "s"], KEY),
        (["serve", "--client-tokens", "a=short", "--", "s"], KEY),
        (["serve", "--host", "10.0.0.5", "--", "s"], KEY),
        (["serve", "--", "s"], KEY | {"MCP_BACKFILL_PORT": "70000"}),
    ],
)
def test_errors_name_each_option_by_its_flag_and_its_variable(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(argv, env)
    message = str(caught.value)
    flags = [flag for flag in re.findall(r"--[a-z][a-z-]+", message) if flag in BY_FLAG]
    assert flags, message
    for flag in flags:
        assert f"{flag} / {BY_FLAG[flag].env}" in message, message
