"""`mcp-backfill serve` settings, access checks and the metrics text: pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mcp_backfill.cli import parse_config
from mcp_backfill.config import is_loopback
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import Allowance
from mcp_backfill.sampling.spend import Spend
from mcp_backfill.sidecar.metrics import Metrics
from mcp_backfill.sidecar.security import (
    AccessPolicy,
    default_allowed_hosts,
    default_allowed_origins,
    host_allowed,
    origin_allowed,
)
from mcp_backfill.sidecar.server import spend_gauges
from tests.defaults import SPEND

KEY = {"ANTHROPIC_API_KEY": "sk-ant-unit-secret"}
TOKEN = "a-long-enough-token-123"


def test_serve_defaults_and_the_plain_command_is_unchanged() -> None:
    served = parse_config(["serve", "--", "server"], KEY)
    assert (served.front, served.host, served.port) == ("http", "127.0.0.1", 8080)
    assert served.auth_token is None
    assert (served.max_sessions, served.session_idle_timeout, served.drain_timeout) == (100, 1800.0, 10.0)
    plain = parse_config(["--", "serve"], KEY)
    assert plain.front == "stdio"
    assert plain.upstream_command == ("serve",)


def test_serve_options_come_from_flags_or_environment() -> None:
    env = KEY | {
        "MCP_BACKFILL_PORT": "9000",
        "MCP_BACKFILL_AUTH_TOKEN": TOKEN,
        "MCP_BACKFILL_ALLOWED_HOSTS": "a:*, b:1",
        "MCP_BACKFILL_ALLOW_UNAUTHENTICATED": "yes",
        "MCP_BACKFILL_SESSION_IDLE_TIMEOUT": "0",
    }
    config = parse_config(["serve", "--port", "9001", "--max-sessions", "3", "--", "s"], env)
    assert config.port == 9001
    assert config.auth_token is not None
    assert config.auth_token.value == TOKEN
    assert TOKEN not in repr(config)
    assert TOKEN in config.secrets()
    assert config.allowed_hosts == ("a:*", "b:1")
    assert config.allow_unauthenticated is True
    assert (config.max_sessions, config.session_idle_timeout) == (3, 0.0)


def test_stdio_mode_has_no_serve_flags() -> None:
    with pytest.raises(SystemExit):
        parse_config(["--port", "1", "--", "s"], KEY)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["serve", "--host", "0.0.0.0", "--", "s"], {}, "--allow-unauthenticated"),
        (["serve", "--host", "10.0.0.5", "--", "s"], {}, "MCP_BACKFILL_AUTH_TOKEN"),
        (["serve", "--auth-token", "short", "--", "s"], {}, "at least 16"),
        (["serve", "--port", "70000", "--", "s"], {}, "--port"),
        (["serve", "--max-sessions", "0", "--", "s"], {}, "--max-sessions"),
        (["serve", "--", "s"], {"MCP_BACKFILL_ALLOW_UNAUTHENTICATED": "maybe"}, "ALLOW_UNAUTHENTICATED"),
    ],
)
def test_bad_serve_settings_are_refused(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, KEY | env)


def test_non_loopback_is_allowed_with_a_token_or_the_explicit_flag() -> None:
    assert (
        parse_config(["serve", "--host", "0.0.0.0", "--auth-token", TOKEN, "--", "s"], KEY).host == "0.0.0.0"
    )
    assert (
        parse_config(["serve", "--host", "0.0.0.0", "--allow-unauthenticated", "--", "s"], KEY).port == 8080
    )


def test_non_loopback_is_allowed_with_named_client_tokens_alone() -> None:
    """Named tokens authenticate every caller as well as the shared one does (and `--auth-token` may
    stay beside them, docs/limits.md): refusing to serve without the shared one forced a token
    nobody is charged by name for, or `--allow-unauthenticated`."""
    env = KEY | {"MCP_BACKFILL_CLIENT_TOKENS": f"alice={TOKEN}"}
    config = parse_config(["serve", "--host", "0.0.0.0", "--", "s"], env)
    assert (config.host, config.auth_token, config.allow_unauthenticated) == ("0.0.0.0", None, False)
    assert [entry.name for entry in config.client_tokens] == ["alice"]


def test_the_refusal_to_serve_unauthenticated_names_every_way_out() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(["serve", "--host", "0.0.0.0", "--", "s"], KEY)
    for name in ("--auth-token", "--client-tokens", "MCP_BACKFILL_CLIENT_TOKENS", "--allow-unauthenticated"):
        assert name in str(refused.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("example.com", False),
        ("192.168.1.2", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_host_and_origin_rules_follow_the_sdk() -> None:
    policy = AccessPolicy(default_allowed_hosts(8080), default_allowed_origins())
    assert host_allowed("127.0.0.1:8080", policy)
    assert host_allowed("LOCALHOST:8080", policy)
    assert host_allowed("[::1]:8080", policy)
    assert not host_allowed("127.0.0.1:8081", policy)
    assert not host_allowed("evil.example.com", policy)
    assert not host_allowed(None, policy)
    assert origin_allowed(None, policy)
    assert origin_allowed("http://localhost:3000", policy)
    assert origin_allowed("http://127.0.0.1", policy)
    assert not origin_allowed("http://localhost.evil.com:3000", policy)
    assert not origin_allowed("http://localhost:3000x", policy)
    assert not origin_allowed("https://evil.example.com", policy)
    anything = AccessPolicy(("*",), ("*",))
    assert host_allowed("whatever:1", anything)
    assert origin_allowed("https://x", anything)


def test_client_identity_of_a_caller() -> None:
    hosts, origins = default_allowed_hosts(8080), default_allowed_origins()
    open_policy = AccessPolicy(hosts, origins)
    assert open_policy.identify(None) == open_policy.identify(f"Bearer {TOKEN}") == "anonymous"
    tokens = AccessPolicy(hosts, origins, (("default", TOKEN), ("alice", "alice-token-0123456789")))
    assert tokens.identify(f"Bearer {TOKEN}") == "default"
    assert tokens.identify(f"bearer   {TOKEN}") == "default"
    assert tokens.identify("Bearer alice-token-0123456789") == "alice"
    for wrong in (None, TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer \udcff"):
        assert tokens.identify(wrong) is None
    forwarding = AccessPolicy(hosts, origins, forward_authorization=True)
    alice, bob = forwarding.identify("Bearer alice"), forwarding.identify("Bearer bob")
    assert alice is not None
    assert alice.startswith("authorization:")
    assert "alice" not in alice
    assert alice != bob
    assert forwarding.identify(None) == "anonymous"


def test_metrics_text_exposition() -> None:
    metrics = Metrics()
    tokens = {
        "input_tokens": 10,
        "output_tokens": 4,
        "cache_read_input_tokens": 7,
        "cache_creation_input_tokens": 0,
    }
    metrics.sampling_done(outcome="answered", model="m", latency=0.3, tokens=tokens, client="default")
    metrics.sampling_done(
        outcome="failed", model='we"ird', latency=12.0, tokens={}, client="authorization:ab12"
    )
    metrics.messages.inc(direction="to_client")
    metrics.gauge("mcp_backfill_active_sessions", "sessions", lambda: [((), 2)])
    text = metrics.render()
    assert "# TYPE mcp_backfill_sampling_requests_total counter" in text
    assert 'mcp_backfill_sampling_requests_total{client="default",model="m",outcome="answered"} 1' in text
    # Forwarded-credential identities share one label value (their digests are unbounded).
    assert (
        'mcp_backfill_sampling_requests_total{client="forwarded",model="we\\"ird",outcome="failed"} 1' in text
    )
    assert 'mcp_backfill_sampling_tokens_total{client="default",counter="input_tokens",model="m"} 10' in text
    assert (
        'mcp_backfill_sampling_tokens_total{client="default",counter="cache_read_input_tokens",model="m"} 7'
        in text
    )
    assert '{counter="cache_creation_input_tokens"' not in text  # a counter at 0 makes no series
    assert 'mcp_backfill_claude_latency_seconds_bucket{model="m",le="0.25"} 0' in text
    assert 'mcp_backfill_claude_latency_seconds_bucket{model="m",le="0.5"} 1' in text
    assert 'mcp_backfill_claude_latency_seconds_bucket{model="m",le="+Inf"} 1' in text
    assert 'mcp_backfill_claude_latency_seconds_sum{model="m"} 0.3' in text
    assert 'mcp_backfill_claude_latency_seconds_bucket{model="we\\"ird",le="10"} 0' in text
    assert 'mcp_backfill_claude_latency_seconds_bucket{model="we\\"ird",le="30"} 1' in text
    assert "mcp_backfill_active_sessions 2" in text
    assert text.endswith("\n")


def test_forwarded_callers_make_one_budget_series_with_the_most_used() -> None:
    """`--forward-authorization` with per-client budgets: each credential is its own client, all
    labelled `forwarded`. One series each (a repeated series is an invalid exposition), holding the
    most any of them used, so used / limit is the share of one caller's budget."""
    policy = AccessPolicy(allowed_hosts=(), allowed_origins=(), forward_authorization=True)
    spend = Spend(replace(SPEND, rate_limit=0, client_budget=(Allowance(1000, "day"),)))
    for n, used in enumerate((300, 700, 100)):
        identity = policy.identify(f"Bearer user-token-{n}")
        assert identity is not None
        spend.client(identity).budget.charge({"input_tokens": used})
    metrics = Metrics()
    spend_gauges(metrics, spend)
    samples = [line for line in metrics.render().splitlines() if 'client="forwarded"' in line]
    assert samples == [
        'mcp_backfill_budget_limit_tokens{budget="client",client="forwarded",window="day"} 1000',
        'mcp_backfill_budget_used_tokens{budget="client",client="forwarded",window="day"} 700',
    ]
