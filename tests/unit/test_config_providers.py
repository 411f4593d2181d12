"""Flags for providers, gateway headers, retries and deadlines -> Config."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_backfill.cli import parse_config
from mcp_backfill.config import upstream_environment
from mcp_backfill.errors import ConfigError

KEY = {"ANTHROPIC_API_KEY": "sk-ant-unit-secret"}


def test_retry_and_deadline_defaults_and_overrides() -> None:
    config = parse_config(["--", "s"], KEY)
    assert (config.sampling_timeout, config.retry_max_attempts) == (50.0, 6)
    assert (config.retry_base_delay, config.retry_max_delay) == (0.5, 10.0)
    env = KEY | {"MCP_BACKFILL_SAMPLING_TIMEOUT": "0", "MCP_BACKFILL_RETRY_MAX_ATTEMPTS": "2"}
    tuned = parse_config(["--retry-base-delay", "0.01", "--retry-max-delay", "0.1", "--", "s"], env)
    assert (tuned.sampling_timeout, tuned.retry_max_attempts) == (0.0, 2)
    assert (tuned.retry_base_delay, tuned.retry_max_delay) == (0.01, 0.1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sampling-timeout", "-1"], "--sampling-timeout"),
        (["--sampling-timeout", "soon"], "--sampling-timeout"),
        (["--retry-max-attempts", "0"], "at least 1"),
        (["--retry-base-delay", "-0.1"], "must not be negative"),
        (["--api-header", "no colon here"], "--api-header"),
        (["--api-header", "Bad Name: x"], "invalid header"),
    ],
)
def test_invalid_values_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config([*argv, "--", "s"], KEY)


def test_api_headers_from_flags_or_environment_lines() -> None:
    flags = parse_config(
        ["--api-header", "X-Gateway-Key: gw-secret-1", "--api-header", "Accept-Language: en, fr", "--", "s"],
        KEY,
    )
    assert flags.api_headers == (("X-Gateway-Key", "gw-secret-1"), ("Accept-Language", "en, fr"))
    env = KEY | {"MCP_BACKFILL_API_HEADERS": "X-Gateway-Key: gw-secret-2\n\nX-Route: a, b\n"}
    from_env = parse_config(["--", "s"], env)
    assert from_env.api_headers == (("X-Gateway-Key", "gw-secret-2"), ("X-Route", "a, b"))
    # Header values may be credentials: they are redacted from logs like the API key.
    assert "gw-secret-2" in from_env.secrets()
    assert "gw-secret-2" not in repr(from_env)


def test_cloud_providers_need_no_anthropic_key() -> None:
    bedrock = parse_config(["--provider", "bedrock", "--", "s"], {"AWS_BEARER_TOKEN_BEDROCK": "bedrock-tok"})
    assert bedrock.provider == "bedrock"
    assert "bedrock-tok" in bedrock.secrets()
    vertex = parse_config(
        ["--provider", "vertex", "--", "s"], {"MCP_BACKFILL_VERTEX_ACCESS_TOKEN": "ya29.vertex-token"}
    )
    assert vertex.vertex_access_token is not None
    assert "ya29.vertex-token" in vertex.secrets()
    assert "ya29.vertex-token" not in repr(vertex)


def test_a_provider_native_model_pins_it() -> None:
    native = "global.anthropic.claude-sonnet-5-5"
    config = parse_config(["--provider", "bedrock", "--model", native, "--", "s"], {})
    assert (config.model, config.allowed_models) == (native, (native,))
    # An explicit --allowed-models list is still enforced.
    with pytest.raises(ConfigError, match="not in --allowed-models"):
        parse_config(["--model", native, "--allowed-models", "claude-haiku-5-5", "--", "s"], KEY)


def test_vertex_token_stays_away_from_the_upstream() -> None:
    env = {"MCP_BACKFILL_VERTEX_ACCESS_TOKEN": "ya29.x", "AWS_REGION": "eu-west-1", "PATH": "/bin"}
    assert upstream_environment(env) == {"AWS_REGION": "eu-west-1", "PATH": "/bin"}


def test_anthropic_custom_headers_values_are_secrets() -> None:
    env = KEY | {"ANTHROPIC_CUSTOM_HEADERS": "X-Gateway-Key: gw-0123456789\nX-Other:  other-0123456789 "}
    config = parse_config(["--", "s"], env)
    assert {"gw-0123456789", "other-0123456789"} <= set(config.secrets())
    assert "gw-0123456789" not in repr(config)


def test_the_bare_token_of_a_credential_api_header_is_a_secret_too() -> None:
    """A gateway that refuses `Bearer <token>` may quote the token alone in its error, which reaches
    the server, the log and the audit log: the token is redacted, as `--upstream-header`'s is."""
    argv = ["--api-header", "X-Gateway-Authorization: Bearer gw-token-0123", "--", "s"]
    env = KEY | {"ANTHROPIC_CUSTOM_HEADERS": "Authorization: Bearer custom-token-4567\nX-Route: eu west"}
    secrets = set(parse_config(argv, env).secrets())
    assert {
        "Bearer gw-token-0123",
        "gw-token-0123",
        "Bearer custom-token-4567",
        "custom-token-4567",
    } <= secrets
    assert "eu west" in secrets
    assert "west" not in secrets  # a header that is no credential is a secret whole only


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        ("http://127.0.0.1:8O80", "numeric port"),  # a letter O for a zero
        ("localhost:8080", "http:// or https://"),
        ("http://[::1", "http:// or https://"),
        ("https://gw-user:gw-password-123@gateway.example/v1", "must not carry credentials"),
    ],
)
def test_a_base_url_that_cannot_work_is_refused_at_startup(base_url: str, message: str) -> None:
    """It used to be taken as it was: every sampling request then failed with an internal error, or
    was retried as unreachable, or (with credentials in it) went without the API key."""
    with pytest.raises(ConfigError, match=message) as refused:
        parse_config(["--", "s"], KEY | {"ANTHROPIC_BASE_URL": base_url})
    assert "gw-password-123" not in str(refused.value)
    parse_config(["--provider", "mock", "--", "s"], KEY | {"ANTHROPIC_BASE_URL": base_url})  # unused: fine


def test_a_vertex_token_with_a_line_break_is_refused_naming_its_variables(tmp_path: Path) -> None:
    """Like the Anthropic key: a token file of two lines made the Authorization header unsendable,
    and every call a connection error."""
    token = tmp_path / "token"
    token.write_text("ya29.FIRST-0123456789\nya29.SECOND-0123456789\n")
    env = {"MCP_BACKFILL_VERTEX_ACCESS_TOKEN_FILE": str(token), "CLOUD_ML_REGION": "us-east5"}
    with pytest.raises(ConfigError, match="MCP_BACKFILL_VERTEX_ACCESS_TOKEN holds a line break") as caught:
        parse_config(["--provider", "vertex", "--", "s"], env)
    assert "MCP_BACKFILL_VERTEX_ACCESS_TOKEN_FILE" in str(caught.value)
    assert "FIRST" not in str(caught.value)


@pytest.mark.parametrize(
    ("provider", "variable"),
    [("anthropic", "ANTHROPIC_BASE_URL"), ("bedrock", "ANTHROPIC_BEDROCK_BASE_URL")],
)
def test_a_credential_in_the_api_base_urls_query_is_redacted(provider: str, variable: str) -> None:
    """A gateway may take its key in the query (`?api_key=`); the base URL's user information is
    refused, but its query's credentials were neither refused nor redacted."""
    env = KEY | {
        "AWS_BEARER_TOKEN_BEDROCK": "bedrock-tok",
        variable: "https://gw.example/anthropic?api_key=gw-query-secret-1&region=eu",
    }
    config = parse_config(["--provider", provider, "--", "s"], env)
    assert "gw-query-secret-1" in config.secrets()
    assert "eu" not in config.secrets()
