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
from urllib.parse import urlsplit

from mcp_backfill import protocol
from mcp_backfill.credentials import CREDENTIAL_NAME, url_credentials, url_secrets
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import (
    DEFAULTS,
    ENV_PREFIX,
    FILE_FORM,
    NOT_QUOTED,
    OPTIONS,
    SHARED_CLIENT,
    Allowance,
    Approval,
    AudioPolicy,
    ClientToken,
    Era,
    LogFormat,
    Mode,
    ProviderName,
    Secret,
    named,
    option,
)

__all__ = [
    "PLATFORM_BASE_URL_VARIABLES",
    "PLATFORM_SECRET_ENV_VARS",
    "SECRET_ENV_VARS",
    "AudioPolicy",
    "Config",
    "Era",
    "Front",
    "LogFormat",
    "Mode",
    "ProviderName",
    "Secret",
    "check_header",
    "check_upstream_url",
    "custom_header_secrets",
    "is_loopback",
    "read_secret_files",
    "secret_from_env",
    "upstream_environment",
    "upstream_header_secrets",
]

# How clients reach the proxy: its own stdin/stdout, or streamable HTTP (`mcp-backfill serve`).
Front = Literal["stdio", "http"]

# Environment variables that hold credentials: never logged, never passed to the upstream.
SECRET_ENV_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    option("auth_token").env,
    option("metrics_token").env,
    "MCP_BACKFILL_VERTEX_ACCESS_TOKEN",
    "AWS_BEARER_TOKEN_BEDROCK",
    "AWS_BEARER_TOKEN_BEDROCK_FILE",  # (its file's name: the key is the proxy's, as the others)
)
# The proxy's own configuration, by prefix: its options (`MCP_BACKFILL_*`, gateway headers and
# tokens included) and the anthropic SDK's settings (`ANTHROPIC_*`: key, auth token, custom headers,
# base URLs). None of it is the upstream's business; an upstream that calls Claude itself gets its
# own key (e.g. `-- env ANTHROPIC_API_KEY=... server`).
PROXY_ENV_PREFIXES = ("MCP_BACKFILL_", "ANTHROPIC_")
# Cloud credentials the Bedrock/Vertex clients read themselves: kept out of logs (redacted), but
# still passed to the upstream: they are the user's own cloud identity, which an upstream cloud tool
# may need for its own work (Bedrock's API key, `AWS_BEARER_TOKEN_BEDROCK`, is the proxy's and is not).
PLATFORM_SECRET_ENV_VARS = ("AWS_BEARER_TOKEN_BEDROCK", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# The endpoint variables the SDK's Bedrock and Vertex clients read in place of their cloud's.
PLATFORM_BASE_URL_VARIABLES = {"bedrock": "ANTHROPIC_BEDROCK_BASE_URL", "vertex": "ANTHROPIC_VERTEX_BASE_URL"}
# Extra headers the anthropic SDK sends on every call, one `Name: value` per line: gateway credentials.
CUSTOM_HEADERS_ENV_VAR = "ANTHROPIC_CUSTOM_HEADERS"
# What no credential sent in a header can hold.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
# A header name is an HTTP token (RFC 9110 section 5.6.2).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the proxy sets itself on every upstream request (the MCP ones are computed per message).
RESERVED_UPSTREAM_HEADERS = frozenset(
    {
        "accept",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "host",
        protocol.LAST_EVENT_ID_HEADER,
        protocol.SESSION_HEADER,
        protocol.VERSION_HEADER,
        protocol.METHOD_HEADER,
        protocol.NAME_HEADER,
    }
)


@dataclass(frozen=True)
class Config:
    """Everything the proxy needs to run; immutable once built.

    The fields that are options take their defaults and per-field checks from `options.OPTIONS`;
    the checks that relate several fields are written out in `__post_init__`.
    """

    upstream_command: tuple[str, ...] = ()
    # An HTTP upstream instead of a command: its streamable-HTTP endpoint, and headers to send it.
    upstream_url: str | None = DEFAULTS["upstream_url"]
    upstream_headers: tuple[tuple[str, str], ...] = field(
        default=DEFAULTS["upstream_headers"], repr=False
    )  # may hold tokens
    mode: Mode = DEFAULTS["mode"]
    era: Era = DEFAULTS["era"]
    max_input_rounds: int = DEFAULTS["max_input_rounds"]
    input_stash_ttl: float = DEFAULTS["input_stash_ttl"]
    task_ttl_max: float = DEFAULTS["task_ttl_max"]
    approve: Approval = DEFAULTS["approve"]
    approve_timeout: float = DEFAULTS["approve_timeout"]
    warm_up: bool = DEFAULTS["warm_up"]
    provider: ProviderName = DEFAULTS["provider"]
    model: str = DEFAULTS["model"]
    allowed_models: tuple[str, ...] = DEFAULTS["allowed_models"]
    allow_model_upgrade: bool = DEFAULTS["allow_model_upgrade"]
    max_tokens_cap: int = DEFAULTS["max_tokens_cap"]
    audio: AudioPolicy = DEFAULTS["audio"]
    max_messages: int = DEFAULTS["max_messages"]
    max_text_bytes: int = DEFAULTS["max_text_bytes"]
    max_binary_bytes: int = DEFAULTS["max_binary_bytes"]
    max_tools: int = DEFAULTS["max_tools"]
    max_tool_calls: int = DEFAULTS["max_tool_calls"]
    max_content_blocks: int = DEFAULTS["max_content_blocks"]
    rate_limit: int = DEFAULTS["rate_limit"]
    max_concurrent_sampling: int = DEFAULTS["max_concurrent_sampling"]
    max_waiting_sampling: int = DEFAULTS["max_waiting_sampling"]
    client_rate_limit: int = DEFAULTS["client_rate_limit"]
    client_max_concurrent_sampling: int = DEFAULTS["client_max_concurrent_sampling"]
    client_session_rate: int = DEFAULTS["client_session_rate"]
    budget_tokens: tuple[Allowance, ...] = DEFAULTS["budget_tokens"]
    client_budget_tokens: tuple[Allowance, ...] = DEFAULTS["client_budget_tokens"]
    session_budget_tokens: tuple[Allowance, ...] = DEFAULTS["session_budget_tokens"]
    state_store: Secret | None = DEFAULTS["state_store"]
    state_store_outage: str = DEFAULTS["state_store_outage"]
    state_store_timeout: float = DEFAULTS["state_store_timeout"]
    state_store_lease: float = DEFAULTS["state_store_lease"]
    request_state_key: Secret | None = DEFAULTS["request_state_key"]
    audit_log: str | None = DEFAULTS["audit_log"]
    audit_content: bool = DEFAULTS["audit_content"]
    prompt_cache: bool = DEFAULTS["prompt_cache"]
    max_message_bytes: int = DEFAULTS["max_message_bytes"]
    max_batch_messages: int = DEFAULTS["max_batch_messages"]
    shutdown_grace: float = DEFAULTS["shutdown_grace"]
    log_level: str = DEFAULTS["log_level"]
    log_format: LogFormat = DEFAULTS["log_format"]
    api_key: Secret | None = None
    # Passed through to the anthropic SDK; read from ANTHROPIC_BASE_URL by default.
    api_base_url: str | None = None
    # The Bedrock or Vertex endpoint variable's value (the SDK reads it itself), checked at startup.
    platform_base_url: str | None = None
    # Extra HTTP headers on every Claude API call (gateways); the values are treated as secrets.
    api_headers: tuple[tuple[str, str], ...] = field(default=DEFAULTS["api_headers"], repr=False)
    # Seconds one sampling request may take, retries included; 0 = no deadline.
    sampling_timeout: float = DEFAULTS["sampling_timeout"]
    retry_max_attempts: int = DEFAULTS["retry_max_attempts"]
    retry_base_delay: float = DEFAULTS["retry_base_delay"]
    retry_max_delay: float = DEFAULTS["retry_max_delay"]
    # --provider vertex: a ready OAuth access token instead of Application Default Credentials.
    vertex_access_token: Secret | None = None
    bedrock_api_key: Secret | None = None
    # Cloud credentials and ANTHROPIC_CUSTOM_HEADERS values found in the environment, only so that
    # logs and errors can redact them.
    platform_secrets: tuple[Secret, ...] = ()
    # Credentials in the OTLP exporter's OTEL_* variables (endpoint URL, headers), only so that logs
    # can redact them: the SDK's warning about a failed export quotes the URL.
    telemetry_secrets: tuple[Secret, ...] = ()
    # `mcp-backfill serve`: the streamable-HTTP front and its security and operations settings.
    front: Front = "stdio"
    host: str = DEFAULTS["host"]
    port: int = DEFAULTS["port"]  # 0: any free port (logged at startup)
    auth_token: Secret | None = DEFAULTS["auth_token"]
    client_tokens: tuple[ClientToken, ...] = field(default=DEFAULTS["client_tokens"], repr=False)
    metrics_token: Secret | None = DEFAULTS["metrics_token"]
    allow_unauthenticated: bool = DEFAULTS["allow_unauthenticated"]
    # Empty: the defaults for the bound address (loopback names with the bound port).
    allowed_hosts: tuple[str, ...] = DEFAULTS["allowed_hosts"]
    allowed_origins: tuple[str, ...] = DEFAULTS["allowed_origins"]
    max_sessions: int = DEFAULTS["max_sessions"]
    max_connections: int = DEFAULTS["max_connections"]
    header_timeout: float = DEFAULTS["header_timeout"]
    body_timeout: float = DEFAULTS["body_timeout"]
    session_idle_timeout: float = DEFAULTS["session_idle_timeout"]  # 0: never reap idle sessions
    drain_timeout: float = DEFAULTS["drain_timeout"]
    # serve --upstream-url: pass the HTTP client's own Authorization header on to the upstream.
    forward_authorization: bool = DEFAULTS["forward_authorization"]

    def __post_init__(self) -> None:
        if not self.upstream_command and not self.upstream_url:
            raise ConfigError(
                "no upstream server: give its command after `--`, e.g. `mcp-backfill -- python server.py`, "
                "or its URL, e.g. `mcp-backfill --upstream-url http://127.0.0.1:8000/mcp` "
                f"({option('upstream_url').env})"
            )
        if self.upstream_command and self.upstream_url:
            raise ConfigError(
                f"two upstream servers: give either {named('--upstream-url')} or a command after `--`, "
                "not both"
            )
        if self.upstream_url is not None:
            check_upstream_url(self.upstream_url)
        elif self.upstream_headers:
            raise ConfigError(
                f"{named('--upstream-header')} needs {named('--upstream-url')} (a command upstream gets no "
                "headers)"
            )
        if self.api_base_url is not None and self.provider == "anthropic":
            check_api_base_url(self.api_base_url)
        if self.platform_base_url is not None and self.provider in PLATFORM_BASE_URL_VARIABLES:
            check_api_base_url(self.platform_base_url, PLATFORM_BASE_URL_VARIABLES[self.provider])
        for name, header_value in self.upstream_headers:
            check_header("--upstream-header", name, header_value)
            if any(secret in header_value for secret in self._proxy_secrets()):
                raise ConfigError(
                    f"{named('--upstream-header')}: the header {name} would send the proxy's Claude "
                    "credentials to the upstream; refusing"
                )
        for name, header_value in self.api_headers:
            check_header("--api-header", name, header_value)
        for each in OPTIONS:
            problem = each.problem(getattr(self, each.name))
            if problem is not None:
                raise ConfigError(problem)
        if self.model not in self.allowed_models:
            raise ConfigError(
                f"{named('--model')}: {self.model!r} is not in {named('--allowed-models')} "
                f"({', '.join(self.allowed_models)})"
            )
        if self.audit_content and not self.audit_log:
            raise ConfigError(f"{named('--audit-content')} needs {named('--audit-log')} (a FILE)")
        if self.front == "http":
            self._check_http_front()
        held = {"anthropic": ("ANTHROPIC_API_KEY", self.api_key)}
        held["vertex"] = ("MCP_BACKFILL_VERTEX_ACCESS_TOKEN", self.vertex_access_token)
        held["bedrock"] = ("AWS_BEARER_TOKEN_BEDROCK", self.bedrock_api_key)
        variable, secret = held.get(self.provider, ("", None))
        if self.mode != "off" and secret is not None and _CONTROL.search(secret.value):
            # Not quoted: it is the credential. Else its header cannot be sent, and every call failed
            # as a connection error ("check ANTHROPIC_BASE_URL and the network").
            raise ConfigError(
                f"{variable} holds a line break or another control character: it must be the credential "
                f"alone, on one line (so must the file {variable}_FILE names)"
            )
        if self.provider == "anthropic" and self.mode != "off" and self.api_key is None:
            raise ConfigError(
                "ANTHROPIC_API_KEY is not set: the anthropic provider needs it to answer sampling requests. "
                "Set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE to a file that holds it, or run with "
                f"`--provider mock` ({option('provider').env}=mock) for the offline mock provider."
            )

    def _check_http_front(self) -> None:
        if self.forward_authorization and self.upstream_url is None:
            raise ConfigError(
                f"{named('--forward-authorization')} needs {named('--upstream-url')} (a command upstream "
                "gets no headers)"
            )
        if self.forward_authorization and (self.auth_token is not None or self.client_tokens):
            raise ConfigError(
                f"{named('--forward-authorization')} passes each client's own Authorization header to the "
                "upstream, so that header cannot also carry a token for mcp-backfill "
                f"({named('--auth-token')}, {named('--client-tokens')}): use one or the other. With "
                "forwarding, the upstream authenticates clients and each distinct credential is its own "
                "client for the budgets."
            )
        self._check_client_tokens()
        authenticates = self.auth_token is not None or bool(self.client_tokens)
        if not is_loopback(self.host) and not authenticates and not self.allow_unauthenticated:
            raise ConfigError(
                f"refusing to serve on {self.host}, which is not a loopback address, without a bearer "
                f"token: set {named('--auth-token')} (or named tokens, {named('--client-tokens')}), or "
                f"{named('--allow-unauthenticated')} if something in front of the proxy authenticates "
                "clients"
            )

    def _check_client_tokens(self) -> None:
        names = [entry.name for entry in self.client_tokens]
        tokens = [entry.token.value for entry in self.client_tokens]
        if self.auth_token is not None:
            tokens.append(self.auth_token.value)
        if self.metrics_token is not None:
            tokens.append(self.metrics_token.value)
        duplicate = next((name for name in names if names.count(name) > 1), None)
        if duplicate is not None:
            raise ConfigError(f"{named('--client-tokens')}: the client name {duplicate!r} appears twice")
        if self.auth_token is not None and SHARED_CLIENT in names:
            # Else the shared token's holders would be that client: its sessions, budget, upstream.
            raise ConfigError(
                f"{named('--client-tokens')}: the client name {SHARED_CLIENT!r} is the identity of every "
                f"holder of {named('--auth-token')}; give that client another name"
            )
        if len(set(tokens)) != len(tokens):
            raise ConfigError(
                f"{named('--client-tokens')}: two clients (or a client and {named('--auth-token')} or "
                f"{named('--metrics-token')}) share a token"
            )
        short = next((entry.name for entry in self.client_tokens if len(entry.token.value) < 16), None)
        if short is not None:
            raise ConfigError(
                f"{named('--client-tokens')}: the token of {short!r} must be at least 16 characters long"
            )

    def secrets(self) -> tuple[str, ...]:
        """Every secret value, for the log redaction filter."""
        return (
            self._proxy_secrets()
            + upstream_header_secrets(self.upstream_headers)
            + url_secrets(self.upstream_url)
            + tuple(secret.value for secret in self.telemetry_secrets)
        )

    def _store_secrets(self) -> tuple[str, ...]:
        """The state store URL's credentials (the URL itself is logged without them)."""
        return url_credentials(self.state_store.value) if self.state_store is not None else ()

    def _proxy_secrets(self) -> tuple[str, ...]:
        """The credentials the proxy spends on Claude: never to be sent upstream."""
        held = (
            self.api_key,
            self.auth_token,
            self.metrics_token,
            self.vertex_access_token,
            *self.platform_secrets,
            *(entry.token for entry in self.client_tokens),
            self.request_state_key,
        )
        headers = tuple(value for _, value in self.api_headers)
        return (
            tuple(s.value for s in held if s is not None and s.value)
            + tuple(v for v in headers if v)
            + upstream_header_secrets(self.api_headers)  # `Bearer <token>`: the bare token too
            + url_secrets(self.api_base_url)  # a gateway's key in the query (`?api_key=`)
            + url_secrets(self.platform_base_url)
            + self._store_secrets()
        )


def secret_from_env(environ: Mapping[str, str], name: str) -> Secret | None:
    value = environ.get(name, "").strip()
    return Secret(value) if value else None


def check_header(flag: str, name: str, value: str) -> None:
    """One `--upstream-header` or `--api-header`: a valid name, and a value on one line.

    Upstream headers must also leave alone the headers the proxy sets itself, and be printable ASCII.
    """
    where = named(flag)
    if not _HEADER_NAME.fullmatch(name):  # not quoted: a mistyped line may have a token there
        raise ConfigError(
            f"{where}: invalid header name (letters, digits and !#$%&'*+.^_`|~- only; {NOT_QUOTED})"
        )
    if flag != "--upstream-header":
        if "\r" in value or "\n" in value:
            raise ConfigError(f"{where}: the value of {name} must be one line")
        return
    lowered = name.lower()
    if lowered in RESERVED_UPSTREAM_HEADERS or lowered.startswith(protocol.PARAM_HEADER_PREFIX):
        raise ConfigError(f"{where}: the proxy sets {name} itself")
    if not all(" " <= ch <= "~" or ch == "\t" for ch in value):
        raise ConfigError(f"{where}: the value of {name} must be one line of printable ASCII")


def check_upstream_url(url: str) -> None:
    import httpx2  # only the HTTP upstream needs it

    try:
        parsed: httpx2.URL | None = None if any(ch.isspace() for ch in url) else httpx2.URL(url)
    except (httpx2.InvalidURL, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host or url != url.strip():
        raise ConfigError(
            f"{named('--upstream-url')}: must be an http:// or https:// URL with a host ({NOT_QUOTED})"
        )


def check_api_base_url(url: str, variable: str = "ANTHROPIC_BASE_URL") -> None:
    """`ANTHROPIC_BASE_URL` (or the Bedrock or Vertex one, `variable`), checked at startup: a bad
    one used to fail every sampling request with an internal error, and credentials in it replaced
    the API key. Its text is not quoted: it may hold a password."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or url != url.strip():
        raise ConfigError(f"{variable} must be an http:// or https:// URL with a host (and a numeric port)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{variable} must not carry credentials (user:password@); give a gateway's with "
            f"--api-header 'Name: value' ({option('api_headers').env})"
        )


def upstream_header_secrets(headers: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The values (and bare tokens, as in `Bearer <token>`) of headers that look like credentials:
    a server or gateway that refuses one may echo the token alone."""
    found: list[str] = []
    for name, value in headers:
        if CREDENTIAL_NAME.search(name) and value:
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


def upstream_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the upstream child inherits: ours, minus the proxy's own configuration and
    credentials (`PROXY_ENV_PREFIXES`, `SECRET_ENV_VARS`). The rest (PATH, HOME, the user's cloud
    credentials, the server's own settings) is kept: the upstream runs as the user's program."""
    return {
        k: v for k, v in environ.items() if k not in SECRET_ENV_VARS and not k.startswith(PROXY_ENV_PREFIXES)
    }


SECRET_FILE_VARIABLES = (
    "ANTHROPIC_API_KEY",
    *(opt.env for opt in OPTIONS if opt.name in FILE_FORM),
    "MCP_BACKFILL_VERTEX_ACCESS_TOKEN",
    "AWS_BEARER_TOKEN_BEDROCK",
)
"""Secret-holding variables that may instead name a file: `<NAME>_FILE=/run/secrets/...`."""


MAX_SECRET_FILE_BYTES = 1024 * 1024
"""The most a `*_FILE` may hold: a key, a token, or a few thousand `--client-tokens` lines. A larger
one is the wrong file (a log, a disk image, `/dev/zero`), which was read whole, without end."""


def read_secret_files(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with each `<NAME>_FILE` of `SECRET_FILE_VARIABLES` replaced by `<NAME>` = the file's
    content (one trailing newline stripped). Both set, an unreadable file, or one larger than
    `MAX_SECRET_FILE_BYTES` (not read past that): `ConfigError`."""
    resolved = dict(environ)
    for name in SECRET_FILE_VARIABLES:
        path = environ.get(f"{name}_FILE", "")
        if not path:
            continue
        if environ.get(name):
            raise ConfigError(f"both {name} and {name}_FILE are set; set one of them")
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_SECRET_FILE_BYTES + 1)
            if len(data) > MAX_SECRET_FILE_BYTES:
                raise ConfigError(
                    f"{name}_FILE: {path} is larger than 1 MiB, too large to hold a secret: is it the "
                    "right file?"
                )
            content = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ConfigError(f"{name}_FILE: cannot read {path} ({reason})") from None
        # Line ends as a text-mode read gives them (CRLF and CR become LF), then the last one dropped.
        resolved[name] = content.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n")
    return resolved


def custom_header_secrets(environ: Mapping[str, str]) -> tuple[Secret, ...]:
    """The values of `ANTHROPIC_CUSTOM_HEADERS` (`Name: value` lines), to be redacted like a key,
    with the bare tokens of those that look like credentials (as `--upstream-header`'s)."""
    lines = (line.partition(":") for line in environ.get(CUSTOM_HEADERS_ENV_VAR, "").splitlines())
    headers = [(name.strip(), value.strip()) for name, _, value in lines]
    values = (*(value for _, value in headers), *upstream_header_secrets(headers))
    return tuple(Secret(value) for value in values if value)


# Variables of this prefix the program reads that are not options of the table.
OTHER_VARIABLES = frozenset({"MCP_BACKFILL_VERTEX_ACCESS_TOKEN", "MCP_BACKFILL_UNWRAP"})


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """`MCP_BACKFILL_*` variables that no option or feature reads (misspellings, usually), each
    with the closest known name, if one is close."""
    import difflib

    known = {opt.env for opt in OPTIONS} | OTHER_VARIABLES
    known |= {f"{name}_FILE" for name in SECRET_FILE_VARIABLES}
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in known)
    return [(name, next(iter(difflib.get_close_matches(name, known, n=1)), None)) for name in unknown]


# Keys copied from examples rather than from the console.
_PLACEHOLDER = re.compile(r"your|xxxx|changeme|placeholder|<.*>|\.\.\.|^sk-ant-\*+$|example", re.IGNORECASE)


def looks_like_a_placeholder(key: str) -> bool:
    return bool(_PLACEHOLDER.search(key)) or len(key) < 20
