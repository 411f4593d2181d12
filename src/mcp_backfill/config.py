"""One validated `Config`, built from command-line flags and `MCP_BACKFILL_*` environment variables.

Precedence: flag > environment variable > default. Secrets (the Claude API key) are read from
the environment only and kept out of `repr()` so a logged config can never leak them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["fallback", "always", "off"]
ProviderName = Literal["anthropic", "mock"]
LogFormat = Literal["text", "json"]
AudioPolicy = Literal["reject", "placeholder"]
Era = Literal["auto", "handshake"]
# How clients reach the proxy: its own stdin/stdout, or streamable HTTP (`mcp-backfill serve`).
Front = Literal["stdio", "http"]

MODES: tuple[Mode, ...] = ("fallback", "always", "off")
PROVIDERS: tuple[ProviderName, ...] = ("anthropic", "mock")
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
AUDIO_POLICIES: tuple[AudioPolicy, ...] = ("reject", "placeholder")
ERAS: tuple[Era, ...] = ("auto", "handshake")

DEFAULT_MODEL = "claude-sonnet-5-5"
# The tiers model preferences may choose from when the operator does not restrict them.
DEFAULT_ALLOWED_MODELS: tuple[str, ...] = ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

ENV_PREFIX = "MCP_BACKFILL_"
# Environment variables that hold credentials: never logged, never passed to the upstream.
SECRET_ENV_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "MCP_BACKFILL_AUTH_TOKEN")


class ConfigError(ValueError):
    """A configuration the proxy refuses to start with; the message tells the user what to change."""


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

    upstream_command: tuple[str, ...]
    mode: Mode = "fallback"
    era: Era = "auto"
    max_input_rounds: int = 10
    input_stash_ttl: float = 300.0
    provider: ProviderName = "anthropic"
    model: str = DEFAULT_MODEL
    allowed_models: tuple[str, ...] = DEFAULT_ALLOWED_MODELS
    max_tokens_cap: int = 16384
    audio: AudioPolicy = "reject"
    max_message_bytes: int = 32 * 1024 * 1024
    shutdown_grace: float = 2.0
    log_level: str = "info"
    log_format: LogFormat = "text"
    api_key: Secret | None = None
    # Passed through to the anthropic SDK; read from ANTHROPIC_BASE_URL by default.
    api_base_url: str | None = None
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

    def __post_init__(self) -> None:
        if not self.upstream_command:
            raise ConfigError(
                "no upstream server: give its command after `--`, e.g. `mcp-backfill -- python server.py`"
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
        return tuple(s.value for s in (self.api_key, self.auth_token) if s is not None and s.value)


def env_name(option: str) -> str:
    """`--max-tokens-cap` -> `MCP_BACKFILL_MAX_TOKENS_CAP`."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def split_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """Comma-separated lists (flags or env) -> tuple of stripped, non-empty items."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


def secret_from_env(environ: Mapping[str, str], name: str) -> Secret | None:
    value = environ.get(name, "").strip()
    return Secret(value) if value else None


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
