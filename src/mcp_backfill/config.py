"""One validated `Config`, built from command-line flags and `MCP_BACKFILL_*` environment variables.

Precedence: flag > environment variable > default. Secrets (the Claude API key) are read from
the environment only and kept out of `repr()` so a logged config can never leak them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from mcp_backfill.errors import ConfigError

Mode = Literal["fallback", "always", "off"]
ProviderName = Literal["anthropic", "bedrock", "vertex", "mock"]
LogFormat = Literal["text", "json"]
AudioPolicy = Literal["reject", "placeholder"]
Era = Literal["auto", "handshake"]
# How clients reach the proxy: its own stdin/stdout, or streamable HTTP (`mcp-backfill serve`).
Front = Literal["stdio", "http"]

MODES: tuple[Mode, ...] = ("fallback", "always", "off")
PROVIDERS: tuple[ProviderName, ...] = ("anthropic", "bedrock", "vertex", "mock")
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
AUDIO_POLICIES: tuple[AudioPolicy, ...] = ("reject", "placeholder")
ERAS: tuple[Era, ...] = ("auto", "handshake")

DEFAULT_MODEL = "claude-sonnet-5-5"
# The tiers model preferences may choose from when the operator does not restrict them.
DEFAULT_ALLOWED_MODELS: tuple[str, ...] = ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5")

# Per-request limits (see sampling/limits.py) and spending controls (see sampling/spend.py).
DEFAULT_MAX_TOKENS_CAP = 16384
DEFAULT_MAX_MESSAGES = 1000
DEFAULT_MAX_TEXT_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BINARY_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_TOOLS = 128
DEFAULT_MAX_TOOL_CALLS = 16
DEFAULT_RATE_LIMIT = 600
"""Sampling requests per minute, per process; 0 turns the rate limit off."""
DEFAULT_MAX_CONCURRENT_SAMPLING = 4
DEFAULT_BUDGET_TOKENS = 0
"""Tokens per process; 0 means no process-wide budget."""
DEFAULT_SESSION_BUDGET_TOKENS = 5_000_000
"""Tokens per client session; 0 means no per-session budget."""
# Retries and deadlines (README "Retries and deadlines"). 50 s leaves room inside the 60 s that
# MCP SDK servers (TypeScript's DEFAULT_REQUEST_TIMEOUT_MSEC, and most others) wait for an answer.
DEFAULT_SAMPLING_TIMEOUT = 50.0
DEFAULT_RETRY_MAX_ATTEMPTS = 6
DEFAULT_RETRY_BASE_DELAY = 0.5
DEFAULT_RETRY_MAX_DELAY = 10.0
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

ENV_PREFIX = "MCP_BACKFILL_"
# Environment variables that hold credentials: never logged, never passed to the upstream.
SECRET_ENV_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "MCP_BACKFILL_AUTH_TOKEN",
    "MCP_BACKFILL_VERTEX_ACCESS_TOKEN",
)
# Cloud credentials the Bedrock/Vertex clients read themselves: kept out of logs (redacted), but
# still passed to the upstream, which may be a cloud tool that needs them for its own work.
PLATFORM_SECRET_ENV_VARS = ("AWS_BEARER_TOKEN_BEDROCK", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# A header name is an HTTP token (RFC 9110 section 5.6.2).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Upstream headers whose values are credentials: kept out of the logs like the API key.
_CREDENTIAL_HEADER = re.compile(r"auth|token|key|secret|cookie|session|password", re.IGNORECASE)
# Headers the proxy sets itself on every upstream request (the MCP ones are computed per message).
RESERVED_UPSTREAM_HEADERS = frozenset(
    {
        "accept",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "host",
        "last-event-id",
        "mcp-session-id",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
    }
)


@dataclass(frozen=True)
class Secret:
    """A credential whose value never appears in `repr()` or `str()`."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class Config:
    """Everything the proxy needs to run; immutable once built."""

    upstream_command: tuple[str, ...] = ()
    # An HTTP upstream instead of a command: its streamable-HTTP endpoint, and headers to send it.
    upstream_url: str | None = None
    upstream_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold tokens
    mode: Mode = "fallback"
    era: Era = "auto"
    max_input_rounds: int = 10
    input_stash_ttl: float = 300.0
    provider: ProviderName = "anthropic"
    model: str = DEFAULT_MODEL
    allowed_models: tuple[str, ...] = DEFAULT_ALLOWED_MODELS
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP
    audio: AudioPolicy = "reject"
    max_messages: int = DEFAULT_MAX_MESSAGES
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    max_binary_bytes: int = DEFAULT_MAX_BINARY_BYTES
    max_tools: int = DEFAULT_MAX_TOOLS
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    rate_limit: int = DEFAULT_RATE_LIMIT
    max_concurrent_sampling: int = DEFAULT_MAX_CONCURRENT_SAMPLING
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    session_budget_tokens: int = DEFAULT_SESSION_BUDGET_TOKENS
    audit_log: str | None = None
    audit_content: bool = False
    prompt_cache: bool = True
    max_message_bytes: int = 32 * 1024 * 1024
    shutdown_grace: float = 2.0
    log_level: str = "info"
    log_format: LogFormat = "text"
    api_key: Secret | None = None
    # Passed through to the anthropic SDK; read from ANTHROPIC_BASE_URL by default.
    api_base_url: str | None = None
    # Extra HTTP headers on every Claude API call (gateways); the values are treated as secrets.
    api_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Seconds one sampling request may take, retries included; 0 = no deadline.
    sampling_timeout: float = DEFAULT_SAMPLING_TIMEOUT
    retry_max_attempts: int = DEFAULT_RETRY_MAX_ATTEMPTS
    retry_base_delay: float = DEFAULT_RETRY_BASE_DELAY
    retry_max_delay: float = DEFAULT_RETRY_MAX_DELAY
    # --provider vertex: a ready OAuth access token instead of Application Default Credentials.
    vertex_access_token: Secret | None = None
    # Cloud credentials found in the environment, only so that logs can redact them.
    platform_secrets: tuple[Secret, ...] = ()
    # `mcp-backfill serve`: the streamable-HTTP front and its security and operations settings.
    front: Front = "stdio"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port (logged at startup)
    auth_token: Secret | None = None
    allow_unauthenticated: bool = False
    # Empty: the defaults for the bound address (loopback names with the bound port).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_sessions: int = 100
    session_idle_timeout: float = 1800.0  # 0: never reap idle sessions
    drain_timeout: float = 10.0
    # serve --upstream-url: pass the HTTP client's own Authorization header on to the upstream.
    forward_authorization: bool = False

    def __post_init__(self) -> None:
        if not self.upstream_command and not self.upstream_url:
            raise ConfigError(
                "no upstream server: give its command after `--`, e.g. `mcp-backfill -- python server.py`, "
                "or its URL, e.g. `mcp-backfill --upstream-url http://127.0.0.1:8000/mcp`"
            )
        if self.upstream_command and self.upstream_url:
            raise ConfigError(
                "two upstream servers: give either --upstream-url or a command after `--`, not both"
            )
        if self.upstream_url is not None:
            check_upstream_url(self.upstream_url)
        elif self.upstream_headers:
            raise ConfigError("--upstream-header needs --upstream-url (a command upstream gets no headers)")
        for name, header_value in self.upstream_headers:
            check_upstream_header(name, header_value)
            if any(secret in header_value for secret in self._proxy_secrets()):
                raise ConfigError(
                    f"--upstream-header {name!r} would send the proxy's Claude credentials to the upstream; "
                    "refusing"
                )
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.era not in ERAS:
            raise ConfigError(f"--era must be one of {', '.join(ERAS)}, not {self.era!r}")
        if self.max_input_rounds < 1:
            raise ConfigError("--max-input-rounds must be at least 1")
        if self.input_stash_ttl <= 0:
            raise ConfigError("--input-stash-ttl must be positive")
        if self.provider not in PROVIDERS:
            raise ConfigError(f"--provider must be one of {', '.join(PROVIDERS)}, not {self.provider!r}")
        if not self.allowed_models:
            raise ConfigError("--allowed-models must name at least one model")
        if self.model not in self.allowed_models:
            raise ConfigError(
                f"--model {self.model!r} is not in --allowed-models ({', '.join(self.allowed_models)})"
            )
        if self.max_tokens_cap < 1:
            raise ConfigError("--max-tokens-cap must be at least 1")
        for flag, value, minimum in (
            ("--max-messages", self.max_messages, 1),
            ("--max-text-bytes", self.max_text_bytes, 1),
            ("--max-binary-bytes", self.max_binary_bytes, 0),
            ("--max-tools", self.max_tools, 0),
            ("--max-tool-calls", self.max_tool_calls, 1),
            ("--rate-limit", self.rate_limit, 0),
            ("--max-concurrent-sampling", self.max_concurrent_sampling, 1),
            ("--budget-tokens", self.budget_tokens, 0),
            ("--session-budget-tokens", self.session_budget_tokens, 0),
        ):
            if value < minimum:
                raise ConfigError(f"{flag} must be at least {minimum}, not {value}")
        if self.audit_content and not self.audit_log:
            raise ConfigError("--audit-content needs --audit-log FILE")
        if self.max_message_bytes < 1024:
            raise ConfigError("--max-message-bytes must be at least 1024")
        if self.shutdown_grace < 0:
            raise ConfigError("--shutdown-grace must not be negative")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
        if self.audio not in AUDIO_POLICIES:
            raise ConfigError(f"--audio must be one of {', '.join(AUDIO_POLICIES)}")
        if self.sampling_timeout < 0:
            raise ConfigError("--sampling-timeout must not be negative (0 turns the deadline off)")
        if self.retry_max_attempts < 1:
            raise ConfigError("--retry-max-attempts must be at least 1 (1 = no retries)")
        if self.retry_base_delay < 0 or self.retry_max_delay < 0:
            raise ConfigError("--retry-base-delay and --retry-max-delay must not be negative")
        for header, header_value in self.api_headers:
            if not _HEADER_NAME.match(header) or "\r" in header_value or "\n" in header_value:
                raise ConfigError(f"--api-header: invalid header {header!r} (expected 'Name: value')")
        if self.front == "http":
            self._check_http_front()
        if self.provider == "anthropic" and self.mode != "off" and self.api_key is None:
            raise ConfigError(
                "ANTHROPIC_API_KEY is not set: the anthropic provider needs it to answer sampling requests. "
                "Set ANTHROPIC_API_KEY, or run with `--provider mock` for the offline mock provider."
            )

    def _check_http_front(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("--port must be between 0 and 65535")
        if not self.host:
            raise ConfigError("--host must not be empty")
        if self.max_sessions < 1:
            raise ConfigError("--max-sessions must be at least 1")
        if self.session_idle_timeout < 0:
            raise ConfigError("--session-idle-timeout must not be negative (0 turns reaping off)")
        if self.drain_timeout < 0:
            raise ConfigError("--drain-timeout must not be negative")
        if self.forward_authorization and self.upstream_url is None:
            raise ConfigError(
                "--forward-authorization needs --upstream-url (a command upstream gets no headers)"
            )
        if self.auth_token is not None and len(self.auth_token.value) < 16:
            raise ConfigError("--auth-token must be at least 16 characters long")
        if not is_loopback(self.host) and self.auth_token is None and not self.allow_unauthenticated:
            raise ConfigError(
                f"refusing to serve on {self.host}, which is not a loopback address, without a bearer "
                "token: set MCP_BACKFILL_AUTH_TOKEN (or --auth-token), or pass --allow-unauthenticated "
                "if something in front of the proxy authenticates clients"
            )

    def secrets(self) -> tuple[str, ...]:
        """Every secret value, for the log redaction filter."""
        return self._proxy_secrets() + upstream_header_secrets(self.upstream_headers)

    def _proxy_secrets(self) -> tuple[str, ...]:
        """The credentials the proxy spends on Claude: never to be sent upstream."""
        held = (self.api_key, self.auth_token, self.vertex_access_token, *self.platform_secrets)
        headers = tuple(value for _, value in self.api_headers)
        return tuple(s.value for s in held if s is not None and s.value) + tuple(v for v in headers if v)


def env_name(option: str) -> str:
    """`--max-tokens-cap` -> `MCP_BACKFILL_MAX_TOKENS_CAP`."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def split_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """Comma-separated lists (flags or env) -> tuple of stripped, non-empty items."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


def parse_header(line: str) -> tuple[str, str]:
    """`"Name: value"` -> `("Name", "value")`; `ValueError` when there is no colon or no name."""
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise ValueError(f"expected 'Name: value', got {line!r}")
    return name.strip(), value.strip()


def parse_headers(value: str | Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Repeated flags, or the env form: one `Name: value` per line (values may contain commas)."""
    lines = value.splitlines() if isinstance(value, str) else list(value)
    return tuple(parse_header(line) for line in lines if line.strip())


def secret_from_env(environ: Mapping[str, str], name: str) -> Secret | None:
    value = environ.get(name, "").strip()
    return Secret(value) if value else None


def parse_upstream_header(line: str) -> tuple[str, str]:
    """`'Name: value'` -> `("Name", "value")`; raises `ConfigError` on anything else."""
    name, colon, value = line.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not name:
        raise ConfigError(f"--upstream-header must look like 'Name: value', not {line!r}")
    check_upstream_header(name, value)
    return name, value


def check_upstream_header(name: str, value: str) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise ConfigError(f"--upstream-header: {name!r} is not a valid HTTP header name")
    lowered = name.lower()
    if lowered in RESERVED_UPSTREAM_HEADERS or lowered.startswith("mcp-param-"):
        raise ConfigError(f"--upstream-header: the proxy sets {name} itself")
    if not all(" " <= ch <= "~" or ch == "\t" for ch in value):
        raise ConfigError(f"--upstream-header {name}: the value must be one line of printable ASCII")


def check_upstream_url(url: str) -> None:
    import httpx2  # only the HTTP upstream needs it

    try:
        parsed: httpx2.URL | None = None if any(ch.isspace() for ch in url) else httpx2.URL(url)
    except (httpx2.InvalidURL, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host or url != url.strip():
        raise ConfigError(f"--upstream-url must be an http:// or https:// URL, not {url!r}")


def upstream_header_secrets(headers: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The values (and bare tokens, as in `Bearer <token>`) of headers that look like credentials."""
    found: list[str] = []
    for name, value in headers:
        if _CREDENTIAL_HEADER.search(name) and value:
            found.append(value)
            token = value.partition(" ")[2].strip()
            if token:
                found.append(token)
    return tuple(found)


def is_loopback(host: str) -> bool:
    """Is `host` (a name or an address to bind) reachable from this machine only?"""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_bool(raw: str) -> bool:
    """`1/true/yes/on` and `0/false/no/off` (any case), for boolean environment variables."""
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def upstream_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the upstream child inherits: ours, minus credentials meant for the proxy."""
    return {k: v for k, v in environ.items() if k not in SECRET_ENV_VARS}
